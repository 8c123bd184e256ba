/** `txbox/postgres`: the PostgreSQL store (postgres.js or node-postgres under Kysely) and the migrator. */

export { migrations } from "./storage/migrations.generated.ts"
export { checksum, type MigrateResult, type Migration, migrate, pending } from "./storage/migrator.ts"
export type { PostgresStoreConfig } from "./storage/PostgresStore.ts"
export * as PostgresStore from "./storage/PostgresStore.ts"
