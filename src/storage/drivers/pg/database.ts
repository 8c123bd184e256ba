/**
 * node-postgres (`pg`) under Kysely, plus a LISTEN client: the default driver,
 * the one that rides out faults (a backend that dies is an ordinary error).
 * `pg` is an optional peer dependency, imported when the store is built.
 */
import { Effect, type Scope } from "effect"
import { Kysely, PostgresDialect } from "kysely"
import type pg from "pg"
import { defaultExport, loadDriver } from "../../../drivers.ts"
import type { ConfigError, StoreError } from "../../../Errors.ts"
import type { DatabaseShape } from "../../../ports/Database.ts"
import { classifyDbError } from "../../sql/errors.ts"
import { isOwnPayload, listenSelfTest } from "../shared/listenSelfTest.ts"
import { relisten, relistenForever, type ValidConnection } from "../shared/postgresConnection.ts"

/**
 * Makes COMMIT of an aborted transaction fail instead of rolling back
 * silently. PostgreSQL answers such a COMMIT with the command tag ROLLBACK,
 * which node-postgres reports (`result.command`) and Kysely 0.28 drops: read it
 * here, where it costs nothing. Kysely commits with the plain text `commit`.
 */
const refuseAbortedCommit = (client: pg.PoolClient) => {
  const query = client.query.bind(client) as (...args: ReadonlyArray<unknown>) => unknown
  Object.assign(client, {
    query: (...args: ReadonlyArray<unknown>) => {
      const result = query(...args)
      if (typeof args[0] !== "string" || args[0].trim().toLowerCase() !== "commit") return result
      return Promise.resolve(result).then((answer) => {
        if ((answer as { command?: unknown } | undefined)?.command === "ROLLBACK") {
          throw Object.assign(new Error("COMMIT of an aborted transaction was answered with ROLLBACK"), {
            code: "25P02",
          })
        }
        return answer
      })
    },
  })
}

/** Opens a node-postgres pool as the `Database` service, in the current scope. */
export const open = (
  v: ValidConnection,
  entry: string,
): Effect.Effect<DatabaseShape, ConfigError, Scope.Scope> =>
  Effect.gen(function* () {
    const driver = defaultExport<typeof pg>(
      yield* loadDriver({ name: "pg", entry, load: () => import("pg") }),
    )
    const pool = new driver.Pool({
      connectionString: v.url,
      max: v.poolSize,
      connectionTimeoutMillis: v.timeout * 1000,
      application_name: "txbox/pg",
    })
    // An idle client whose backend dies emits 'error' on the pool; unhandled,
    // that would end the process. The next checkout gets a fresh client.
    pool.on("error", () => {})
    // A checked-out client whose backend dies between two statements (a
    // database restart mid-transaction) emits 'error' on the client itself,
    // where the pool listens no more: on Node that ended the process (seen in
    // the soak: "Unhandled 'error' event … Connection terminated unexpectedly").
    // The statement in flight, or the next one, still fails with the error.
    pool.on("connect", (client) => {
      client.on("error", () => {})
      refuseAbortedCommit(client)
    })
    const db = yield* Effect.acquireRelease(
      Effect.sync(() => new Kysely<unknown>({ dialect: new PostgresDialect({ pool }) })),
      (db) => Effect.promise(() => db.destroy().catch(() => undefined)),
    )
    // One LISTEN client at a time, kept by one fiber: connect, wait for it to end, connect again.
    // (Reconnecting from the client's own `end` event chained a new client per failed attempt,
    // each of which could later connect and stay open.)
    const listen = (channel: string, onNotify: () => void): Effect.Effect<void, StoreError, Scope.Scope> =>
      Effect.gen(function* () {
        let current: pg.Client | undefined
        // The self-test NOTIFYs through the pool, the path producers' commits take.
        const { heard, check } = yield* listenSelfTest(channel, (payload) =>
          Effect.tryPromise({
            try: () => pool.query("SELECT pg_notify($1, $2)", [channel, payload]),
            catch: (cause) => classifyDbError("listen", cause),
          }),
        )
        const connect = Effect.tryPromise({
          try: async (signal) => {
            const client = new driver.Client({
              connectionString: v.listenUrl,
              connectionTimeoutMillis: v.timeout * 1000,
              application_name: "txbox/pg-listen",
            })
            client.on("error", () => {})
            client.on("notification", (message) => {
              if (isOwnPayload(message.payload)) heard(message.payload ?? "")
              else onNotify()
            })
            try {
              await client.connect()
              await client.query(`LISTEN "${channel.replaceAll('"', '""')}"`)
            } catch (error) {
              await client.end().catch(() => undefined)
              throw error
            }
            // Given up on while connecting (scope closed): never leave it open.
            if (signal.aborted) {
              await client.end().catch(() => undefined)
              throw new Error("listen: abandoned")
            }
            current = client
            return client
          },
          catch: (cause) => classifyDbError("listen", cause),
        })
        const ended = (client: pg.Client) =>
          Effect.callback<void>((resume) => {
            const done = () => resume(Effect.void)
            client.once("end", done)
            return Effect.sync(() => {
              client.off("end", done)
            })
          })
        const serve = (first: pg.Client): Effect.Effect<never> =>
          Effect.gen(function* () {
            let client = first
            while (true) {
              yield* ended(client)
              current = undefined
              client = yield* connect.pipe(Effect.retry({ schedule: relistenForever }), Effect.orDie)
              // A NOTIFY sent while no LISTEN was up is lost: look once now that one is (before
              // the LISTEN, a NOTIFY could still slip between the look and the LISTEN).
              onNotify()
              yield* Effect.forkChild(check)
            }
          })
        const first = yield* connect.pipe(Effect.retry({ schedule: relisten, times: 5 }))
        yield* Effect.addFinalizer(() =>
          Effect.promise(async () => {
            await current?.end().catch(() => undefined)
          }),
        )
        yield* Effect.forkScoped(check)
        yield* Effect.forkScoped(serve(first))
      })
    return {
      db,
      schema: v.schema,
      listen: v.listen ? listen : noListen,
      // node-postgres clients report an aborted COMMIT (refuseAbortedCommit).
      commitRefusesAborted: true,
    } satisfies DatabaseShape
  })

const noListen = (_channel: string, _onNotify: () => void) => Effect.void
