/**
 * node-postgres (`pg`) under Kysely, plus a LISTEN client: the default driver,
 * the one that rides out faults (a backend that dies is an ordinary error).
 * `pg` is an optional peer dependency, imported when the store is built.
 */
import { Effect, type Scope } from "effect"
import { Kysely, PostgresDialect } from "kysely"
import type pg from "pg"
import { defaultExport, loadDriver } from "../../../drivers.ts"
import type { ConfigError } from "../../../Errors.ts"
import type { DatabaseShape } from "../../../ports/Database.ts"
import { classifyDbError } from "../../sql/errors.ts"
import { noListen, type ValidConnection } from "../shared/postgresConnection.ts"
import { bareWord, beginWithFirstStatement } from "./beginRides.ts"
import { makeListener } from "./listener.ts"

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
      if (bareWord(args) !== "commit") return result
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
    const begins = new WeakMap<pg.PoolClient, { readonly reset: () => void }>()
    pool.on("connect", (client) => {
      client.on("error", () => {})
      refuseAbortedCommit(client)
      begins.set(client, beginWithFirstStatement(client as never))
    })
    pool.on("acquire", (client) => begins.get(client)?.reset())
    const db = yield* Effect.acquireRelease(
      Effect.sync(() => new Kysely<unknown>({ dialect: new PostgresDialect({ pool }) })),
      (db) => Effect.promise(() => db.destroy().catch(() => undefined)),
    )
    // One LISTEN connection for the store, whatever number of channels; its self-tests NOTIFY
    // through the pool, the path producers' commits take.
    const listen = yield* makeListener({
      driver,
      url: v.listenUrl,
      timeoutSeconds: v.timeout,
      notify: (channel, payload) =>
        Effect.tryPromise({
          try: () => pool.query("SELECT pg_notify($1, $2)", [channel, payload]),
          catch: (cause) => classifyDbError("listen", cause),
        }),
    })
    return {
      db,
      schema: v.schema,
      listen: v.listen ? listen : noListen,
      // node-postgres clients report an aborted COMMIT (refuseAbortedCommit).
      commitRefusesAborted: true,
      holdsClaims: v.holdClaims ?? true,
      session: async () => {
        const client = await pool.connect()
        return {
          script: async (text) => {
            const answer = (await client.query(text)) as unknown as pg.QueryResult | pg.QueryResult[]
            return (Array.isArray(answer) ? answer : [answer]).map((r) => ({
              rows: r.rows ?? [],
              rowCount: r.rowCount ?? 0,
            }))
          },
          release: (broken) => client.release(broken),
        }
      },
    } satisfies DatabaseShape
  })
