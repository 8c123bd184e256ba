/**
 * The PostgreSQL store with the driver chosen by a setting: node-postgres
 * (default) or postgres.js, under Kysely, plus a LISTEN connection, as the
 * `Database` port. `txbox/pg` (`PgStore`) and `txbox/postgres-js`
 * (`PostgresJsStore`) are the same store with the driver fixed; this one stays
 * for `txbox/postgres` and the CLI's `--driver`. Either driver is imported
 * only when the layer is built, so only the chosen one need be installed.
 *
 * Which driver survives what (see README "Drivers under faults"):
 * postgres.js 3.4.9 writes to a socket it dropped when a transaction goes on
 * after its connection closed (upstream #1066, #1154, #1208): an uncatchable
 * TypeError that ends a Node process or leaves the statement waiting on Bun.
 * `renewingPostgresJs.ts` keeps every statement off such a connection and
 * replaces the pool; its LISTEN is watched (`listenWatchdog.ts`).
 * node-postgres reports the same events as ordinary errors.
 */
import { type Config, Effect, Layer, type Scope } from "effect"
import { validateConfig } from "../core/config.ts"
import { ConfigError } from "../Errors.ts"
import { fromConfig } from "../layerConfig.ts"
import { Database, type DatabaseShape } from "../ports/Database.ts"
import type { TxboxStore } from "../ports/stores.ts"
import * as nodePostgres from "./nodePostgres.ts"
import { type PostgresConnectionConfig, validateConnection } from "./postgresCommon.ts"
import * as postgresJs from "./postgresJs.ts"
import { sqlStores } from "./storeLayer.ts"

export interface PostgresStoreConfig extends PostgresConnectionConfig {
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
}

const validate = (config: PostgresStoreConfig) => {
  const driver = config.driver ?? "pg"
  if (driver !== "pg" && driver !== "postgres.js") {
    throw new ConfigError({ reason: `driver must be "pg" or "postgres.js", got ${JSON.stringify(driver)}` })
  }
  return { ...validateConnection(config), driver }
}

/** Builds the `Database` service in the current scope; closing the scope closes the pool. */
export const make = (config: PostgresStoreConfig): Effect.Effect<DatabaseShape, ConfigError, Scope.Scope> =>
  Effect.gen(function* () {
    const v = yield* validateConfig(() => validate(config))
    return v.driver === "pg"
      ? yield* nodePostgres.open(v, "txbox/postgres (driver: pg)")
      : yield* postgresJs.open(v, "txbox/postgres (driver: postgres.js)")
  })

/**
 * The PostgreSQL store as a layer: the `Database`, the `OutboxStore` and
 * `InboxStore` ports over it, and the schema `Outbox.enqueue` writes to.
 */
export const layer = (config: PostgresStoreConfig): Layer.Layer<TxboxStore, ConfigError> =>
  sqlStores(Layer.effect(Database, make(config)))

/**
 * `layer`, its settings read through Effect's `Config`:
 * `layerConfig({ url: Config.Redacted("DATABASE_URL"), driver: Config.Literals(["pg", "postgres.js"], "DB_DRIVER") })`.
 */
export const layerConfig = (config: Config.Wrap<PostgresStoreConfig>): Layer.Layer<TxboxStore, ConfigError> =>
  fromConfig(config, layer)
