/**
 * txbox: the transactional outbox and inbox for TypeScript.
 * This entry imports no driver and no Node-only module, so `Outbox.enqueue`
 * runs wherever Kysely does.
 */
export {
  type AnyContract,
  type Decoded,
  decode,
  defineEvent,
  type EventContract,
  encode,
  type InputOf,
  type JsonSchema,
  makeRegistry,
  type PayloadOf,
  type Registry,
  type Upcast,
  validate,
} from "./Contract.ts"
export { type AsyncApiOptions, asyncApiDocument } from "./contracts/asyncapi.ts"
export {
  type CheckOptions,
  type CheckResult,
  type CompatibilityReport,
  checkCompatibility,
  checkContracts,
  type Finding,
} from "./contracts/compatibility.ts"
export { type JsonSchemaConverter, type JsonSchemaObject, jsonSchemaOf } from "./contracts/jsonSchema.ts"
export {
  ConfigError,
  StoreError,
  TransportError,
  UnknownEventError,
  ValidationError,
} from "./Errors.ts"
/** The consumer side: handlers per contract, run exactly once per message in the inbox transaction. */
export * as Inbox from "./Inbox.ts"
/** txbox's counters, gauge and histograms as Effect metrics, and their Prometheus text. */
export * as Metrics from "./Metrics.ts"
/** The producer side: enqueue events in the caller's own transaction. */
export * as Outbox from "./Outbox.ts"
export { Database, type DatabaseSession, type DatabaseShape, TxboxSchema } from "./ports/Database.ts"
export {
  type InboxMark,
  type InboxRow,
  InboxStore,
  type InboxStoreShape,
  type InboxTransaction,
  type InboxTransactionOptions,
  type OrderedDeadPolicy,
  type RouteBinding,
} from "./ports/InboxStore.ts"
export type { Claim, Verdict } from "./ports/lease.ts"
export {
  OutboxLog,
  type OutboxLogBatch,
  type OutboxLogRow,
  type OutboxLogShape,
  type OutboxLogStatus,
} from "./ports/OutboxLog.ts"
export {
  type OutboxClaim,
  type OutboxMark,
  type OutboxMessage,
  type OutboxShard,
  OutboxStore,
  type OutboxStoreShape,
} from "./ports/OutboxStore.ts"
export type { TxboxStore } from "./ports/stores.ts"
export {
  type Delivery,
  type DeliveryDecision,
  type HandleMany,
  type MessagingIdentity,
  type OutgoingMessage,
  type PartitionPosition,
  type PublishOutcome,
  type SubscribeOptions,
  Transport,
  type TransportShape,
} from "./ports/Transport.ts"
export type {
  ArchivedColumns,
  HousekeepingLeasesTable,
  InboxBindingsTable,
  InboxConsumersTable,
  InboxCursorsTable,
  InboxStatus,
  InboxTable,
  MigrationsTable,
  OutboxStatus,
  OutboxTable,
  PartitionCountersTable,
  TxboxDatabase,
} from "./ports/tables.ts"
/** Publishes the outbox to the broker: claim → publish → mark, under a lease. */
export * as Relay from "./Relay.ts"
/** The backoff policy shared by per-message retries and outage retries. */
export * as Retry from "./Retry.ts"
