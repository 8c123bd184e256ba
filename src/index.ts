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
export * as Inbox from "./Inbox.ts"
export * as Metrics from "./Metrics.ts"
export * as Outbox from "./Outbox.ts"
export { Database, type DatabaseShape, TxboxSchema } from "./ports/Database.ts"
export {
  type InboxMark,
  type InboxRow,
  InboxStore,
  type InboxStoreShape,
  type InboxTransaction,
  type OrderedDeadPolicy,
} from "./ports/InboxStore.ts"
export type { Claim, Verdict } from "./ports/lease.ts"
export {
  type OutboxMark,
  type OutboxMessage,
  OutboxStore,
  type OutboxStoreShape,
} from "./ports/OutboxStore.ts"
export type { TxboxStore } from "./ports/stores.ts"
export {
  type Delivery,
  type DeliveryDecision,
  type OutgoingMessage,
  type PublishOutcome,
  type SubscribeOptions,
  Transport,
  type TransportShape,
} from "./ports/Transport.ts"
export type { TxboxDatabase } from "./ports/tables.ts"
export * as Relay from "./Relay.ts"
export * as Retry from "./Retry.ts"
