/**
 * The PostgreSQL store: a Kysely instance over node-postgres (default) or
 * postgres.js, plus a LISTEN connection, as the `Database` port.
 *
 * Which driver survives what (see README "Drivers under faults"):
 * postgres.js 3.4.9 writes to a socket it dropped when a transaction goes on
 * after its connection closed (upstream #1066, #1154, #1208): an uncatchable
 * TypeError that ends a Node process or leaves the statement waiting on Bun.
 * `renewingPostgresJs.ts` keeps every statement off such a connection and
 * replaces the pool; its LISTEN is watched (`listenWatchdog.ts`).
 * node-postgres reports the same events as ordinary errors.
 */
import { Effect, Layer, Schedule, type Scope } from "effect"
import { Kysely, PostgresDialect } from "kysely"
import { PostgresJSDialect } from "kysely-postgres-js"
import pg from "pg"
import postgres from "postgres"
import { validateConfig } from "../core/config.ts"
import { classifyDbError } from "../core/dbErrors.ts"
import { validateSchemaName } from "../core/identifier.ts"
import { ConfigError, redactUrls, type StoreError } from "../Errors.ts"
import { Database, type DatabaseShape } from "../ports/Database.ts"
import type { TxboxStore } from "../ports/stores.ts"
import { makeRetryPolicy, schedule } from "../Retry.ts"
import { PING_PAYLOAD, watchedListen } from "./listenWatchdog.ts"
import { makeRenewingClient } from "./renewingPostgresJs.ts"
import { sqlStores } from "./storeLayer.ts"

export interface PostgresStoreConfig {
  /** `postgres://user:pass@host:port/db`. Never logged; errors show it redacted. */
  readonly url: string
  /**
   * The driver under Kysely. node-postgres is the default because it is the
   * one that rides out faults: a backend that dies (a database restart,
   * `pg_terminate_backend`) is an ordinary error, where postgres.js 3.4.9
   * throws an uncatchable `TypeError` from `nextWrite` (a Node process exits;
   * on Bun a statement can be left hanging, which txbox makes rarer by
   * replacing the pool after a close) — see README "Drivers under faults".
   * @default "pg"
   */
  readonly driver?: "postgres.js" | "pg"
  /** Schema holding txbox's tables. @default "txbox" */
  readonly schema?: string
  /** Pooled connections (LISTEN takes one more of its own). @default 10 */
  readonly poolSize?: number
  /** Open a LISTEN connection for low-latency wake-ups. Polling stays correct without it. @default true */
  readonly listen?: boolean
  /** Seconds to wait for a connection. @default 10 */
  readonly connectTimeoutSeconds?: number
}

const validate = (config: PostgresStoreConfig) => {
  const schema = validateSchemaName(config.schema ?? "txbox")
  const poolSize = config.poolSize ?? 10
  if (!Number.isInteger(poolSize) || poolSize < 1) {
    throw new ConfigError({ reason: `poolSize must be a positive integer, got ${poolSize}` })
  }
  let url: URL
  try {
    url = new URL(config.url)
  } catch {
    throw new ConfigError({ reason: `database URL is not a valid URL: ${redactUrls(String(config.url))}` })
  }
  if (url.protocol !== "postgres:" && url.protocol !== "postgresql:") {
    throw new ConfigError({ reason: `database URL must start with postgres:// (got ${url.protocol}//)` })
  }
  return {
    schema,
    poolSize,
    driver: config.driver ?? "pg",
    timeout: config.connectTimeoutSeconds ?? 10,
  }
}

// Retry a lost LISTEN connection gently: it only costs latency.
const relisten = Schedule.exponential("200 millis").pipe(Schedule.jittered)
// ... and forever once it was up, capped at 5 s between attempts.
const relistenForever = schedule(makeRetryPolicy({ initialDelay: "200 millis", maxDelay: "5 seconds" }))
// How often a postgres.js LISTEN is checked, and how long its ping may take to come back.
const LISTEN_PING_EVERY_MS = 5_000
const LISTEN_PING_WITHIN_MS = 5_000
// Statements of the retired pool get this long to finish; what still hangs then is failed.
const RENEW_GRACE_SECONDS = 10
// After a close, how long a statement already sent may still answer before it is failed.
const SETTLE_AFTER_CLOSE_MS = 3_000

/**
 * Makes COMMIT of an aborted transaction fail instead of rolling back
 * silently. PostgreSQL answers such a COMMIT with the command tag ROLLBACK,
 * which node-postgres reports (`result.command`) and Kysely drops: read it
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

const postgresJs = (config: PostgresStoreConfig, v: ReturnType<typeof validate>) =>
  Effect.gen(function* () {
    // A fresh pool after any connection closes, and no statement on a closed connection (see the module).
    const client = makeRenewingClient(
      (onclose) =>
        postgres(config.url, {
          max: v.poolSize,
          connect_timeout: v.timeout,
          max_lifetime: null,
          onnotice: () => {},
          onclose,
          // Names the driver in pg_stat_activity, so an operator can tell which fault behaviour applies.
          connection: { application_name: "txbox/postgres.js" },
        }),
      { graceSeconds: RENEW_GRACE_SECONDS, settleMs: SETTLE_AFTER_CLOSE_MS },
    )
    const db = yield* Effect.acquireRelease(
      Effect.sync(() => new Kysely<unknown>({ dialect: new PostgresJSDialect({ postgres: client.facade }) })),
      (db) => Effect.promise(() => db.destroy().catch(() => undefined)),
    )
    // postgres.js gives up on a LISTEN whose re-issue after a reconnect fails (the server still
    // down), without a word: the watchdog notices and subscribes again.
    const listen = (channel: string, onNotify: () => void): Effect.Effect<void, StoreError, Scope.Scope> =>
      watchedListen({
        subscribe: (onPayload) =>
          Effect.tryPromise({
            // postgres.js calls `onlisten` after each LISTEN it issues, its own re-issues included:
            // a NOTIFY sent while none was up is lost, so the loop looks once then.
            try: () => client.current().listen(channel, onPayload, onNotify),
            catch: (cause) => classifyDbError("listen", cause),
          }).pipe(Effect.retry({ schedule: relisten, times: 5 })),
        ping: Effect.tryPromise({
          try: () => client.current().notify(channel, PING_PAYLOAD),
          catch: (cause) => classifyDbError("listen", cause),
        }),
        onNotify,
        resubscribe: (subscribe) => subscribe.pipe(Effect.retry({ schedule: relistenForever }), Effect.orDie),
        every: LISTEN_PING_EVERY_MS,
        within: LISTEN_PING_WITHIN_MS,
      })
    return { db, listen }
  })

const nodePostgres = (config: PostgresStoreConfig, v: ReturnType<typeof validate>) =>
  Effect.gen(function* () {
    const pool = new pg.Pool({
      connectionString: config.url,
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
        const connect = Effect.tryPromise({
          try: async (signal) => {
            const client = new pg.Client({
              connectionString: config.url,
              connectionTimeoutMillis: v.timeout * 1000,
              application_name: "txbox/pg-listen",
            })
            client.on("error", () => {})
            client.on("notification", (message) => {
              if (message.payload !== PING_PAYLOAD) onNotify()
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
            }
          })
        const first = yield* connect.pipe(Effect.retry({ schedule: relisten, times: 5 }))
        yield* Effect.addFinalizer(() =>
          Effect.promise(async () => {
            await current?.end().catch(() => undefined)
          }),
        )
        yield* Effect.forkScoped(serve(first))
      })
    return { db, listen }
  })

/** Builds the `Database` service in the current scope; closing the scope closes the pool. */
export const make = (config: PostgresStoreConfig): Effect.Effect<DatabaseShape, ConfigError, Scope.Scope> =>
  Effect.gen(function* () {
    const v = yield* validateConfig(() => validate(config))
    const { db, listen } = v.driver === "pg" ? yield* nodePostgres(config, v) : yield* postgresJs(config, v)
    const noListen = (_channel: string, _onNotify: () => void) => Effect.void
    return {
      db,
      schema: v.schema,
      listen: config.listen === false ? noListen : listen,
      // node-postgres clients report an aborted COMMIT (refuseAbortedCommit); postgres.js does not.
      commitRefusesAborted: v.driver === "pg",
    } satisfies DatabaseShape
  })

/**
 * The PostgreSQL store as a layer: the `Database`, the `OutboxStore` and
 * `InboxStore` ports over it, and the schema `Outbox.enqueue` writes to.
 */
export const layer = (config: PostgresStoreConfig): Layer.Layer<TxboxStore, ConfigError> =>
  sqlStores(Layer.effect(Database, make(config)))
