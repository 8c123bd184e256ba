/**
 * The embedded store: PostgreSQL compiled to WebAssembly (PGlite), in this
 * process, as the `Database` port. Same SQL and same migrations as the
 * PostgreSQL store; no server, in memory unless given a `dataDir`.
 *
 * What differs from PostgreSQL:
 * - ONE connection. Statements from concurrent fibers run one after another,
 *   and a transaction holds the connection from BEGIN to COMMIT (see
 *   dialect.ts), so two relay workers or two consumers take turns
 *   rather than claim in parallel. Throughput is one session's: enough for
 *   a demo, tests, a CLI or a small single-process app.
 * - `FOR UPDATE SKIP LOCKED` is a no-op in effect: nobody else can hold a row
 *   lock. Leases and claim tokens still work as on PostgreSQL.
 * - Inside a transaction, use the transaction (`trx`), never the store's
 *   `db`: the outer handle waits for the connection the transaction holds.
 * - In memory by default: everything is gone when the process ends. Give
 *   `dataDir` (a directory on Node/Bun/Deno, `idb://name` in a browser) to keep it.
 * - LISTEN/NOTIFY works within the process (the relay wakes on commit), never
 *   across processes.
 * - PGlite runs on this thread and answers through promise callbacks alone,
 *   never a turn of the event loop: a tight loop of statements keeps timers
 *   and other fibers waiting until it ends. Yield between iterations
 *   (`Effect.yieldNow`) when the relay and the inbox share the process.
 * - Slower than a server, and each new in-memory database runs initdb
 *   (figures: bench/README.md, "Design measurements: PGlite").
 *
 * `@electric-sql/pglite` is an optional peer dependency, imported only when the
 * store opens an instance itself. On Kysely 0.29 the store runs on Kysely's own
 * `PGliteDialect`: it keeps the same guarantee as txbox's `PgliteDialect` (a
 * statement from elsewhere waits for an open transaction instead of joining
 * it: Kysely holds its one connection from BEGIN to COMMIT, and runs the
 * transaction in PGlite's exclusive `transaction()`, which every other
 * `query`, `listen` and Kysely on the instance waits for), and it refuses an
 * aborted COMMIT. Kysely 0.28 has no PGlite dialect: txbox's is used there.
 */
import type { PGlite } from "@electric-sql/pglite"
import { type Config, Effect, Layer, type Scope } from "effect"
import * as kysely from "kysely"
import { validateConfig } from "../../../core/config.ts"
import { validateSchemaName } from "../../../core/identifier.ts"
import { loadDriver } from "../../../drivers.ts"
import { ConfigError, StoreError } from "../../../Errors.ts"
import { fromConfig } from "../../../layerConfig.ts"
import { Database, type DatabaseShape } from "../../../ports/Database.ts"
import type { TxboxStore } from "../../../ports/stores.ts"
import { classifyDbError } from "../../sql/errors.ts"
import { noListen } from "../shared/postgresConnection.ts"
import { sqlStores } from "../shared/sqlStores.ts"
import { PgliteDialect, sessionLock } from "./dialect.ts"

/** The settings of `PgliteStore.layer`: where PGlite keeps its data (or the app's own instance), the schema, and LISTEN. */
export interface PgliteStoreConfig {
  /**
   * Where PGlite keeps its files: a directory (Node, Bun, Deno), `idb://name`
   * (browser IndexedDB) or `memory://`. Ignored when `pglite` is given.
   * @default in memory
   */
  readonly dataDir?: string
  /** Schema holding txbox's tables. @default "txbox" */
  readonly schema?: string
  /**
   * Bring your own PGlite instance (to share it with the rest of the app, or
   * with extensions loaded). The layer then leaves it open when it closes;
   * otherwise it closes the instance it created.
   */
  readonly pglite?: PGlite
  /** Subscribe to NOTIFY for low-latency wake-ups. Polling stays correct without it. @default true */
  readonly listen?: boolean
  /**
   * The Kysely dialect: Kysely's own `PGliteDialect` ("builtin", Kysely 0.29)
   * or txbox's `PgliteDialect` ("txbox"). @default "builtin" where Kysely has it
   */
  readonly dialect?: "builtin" | "txbox"
}

const validate = (config: PgliteStoreConfig) => {
  const schema = validateSchemaName(config.schema ?? "txbox")
  if (config.pglite !== undefined && config.dataDir !== undefined) {
    throw new ConfigError({ reason: "give either pglite (an open instance) or dataDir, not both" })
  }
  if (config.dataDir !== undefined && (typeof config.dataDir !== "string" || config.dataDir === "")) {
    throw new ConfigError({ reason: "dataDir must be a non-empty string" })
  }
  if (config.dialect !== undefined && config.dialect !== "txbox" && config.dialect !== "builtin") {
    throw new ConfigError({
      reason: `dialect must be "builtin" or "txbox", got ${JSON.stringify(config.dialect)}`,
    })
  }
  if (config.dialect === "builtin" && builtinDialect === undefined) {
    throw new ConfigError({ reason: 'dialect "builtin" needs Kysely 0.29 or later (it has PGliteDialect)' })
  }
  return { schema }
}

/** Opens PGlite (or adopts the caller's); closes it with the scope only if this store opened it. */
const open = (config: PgliteStoreConfig): Effect.Effect<PGlite, ConfigError | StoreError, Scope.Scope> => {
  const given = config.pglite
  if (given !== undefined) return Effect.succeed(given)
  return Effect.acquireRelease(
    Effect.flatMap(
      loadDriver({
        name: "@electric-sql/pglite",
        entry: "txbox/pglite",
        load: () => import("@electric-sql/pglite"),
      }),
      (module) =>
        Effect.tryPromise({
          try: () => module.PGlite.create(config.dataDir),
          // Not "connection": a data directory that cannot be opened will not open on a retry either.
          catch: (cause) => new StoreError({ reason: "query", operation: "PgliteStore.open", cause }),
        }),
    ),
    (pglite) => Effect.promise(() => pglite.close().catch(() => undefined)),
  )
}

// PGlite sends `LISTEN <channel>` as written and keys its callbacks by the
// name PostgreSQL would fold it to; our channels contain a dot
// (`txbox.outbox`), so they travel quoted. Schema names are validated, so
// there is never a quote inside to escape.
const quoteChannel = (channel: string) => `"${channel}"`

/** Kysely 0.29's `PGliteDialect`, read off the module so that this file also loads on Kysely 0.28. */
type BuiltinDialect = new (config: { readonly pglite: PGlite }) => kysely.Dialect
const builtinDialect = (kysely as unknown as { readonly PGliteDialect?: BuiltinDialect }).PGliteDialect

/**
 * The Kysely over `pglite`, and how other work on the session keeps out of
 * its transactions: on Kysely 0.29 PGlite's own transaction lock does it (see
 * the module); on 0.28 txbox's dialect and `sessionLock` do.
 */
const kyselyOn = (
  pglite: PGlite,
  dialect: "builtin" | "txbox",
): {
  readonly db: kysely.Kysely<unknown>
  readonly exclusive: <T>(f: () => Promise<T>) => Promise<T>
  readonly builtin: boolean
} => {
  if (dialect === "builtin" && builtinDialect !== undefined) {
    return {
      db: new kysely.Kysely<unknown>({ dialect: new builtinDialect({ pglite }) }),
      exclusive: (f) => f(),
      builtin: true,
    }
  }
  const lock = sessionLock(pglite)
  return {
    db: new kysely.Kysely<unknown>({ dialect: new PgliteDialect({ pglite }) }),
    exclusive: (f) => lock.run(f),
    builtin: false,
  }
}

/** Which dialect the store runs on with the Kysely installed: Kysely's own (0.29) or txbox's (0.28). */
export const dialect: "builtin" | "txbox" = builtinDialect === undefined ? "txbox" : "builtin"

/** Builds the `Database` service in the current scope; closing the scope closes PGlite if the store opened it. */
export const make = (
  config: PgliteStoreConfig = {},
): Effect.Effect<DatabaseShape, ConfigError | StoreError, Scope.Scope> =>
  Effect.gen(function* () {
    const v = yield* validateConfig(() => validate(config))
    const pglite = yield* open(config)
    const { db, exclusive, builtin } = kyselyOn(pglite, config.dialect ?? dialect)
    // txbox's dialect: destroying waits for the session's current user and refuses later ones.
    // Not Kysely 0.29's: its destroy closes PGlite, which `open` does when (and only when) the
    // store opened it.
    if (!builtin) yield* Effect.addFinalizer(() => Effect.promise(() => db.destroy().catch(() => undefined)))

    // LISTEN takes the session's lock like any Kysely statement: run inside
    // another fiber's open transaction it would only take effect at that
    // transaction's commit, and be undone by its rollback.
    const listen = (channel: string, onNotify: () => void): Effect.Effect<void, StoreError, Scope.Scope> =>
      Effect.acquireRelease(
        Effect.tryPromise({
          try: () => exclusive(() => pglite.listen(quoteChannel(channel), () => onNotify())),
          catch: (cause) => classifyDbError("listen", cause),
        }),
        (unlisten) => Effect.promise(() => exclusive(() => unlisten()).catch(() => undefined)),
      ).pipe(Effect.asVoid)

    return {
      db,
      schema: v.schema,
      listen: config.listen === false ? noListen : listen,
      // Kysely 0.29's dialect fails an aborted COMMIT (AbortedTransactionError); txbox's probes.
      commitRefusesAborted: builtin,
    } satisfies DatabaseShape
  })

/** The embedded PGlite store as a layer: `Database`, the `OutboxStore` and `InboxStore` ports over it, and the schema setting. */
export const layer = (config: PgliteStoreConfig = {}): Layer.Layer<TxboxStore, ConfigError | StoreError> =>
  sqlStores(Layer.effect(Database, make(config)))

/** `layer`, its settings read through Effect's `Config`: `PgliteStore.layerConfig({ dataDir: Config.String("DATA_DIR") })`. */
export const layerConfig = (
  config: Config.Wrap<Omit<PgliteStoreConfig, "pglite">>,
): Layer.Layer<TxboxStore, ConfigError | StoreError> => fromConfig(config, layer)
