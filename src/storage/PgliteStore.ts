/**
 * The embedded store: PostgreSQL compiled to WebAssembly (PGlite), in this
 * process, as the `Database` port. Same SQL and same migrations as the
 * PostgreSQL store; no server, in memory unless given a `dataDir`.
 *
 * What differs from PostgreSQL:
 * - ONE connection. Statements from concurrent fibers run one after another,
 *   and a transaction holds the connection from BEGIN to COMMIT (see
 *   pgliteDialect.ts), so two relay workers or two consumers take turns
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
 */
import { PGlite } from "@electric-sql/pglite"
import { Effect, Layer, type Scope } from "effect"
import { Kysely } from "kysely"
import { validateConfig } from "../core/config.ts"
import { classifyDbError } from "../core/dbErrors.ts"
import { validateSchemaName } from "../core/identifier.ts"
import { ConfigError, StoreError } from "../Errors.ts"
import { Database, type DatabaseShape } from "../ports/Database.ts"
import type { TxboxStore } from "../ports/stores.ts"
import { PgliteDialect, sessionLock } from "./pgliteDialect.ts"
import { sqlStores } from "./storeLayer.ts"

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
}

const validate = (config: PgliteStoreConfig) => {
  const schema = validateSchemaName(config.schema ?? "txbox")
  if (config.pglite !== undefined && config.dataDir !== undefined) {
    throw new ConfigError({ reason: "give either pglite (an open instance) or dataDir, not both" })
  }
  if (config.dataDir !== undefined && (typeof config.dataDir !== "string" || config.dataDir === "")) {
    throw new ConfigError({ reason: "dataDir must be a non-empty string" })
  }
  return { schema }
}

/** Opens PGlite (or adopts the caller's); closes it with the scope only if this store opened it. */
const open = (config: PgliteStoreConfig): Effect.Effect<PGlite, StoreError, Scope.Scope> => {
  const given = config.pglite
  if (given !== undefined) return Effect.succeed(given)
  return Effect.acquireRelease(
    Effect.tryPromise({
      try: () => PGlite.create(config.dataDir),
      // Not "connection": a data directory that cannot be opened will not open on a retry either.
      catch: (cause) => new StoreError({ reason: "query", operation: "PgliteStore.open", cause }),
    }),
    (pglite) => Effect.promise(() => pglite.close().catch(() => undefined)),
  )
}

// PGlite sends `LISTEN <channel>` as written and keys its callbacks by the
// name PostgreSQL would fold it to; our channels contain a dot
// (`txbox.outbox`), so they travel quoted. Schema names are validated, so
// there is never a quote inside to escape.
const quoteChannel = (channel: string) => `"${channel}"`

/** Builds the `Database` service in the current scope; closing the scope closes PGlite if the store opened it. */
export const make = (
  config: PgliteStoreConfig = {},
): Effect.Effect<DatabaseShape, ConfigError | StoreError, Scope.Scope> =>
  Effect.gen(function* () {
    const v = yield* validateConfig(() => validate(config))
    const pglite = yield* open(config)
    const lock = sessionLock(pglite)
    const db = yield* Effect.acquireRelease(
      Effect.sync(() => new Kysely<unknown>({ dialect: new PgliteDialect({ pglite }) })),
      (db) => Effect.promise(() => db.destroy().catch(() => undefined)),
    )

    // LISTEN takes the session's lock like any Kysely statement: run inside
    // another fiber's open transaction it would only take effect at that
    // transaction's commit, and be undone by its rollback.
    const listen = (channel: string, onNotify: () => void): Effect.Effect<void, StoreError, Scope.Scope> =>
      Effect.acquireRelease(
        Effect.tryPromise({
          try: () => lock.run(() => pglite.listen(quoteChannel(channel), () => onNotify())),
          catch: (cause) => classifyDbError("listen", cause),
        }),
        (unlisten) => Effect.promise(() => lock.run(() => unlisten()).catch(() => undefined)),
      ).pipe(Effect.asVoid)
    const noListen = (_channel: string, _onNotify: () => void) => Effect.void

    return {
      db,
      schema: v.schema,
      listen: config.listen === false ? noListen : listen,
    } satisfies DatabaseShape
  })

/** The embedded PGlite store as a layer: `Database`, the `OutboxStore` and `InboxStore` ports over it, and the schema setting. */
export const layer = (config: PgliteStoreConfig = {}): Layer.Layer<TxboxStore, ConfigError | StoreError> =>
  sqlStores(Layer.effect(Database, make(config)))
