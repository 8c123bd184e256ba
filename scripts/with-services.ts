/**
 * `bun scripts/with-services.ts <command> [args...]`: runs a command with PostgreSQL and RabbitMQ,
 * their URLs in TXBOX_TEST_DATABASE_URL / TXBOX_TEST_AMQP_URL, and stops them after it exits. For
 * the suites that are not `bun test` (Node's and Deno's smoke tests), which have no preload to start
 * the servers; services come from the same place as in `bun test` (test/support/services.ts).
 *
 * When both URLs are already set nothing is started, so nested runs (`npm run test:runtimes`
 * wrapping `npm run test:node`) share one pair of servers. Exits with the command's exit code.
 */
import { spawn } from "node:child_process"
import { constants } from "node:os"
import { resolveServices } from "../test/support/services.ts"

const [command, ...args] = process.argv.slice(2)
if (command === undefined) {
  console.error("usage: bun scripts/with-services.ts <command> [args...]")
  process.exit(2)
}

const started = performance.now()
const services = await resolveServices()
if (services.source.database !== "env" || services.source.amqp !== "env") {
  console.error(
    `[with-services] PostgreSQL from ${services.source.database}, RabbitMQ from ${services.source.amqp}` +
      ` (${Math.round(performance.now() - started)} ms)`,
  )
}

const child = spawn(command, args, {
  stdio: "inherit",
  env: {
    ...process.env,
    TXBOX_TEST_DATABASE_URL: services.databaseUrl,
    TXBOX_TEST_AMQP_URL: services.amqpUrl,
  },
})

// Ctrl-C reaches the child through the terminal's process group; a CI timeout's SIGTERM reaches
// only us, so pass it on, and let the child's exit stop the servers as usual.
for (const sig of ["SIGINT", "SIGTERM"] as const) {
  process.on(sig, () => {
    if (child.exitCode === null) child.kill(sig)
  })
}

const code = await new Promise<number>((resolve) => {
  child.once("error", (error) => {
    console.error(`[with-services] could not run ${command}: ${error.message}`)
    resolve(127)
  })
  child.once("exit", (exitCode, signal) => {
    resolve(exitCode ?? 128 + (signal === null ? 0 : constants.signals[signal]))
  })
})
await services.stop()
process.exit(code)
