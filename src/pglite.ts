/**
 * `txbox/pglite`: the embedded store (PGlite: PostgreSQL in WebAssembly, in
 * this process) and the migrator, which runs on it unchanged.
 */

export { migrations } from "./storage/migrations.generated.ts"
export { checksum, type MigrateResult, type Migration, migrate, pending } from "./storage/migrator.ts"
export type { PgliteStoreConfig } from "./storage/PgliteStore.ts"
export * as PgliteStore from "./storage/PgliteStore.ts"
export {
  Mutex,
  type PgliteClient,
  PgliteDialect,
  type PgliteDialectConfig,
  sessionLock,
} from "./storage/pgliteDialect.ts"
