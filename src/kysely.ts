/**
 * `txbox/kysely`: the store over a Kysely instance the app already has, and
 * the migrator. No driver: for a service that owns its pool, or an edge worker.
 */

export type { KyselyStoreConfig } from "./storage/drivers/kysely/KyselyStore.ts"
/** The store over the app's own Kysely: `KyselyStore.layer({ db })` provides `Database`, `OutboxStore` and `InboxStore`, and never closes `db`. */
export * as KyselyStore from "./storage/drivers/kysely/KyselyStore.ts"
export { migrations } from "./storage/sql/migrations.generated.ts"
export { checksum, type MigrateResult, type Migration, migrate, pending } from "./storage/sql/migrator.ts"
