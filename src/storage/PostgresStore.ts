/**
 * The PostgreSQL store: a Kysely instance over postgres.js (default) or
 * node-postgres, plus a LISTEN connection, as the `Database` port.
 *
 * Which driver survives what (see README "Drivers under faults"):
 * postgres.js 3.4.9 can throw an uncatchable TypeError from `nextWrite` when a
 * backend dies inside a transaction (upstream #1066, #1154, #1208), which ends
 * a Node process. node-postgres reports the same event as an ordinary error.
 */
import { Effect, Layer, Schedule, type Scope } from "effect"
import { Kysely, PostgresDialect } from "kysely"
import { PostgresJSDialect } from "kysely-postgres-js"
import pg from "pg"
import postgres from "postgres"
import { ConfigError, redactUrls, type StoreError } from "../Errors.ts"
import { Database, type DatabaseShape } from "../ports/Database.ts"
import { classifyDbError } from "./dbErrors.ts"
import { validateSchemaName } from "./identifier.ts"

export interface PostgresStoreConfig {
  /** `postgres://user:pass@host:port/db`. Never logged; errors show it redacted. */
  readonly url: string
  /** @default "postgres.js" */
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
    driver: config.driver ?? "postgres.js",
    timeout: config.connectTimeoutSeconds ?? 10,
  }
}

// Retry a lost LISTEN connection forever, gently: it only costs latency.
const relisten = Schedule.exponential("200 millis").pipe(Schedule.jittered)

const postgresJs = (config: PostgresStoreConfig, v: ReturnType<typeof validate>) =>
  Effect.gen(function* () {
    const client = postgres(config.url, {
      max: v.poolSize,
      connect_timeout: v.timeout,
      onnotice: () => {},
      connection: { application_name: "txbox" },
    })
    const db = yield* Effect.acquireRelease(
      Effect.sync(() => new Kysely<unknown>({ dialect: new PostgresJSDialect({ postgres: client }) })),
      (db) => Effect.promise(() => db.destroy().catch(() => undefined)),
    )
    const listen = (channel: string, onNotify: () => void): Effect.Effect<void, StoreError, Scope.Scope> =>
      Effect.acquireRelease(
        Effect.tryPromise({
          // postgres.js re-issues LISTEN on its own after a reconnect.
          try: () => client.listen(channel, () => onNotify()),
          catch: (cause) => classifyDbError("listen", cause),
        }).pipe(Effect.retry({ schedule: relisten, times: 5 })),
        (sub) => Effect.promise(() => sub.unlisten().catch(() => undefined)),
      ).pipe(Effect.asVoid)
    return { db, listen }
  })

const nodePostgres = (config: PostgresStoreConfig, v: ReturnType<typeof validate>) =>
  Effect.gen(function* () {
    const pool = new pg.Pool({
      connectionString: config.url,
      max: v.poolSize,
      connectionTimeoutMillis: v.timeout * 1000,
      application_name: "txbox",
    })
    // An idle client whose backend dies emits 'error' on the pool; unhandled,
    // that would end the process. The next checkout gets a fresh client.
    pool.on("error", () => {})
    const db = yield* Effect.acquireRelease(
      Effect.sync(() => new Kysely<unknown>({ dialect: new PostgresDialect({ pool }) })),
      (db) => Effect.promise(() => db.destroy().catch(() => undefined)),
    )
    const listen = (channel: string, onNotify: () => void): Effect.Effect<void, StoreError, Scope.Scope> =>
      Effect.gen(function* () {
        let closed = false
        let current: pg.Client | undefined
        const connect = async (): Promise<void> => {
          const client = new pg.Client({
            connectionString: config.url,
            connectionTimeoutMillis: v.timeout * 1000,
          })
          client.on("notification", () => onNotify())
          client.on("error", () => {})
          client.on("end", () => {
            if (closed) return
            // Reconnect in the background; a wake-up may be missed meanwhile, which polling covers.
            onNotify()
            setTimeout(() => void connect().catch(() => client.emit("end")), 500)
          })
          await client.connect()
          await client.query(`LISTEN "${channel.replaceAll('"', '""')}"`)
          current = client
        }
        yield* Effect.tryPromise({ try: connect, catch: (cause) => classifyDbError("listen", cause) }).pipe(
          Effect.retry({ schedule: relisten, times: 5 }),
        )
        yield* Effect.addFinalizer(() =>
          Effect.promise(async () => {
            closed = true
            await current?.end().catch(() => undefined)
          }),
        )
      })
    return { db, listen }
  })

/** Builds the `Database` service in the current scope; closing the scope closes the pool. */
export const make = (config: PostgresStoreConfig): Effect.Effect<DatabaseShape, ConfigError, Scope.Scope> =>
  Effect.gen(function* () {
    const v = yield* Effect.try({ try: () => validate(config), catch: (e) => e as ConfigError })
    const { db, listen } = v.driver === "pg" ? yield* nodePostgres(config, v) : yield* postgresJs(config, v)
    const noListen = (_channel: string, _onNotify: () => void) => Effect.void
    return {
      db,
      schema: v.schema,
      driver: v.driver,
      listen: config.listen === false ? noListen : listen,
    } satisfies DatabaseShape
  })

/** The PostgreSQL store as a layer providing `Database`. */
export const layer = (config: PostgresStoreConfig): Layer.Layer<Database, ConfigError> =>
  Layer.effect(Database, make(config))
