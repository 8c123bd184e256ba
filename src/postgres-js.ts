/**
 * `txbox/postgres-js`: the PostgreSQL store on postgres.js and the migrator.
 * Needs `postgres` installed (an optional peer dependency of txbox).
 */

export {
  PostgresJsDialect,
  type PostgresJsDialectConfig,
  type PostgresJsPool,
  type PostgresJsReserved,
} from "./storage/drivers/postgres-js/dialect.ts"
export type { PostgresJsStoreConfig } from "./storage/drivers/postgres-js/PostgresJsStore.ts"
/** The PostgreSQL store on postgres.js: `PostgresJsStore.layer({ url })` provides `Database`, `OutboxStore` and `InboxStore`. */
export * as PostgresJsStore from "./storage/drivers/postgres-js/PostgresJsStore.ts"
export { migrations } from "./storage/sql/migrations.generated.ts"
export { checksum, type MigrateResult, type Migration, migrate, pending } from "./storage/sql/migrator.ts"
