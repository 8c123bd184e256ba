/**
 * `txbox/postgres-js`: the PostgreSQL store on postgres.js and the migrator.
 * Needs `postgres` installed (an optional peer dependency of txbox).
 */

export { migrations } from "./storage/migrations.generated.ts"
export { checksum, type MigrateResult, type Migration, migrate, pending } from "./storage/migrator.ts"
export type { PostgresJsStoreConfig } from "./storage/PostgresJsStore.ts"
export * as PostgresJsStore from "./storage/PostgresJsStore.ts"
export {
  PostgresJsDialect,
  type PostgresJsDialectConfig,
  type PostgresJsPool,
  type PostgresJsReserved,
} from "./storage/postgresJsDialect.ts"
