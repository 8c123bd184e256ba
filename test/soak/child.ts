// What the soak's producer, relay and consumer processes share: their environment, the store
// wiring of the README quickstart, and a life that ends on SIGTERM (gracefully) or SIGKILL.
import { writeSync } from "node:fs"
import { Cause, Effect, Exit, Fiber } from "effect"
import { PgStore } from "../../src/pg.ts"
import { PostgresJsStore } from "../../src/postgres-js.ts"

export const required = (name: string): string => {
  const value = process.env[name]
  if (value === undefined || value === "") throw new Error(`${name} is required`)
  return value
}

/**
 * The broker of AMQP_URL for `AmqpTransport.layer`: one URL as `url`, as in the README quickstart;
 * several, comma-separated (the soak's `--rabbit-cluster`), as a cluster's `urls`.
 */
export const brokerUrls = (): { readonly url: string } | { readonly urls: ReadonlyArray<string> } => {
  const urls = required("AMQP_URL").split(",")
  return urls.length === 1 ? { url: urls[0]! } : { urls }
}

/**
 * The store of DRIVER: `PostgresJsStore` for postgres.js, `PgStore` for pg. Unset means the
 * library's default driver (`PgStore`, node-postgres), so the suite exercises exactly what a user
 * gets by default.
 */
export const storeLayer = () => {
  const url = required("DB_URL")
  const driver = process.env.DRIVER
  if (driver === undefined || driver === "" || driver === "pg") return PgStore.layer({ url })
  if (driver === "postgres.js") return PostgresJsStore.layer({ url })
  throw new Error(`DRIVER must be pg or postgres.js, got ${driver}`)
}

/**
 * A line on stderr, written synchronously: it must reach the log even when the process SIGKILLs
 * itself on the next statement (a buffered write would be lost with the process).
 */
export const logLine = (line: string): void => {
  writeSync(2, `${new Date().toISOString()} ${line}\n`)
}

/** The orchestrator waits for this line on stdout before it counts a process as running. */
export const announce = (line: string): void => {
  writeSync(1, `${line}\n`)
}

/**
 * Runs `program` until SIGTERM, which interrupts it (closing its layers gracefully) and exits 0.
 * A program that ends by itself is a failure the orchestrator must see: exit 1 with its cause.
 */
export const runUntilSigterm = async (name: string, program: Effect.Effect<unknown, unknown>) => {
  const fiber = Effect.runFork(program)
  let stopping = false
  process.on("SIGTERM", () => {
    stopping = true
    logLine(`${name}: SIGTERM, stopping`)
    Effect.runPromise(Fiber.interrupt(fiber)).then(() => process.exit(0))
  })
  const exit = await Effect.runPromise(Fiber.await(fiber))
  if (!stopping) {
    logLine(
      `${name} ended by itself: ${Exit.isFailure(exit) ? Cause.pretty(exit.cause) : "success (it should never end)"}`,
    )
    process.exit(1)
  }
}
