/**
 * `txbox/pglite`: the embedded store (PGlite: PostgreSQL in WebAssembly, in
 * this process) and the migrator, which runs on it unchanged.
 */

export {
  Mutex,
  type PgliteClient,
  PgliteDialect,
  type PgliteDialectConfig,
  sessionLock,
} from "./storage/drivers/pglite/dialect.ts"
export type { PgliteStoreConfig } from "./storage/drivers/pglite/PgliteStore.ts"
/** The embedded store on PGlite: `PgliteStore.layer({ dataDir })` provides `Database`, `OutboxStore` and `InboxStore` in this process. */
export * as PgliteStore from "./storage/drivers/pglite/PgliteStore.ts"
export { migrations } from "./storage/sql/migrations.generated.ts"
export { checksum, type MigrateResult, type Migration, migrate, pending } from "./storage/sql/migrator.ts"
