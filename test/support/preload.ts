// bun test preload (bunfig.toml): PostgreSQL and RabbitMQ once per run, their URLs in the
// environment (child processes spawned by tests inherit them), stopped after the last test.
//
// Under `--isolate` or `--parallel` Bun re-runs this preload per file in a fresh global, with
// process.env reset, and runs its afterAll after each file: each file then gets services of its own.
import { afterAll } from "bun:test"
import { resolveServices, type Services } from "./services.ts"

// On globalThis rather than in a module variable: the preload can be evaluated twice in one global
// (imported again under another specifier), and must not start a second pair of servers.
const KEY = Symbol.for("txbox.test.services")
const holder = globalThis as typeof globalThis & { [KEY]?: Promise<Services> }

if (holder[KEY] === undefined) {
  const started = performance.now()
  holder[KEY] = resolveServices()
  const services = await holder[KEY]
  process.env.TXBOX_TEST_DATABASE_URL = services.databaseUrl
  process.env.TXBOX_TEST_AMQP_URL = services.amqpUrl
  console.error(
    `[txbox tests] PostgreSQL from ${services.source.database}, RabbitMQ from ${services.source.amqp}` +
      ` (${Math.round(performance.now() - started)} ms)`,
  )

  // Stopping RabbitMQ takes ~4 s: more than bun's default hook timeout when run without --timeout.
  afterAll(async () => {
    await services.stop()
  }, 60_000)
  // A Ctrl-C or a CI timeout must not leave servers behind; bun test fires no "exit" event, and the
  // launchers' watchdogs cover a SIGKILL.
  for (const sig of ["SIGINT", "SIGTERM"] as const) {
    process.once(sig, () => {
      services.stopSync()
      process.exit(sig === "SIGINT" ? 130 : 143)
    })
  }
} else {
  await holder[KEY]
}
