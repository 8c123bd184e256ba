/**
 * The store over a Kysely instance the app already has: whatever dialect and
 * pool the app built (node-postgres, postgres.js, PGlite, Neon's or another
 * edge driver), as the `Database` port, and the outbox and inbox ports over it.
 * It imports no driver, and it never closes the app's Kysely: the app owns it.
 *
 * Kysely cannot LISTEN, so without a `listen` the relay and the inbox wake on
 * their poll interval alone (correct, only slower to react).
 */
import { Effect, Layer } from "effect"
import type { Kysely, KyselyPlugin } from "kysely"
import { validateConfig } from "../../../core/config.ts"
import { validateSchemaName } from "../../../core/identifier.ts"
import { ConfigError } from "../../../Errors.ts"
import { Database, type DatabaseShape } from "../../../ports/Database.ts"
import { InboxStore, type InboxStoreShape } from "../../../ports/InboxStore.ts"
import type { TxboxStore } from "../../../ports/stores.ts"
import { noListen } from "../shared/postgresConnection.ts"
import { sqlStores } from "../shared/sqlStores.ts"

/** The settings of `KyselyStore.layer`: the app's Kysely, the schema, and LISTEN if the app can provide it. */
export interface KyselyStoreConfig {
  /** The app's Kysely on PostgreSQL (or PGlite). Left open when the layer closes. */
  // biome-ignore lint/suspicious/noExplicitAny: the app's Kysely describes its own tables
  readonly db: Kysely<any>
  /** Schema holding txbox's tables. @default "txbox" */
  readonly schema?: string
  /**
   * LISTEN, if the app has a connection for it: subscribe to `channel` until
   * the scope closes, calling `onNotify` on each NOTIFY. Without it, polling.
   */
  readonly listen?: DatabaseShape["listen"]
  /**
   * Set when the dialect makes COMMIT of an aborted transaction fail (Kysely
   * 0.29's drivers, or txbox's own `pg` pool); unset, txbox checks the
   * transaction before COMMIT, one more round trip. @default false
   */
  readonly commitRefusesAborted?: boolean
}

/** The `Database` service over the app's Kysely. */
export const make = (config: KyselyStoreConfig): Effect.Effect<DatabaseShape, ConfigError> =>
  validateConfig(() => {
    const db = config.db as unknown
    if (
      typeof db !== "object" ||
      db === null ||
      typeof (db as { transaction?: unknown }).transaction !== "function"
    ) {
      throw new ConfigError({ reason: "db must be a Kysely instance" })
    }
    return {
      // txbox's own statements run without the app's plugins: a CamelCasePlugin would rename
      // their result rows. Handlers still get them (`layer`).
      db: config.db.withoutPlugins(),
      schema: validateSchemaName(config.schema ?? "txbox"),
      listen: config.listen ?? noListen,
      commitRefusesAborted: config.commitRefusesAborted === true,
    } satisfies DatabaseShape
  })

/**
 * The app's plugins, in order. Kysely lists them only on its executor
 * (`getExecutor`: declared public, documented as internal).
 */
// biome-ignore lint/suspicious/noExplicitAny: the app's Kysely describes its own tables
const pluginsOf = (db: Kysely<any>): ReadonlyArray<KyselyPlugin> => db.getExecutor().plugins

/**
 * The inbox store whose handlers get their transaction with the app's plugins,
 * as if the app had begun it; the store's own statements in it keep the
 * plugin-free transaction they were given.
 */
const handlersGetPlugins =
  (plugins: ReadonlyArray<KyselyPlugin>) =>
  (store: InboxStoreShape): InboxStoreShape =>
    plugins.length === 0
      ? store
      : {
          ...store,
          transaction: (use, options) =>
            store.transaction(
              (tx) => use({ ...tx, trx: plugins.reduce((trx, plugin) => trx.withPlugin(plugin), tx.trx) }),
              options,
            ),
        }

/** The store as a layer: `Database`, the `OutboxStore` and `InboxStore` ports over it, and the schema setting. */
export const layer = (config: KyselyStoreConfig): Layer.Layer<TxboxStore, ConfigError> =>
  Layer.provideMerge(
    // Built after `make` validated `config.db`, and overrides the plain inbox store.
    Layer.effect(
      InboxStore,
      Effect.gen(function* () {
        return handlersGetPlugins(pluginsOf(config.db))(yield* InboxStore)
      }),
    ),
    sqlStores(Layer.effect(Database, make(config))),
  )
