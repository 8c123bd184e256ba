/**
 * `txbox/postgres`: kept for compatibility. `PostgresStore` picks its driver
 * with a setting (`driver: "pg" | "postgres.js"`); `txbox/pg` and
 * `txbox/postgres-js` hold the same store with the driver fixed. Either way a
 * driver is imported only when its layer is built, so only the one used need
 * be installed.
 */

export { migrations } from "./storage/migrations.generated.ts"
export { checksum, type MigrateResult, type Migration, migrate, pending } from "./storage/migrator.ts"
export type { PgStoreConfig } from "./storage/PgStore.ts"
export * as PgStore from "./storage/PgStore.ts"
export type { PostgresJsStoreConfig } from "./storage/PostgresJsStore.ts"
export * as PostgresJsStore from "./storage/PostgresJsStore.ts"
export type { PostgresStoreConfig } from "./storage/PostgresStore.ts"
export * as PostgresStore from "./storage/PostgresStore.ts"
