/**
 * The PostgreSQL store on postgres.js (`postgres`): a Kysely instance over a
 * postgres.js pool that replaces itself after a connection closes, plus a
 * watched LISTEN, as the `Database` port, and the outbox and inbox ports over
 * it. node-postgres (`txbox/pg`) is the default because it rides out database
 * restarts; see README "Drivers under faults" for what postgres.js 3.4.9 does
 * there and what txbox does about it. `postgres` is an optional peer
 * dependency of txbox, imported when the layer is built; without it the layer
 * fails with a `ConfigError` that says `npm i postgres`.
 */
import { type Config, Effect, Layer, type Scope } from "effect"
import { validateConfig } from "../../../core/config.ts"
import type { ConfigError } from "../../../Errors.ts"
import { fromConfig } from "../../../layerConfig.ts"
import { Database, type DatabaseShape } from "../../../ports/Database.ts"
import type { TxboxStore } from "../../../ports/stores.ts"
import { type PostgresConnectionConfig, validateConnection } from "../shared/postgresConnection.ts"
import { sqlStores } from "../shared/sqlStores.ts"
import { open } from "./database.ts"

/** `url` (a string or `Redacted`), `schema`, `poolSize`, `listen`, `connectTimeoutSeconds`. */
export type PostgresJsStoreConfig = PostgresConnectionConfig

/** Builds the `Database` service in the current scope; closing the scope closes the pool. */
export const make = (config: PostgresJsStoreConfig): Effect.Effect<DatabaseShape, ConfigError, Scope.Scope> =>
  Effect.gen(function* () {
    const v = yield* validateConfig(() => validateConnection(config))
    return yield* open(v, "txbox/postgres-js")
  })

/** The store as a layer: `Database`, the `OutboxStore` and `InboxStore` ports over it, and the schema setting. */
export const layer = (config: PostgresJsStoreConfig): Layer.Layer<TxboxStore, ConfigError> =>
  sqlStores(Layer.effect(Database, make(config)))

/**
 * `layer`, its settings read through Effect's `Config`:
 * `PostgresJsStore.layerConfig({ url: Config.Redacted("DATABASE_URL") })`.
 */
export const layerConfig = (
  config: Config.Wrap<PostgresJsStoreConfig>,
): Layer.Layer<TxboxStore, ConfigError> => fromConfig(config, layer)
