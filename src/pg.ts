/**
 * `txbox/pg`: the PostgreSQL store on node-postgres (the default driver) and
 * the migrator. Needs `pg` installed (an optional peer dependency of txbox).
 */

export type { PgStoreConfig } from "./storage/drivers/pg/PgStore.ts"
/** The PostgreSQL store on node-postgres: `PgStore.layer({ url })` provides `Database`, `OutboxStore` and `InboxStore`. */
export * as PgStore from "./storage/drivers/pg/PgStore.ts"
export type { WalLogConfig } from "./storage/drivers/pg/walLog.ts"
/** The outbox's log over logical replication on node-postgres: `WalLog.layer({ url })` provides `OutboxLog`, what a relay with `source: "wal"` reads. */
export * as WalLog from "./storage/drivers/pg/walLog.ts"
export { migrations } from "./storage/sql/migrations.generated.ts"
export { checksum, type MigrateResult, type Migration, migrate, pending } from "./storage/sql/migrator.ts"
