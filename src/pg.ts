/**
 * `txbox/pg`: the PostgreSQL store on node-postgres (the default driver) and
 * the migrator. Needs `pg` installed (an optional peer dependency of txbox).
 */

export { migrations } from "./storage/migrations.generated.ts"
export { checksum, type MigrateResult, type Migration, migrate, pending } from "./storage/migrator.ts"
export type { PgStoreConfig } from "./storage/PgStore.ts"
export * as PgStore from "./storage/PgStore.ts"
