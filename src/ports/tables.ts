/** Kysely types for txbox's tables (migrations/*.sql are the source of truth): the shape every SQL statement, store adapter and enqueue is typed against. */
import type { ColumnType, Generated } from "kysely"

/** @internal A `timestamptz` column: read as a `Date`, written as a `Date` or an ISO string (insert defaults to now()). */
type Timestamp = ColumnType<Date, Date | string | undefined, Date | string>
/** @internal A `jsonb` column: read as the value, written as the value or its JSON text. */
type Json<T> = ColumnType<T, string | T | undefined, string | T>

/** An outbox row's state: `pending` until the broker confirms it (`sent`) or the relay gives up on it (`dead`). */
export type OutboxStatus = "pending" | "sent" | "dead"
/** An inbox row's state: `pending` while stored for the processor, then `processed` (the dedupe record) or `dead`. */
export type InboxStatus = "pending" | "processed" | "dead"

/** The `outbox` table (migration 0001): one row per enqueued message, written in the producer's transaction. */
export interface OutboxTable {
  /** The message id (uuid): the AMQP `messageId` and the consumers' dedupe key. */
  id: string
  /** The event type. */
  type: string
  /** The contract version the payload was written as. */
  version: number
  /** The payload (jsonb). */
  payload: Json<unknown>
  /** String headers carried to the consumer. */
  headers: Json<Record<string, string>>
  /** Routing key on the topic exchange; null: the type. */
  routing_key: string | null
  /** The ordering key; null for an unordered message. */
  partition_key: string | null
  /** The key's counter epoch and the message's number in it (migration 0003); null without a key. */
  partition_epoch: ColumnType<string | null, number | null | undefined, number | null>
  /** The message's number in its key's epoch (migration 0003); null without a key. */
  partition_seq: ColumnType<string | null, number | null | undefined, number | null>
  /** The tenant it was enqueued for, if any. */
  tenant_id: string | null
  /** When it was enqueued. */
  occurred_at: Timestamp
  /** When it is due: a delay or a retry's backoff moves it on, and so does a claim, by its lease. */
  visible_at: Timestamp
  /** Publish attempts spent (an outage spends none). */
  attempts: Generated<number>
  /** Pending, sent or dead. */
  status: Generated<OutboxStatus>
  /** The claim holding the row: a mark applies only while it still matches. */
  lock_token: string | null
  /** When the broker confirmed it; null until sent. */
  published_at: Date | null
  /** Why the last attempt failed, or why it is dead. */
  last_error: string | null
}

/** The `inbox` table (migration 0002): one row per message (or business key) per consumer, the dedupe record. */
export interface InboxTable {
  /** The dedupe key: the message id, or the handler's business key (`InboxRow.key`). */
  message_id: string
  /** The consuming service; the key is unique per consumer. */
  consumer: string
  /** The event type; null when the delivery carried none. */
  type: string | null
  /** The contract version; null when the delivery carried none. */
  version: number | null
  /** The payload; null when the body could not be decoded, or for a row written already processed (a bare dedupe record). */
  payload: Json<unknown> | null
  /** The body as received, kept only when it could not be decoded. */
  raw: string | null
  /** The delivery's application headers. */
  headers: Json<Record<string, string>>
  /** The producer's partition key; null for an unordered message. */
  partition_key: string | null
  /** The message's place in its key's sequence (migration 0004); null for unordered rows. */
  partition_epoch: ColumnType<string | null, number | null | undefined, number | null>
  /** The message's number in its key's epoch (migration 0004); null for unordered rows. */
  partition_seq: ColumnType<string | null, number | null | undefined, number | null>
  /** What the row waits for (migration 0009): its key's last number before it for this consumer; null: seq − 1. */
  partition_after: ColumnType<string | null, number | null | undefined, number | null>
  /** When what the row waits for was enqueued (migration 0010): ms, the producer database's clock. */
  partition_after_at: ColumnType<string | null, number | null | undefined, number | null>
  /** The producer's tenant id, if any. */
  tenant_id: string | null
  /** When it was stored. */
  received_at: Timestamp
  /** When a pending row is due: a retry's backoff moves it on, and so does a claim, by its lease. */
  visible_at: Timestamp
  /** Tries spent so far. */
  attempts: Generated<number>
  /** Pending, processed or dead. */
  status: Generated<InboxStatus>
  /** The claim holding the row: a mark applies only while it still matches. */
  lock_token: string | null
  /** When its handler's transaction committed; null until processed. */
  processed_at: Date | null
  /** Why the last try failed, or why it is dead. */
  last_error: string | null
  /** An ordered duplicate's stand-in (migration 0009): the dedupe key of the row it repeats. */
  stands_in_for: ColumnType<string | null, string | null | undefined, string | null>
}

/** One row per partition key: the last number handed out, and the epoch it counts in. */
export interface PartitionCountersTable {
  /** The producer's partition key. */
  partition_key: string
  /** bigint: read as a string by the drivers; cast where a number is needed. */
  epoch: ColumnType<string, number | undefined, never>
  /** The last number handed out in this epoch (bigint, read as a string). */
  seq: ColumnType<string, number, number>
  /** When a number was last taken: a counter idle long enough may be purged. */
  updated_at: ColumnType<Date, Date | string | undefined, Date | string>
  /** Per routing key, its last message (migration 0009): `{ route: [seq, enqueuedAtMs] }`. */
  routes: ColumnType<Record<string, ReadonlyArray<number>>, string | undefined, string>
  /** `routes` as it was before the last update, written by that update (migration 0009). */
  routes_before: ColumnType<Record<string, ReadonlyArray<number>>, string | undefined, string>
}

/** What a consumer does with a dead ordered message, as its inbox last said (migration 0009). */
export interface InboxConsumersTable {
  /** The consuming service. */
  consumer: string
  /** Its `onOrderedDead`: whether a dead ordered message holds its key's later ones. */
  on_ordered_dead: "block" | "skip"
  /** Cursors last moved before this (ms) may have been purged as idle (migration 0010). */
  cursors_purged_before: ColumnType<string | null, number | null | undefined, number | null>
  /** When its inbox last said so. */
  updated_at: ColumnType<Date, Date | string | undefined, Date | string>
}

/** When a consumer's queue was first bound to a routing pattern (migration 0009). */
export interface InboxBindingsTable {
  /** The consuming service. */
  consumer: string
  /** The routing pattern its queue is bound to. */
  pattern: string
  /** When the binding was first recorded: a predecessor enqueued before it never reached the queue. */
  bound_at: ColumnType<Date, Date | string | undefined, never>
}

/** Per consumer and key: the last number handled. The processor claims only the next. */
export interface InboxCursorsTable {
  /** The consuming service. */
  consumer: string
  /** The producer's partition key. */
  partition_key: string
  /** The epoch of the last message of the key handled (bigint, read as a string). */
  epoch: ColumnType<string, number, number>
  /** The number of the last message of the key handled, in `epoch` (bigint, read as a string). */
  last_seq: ColumnType<string, number, number>
  /** When the cursor last moved: an idle key's cursor may be purged (`txbox purge --idle-keys`). */
  updated_at: ColumnType<Date, Date | string | undefined, Date | string>
}

/** The `txbox_migrations` table: the migrations applied to the schema, with the checksum each had then. */
export interface MigrationsTable {
  /** The migration's number. */
  version: number
  /** The migration's name. */
  name: string
  /** The SQL's checksum when applied: an applied migration that changed since is an error. */
  checksum: string
  /** When it was applied. */
  applied_at: Generated<Date>
}

/** `housekeeping_leases` (migration 0012): one row per task, held by one process at a time. */
export interface HousekeepingLeasesTable {
  /** The task: `outbox.lag`, `outbox.retention`. */
  task: string
  /** The holding process's id (a UUID each relay draws at start). */
  holder: string
  /** When the holder's lease runs out, unless it renews it: then another process may take the task. */
  held_until: Date
}

/** What an archive row has beyond its table's columns (migration 0016). */
export interface ArchivedColumns {
  /** When `txbox partitions drop` moved it out of its partition. */
  archived_at: ColumnType<Date, Date | undefined, never>
}

/** txbox's tables, unqualified; the store binds them to the configured schema with `withSchema`. */
export interface TxboxDatabase {
  /** Messages enqueued for the relay to publish. */
  outbox: OutboxTable
  /** Deliveries seen, per consumer: the dedupe records and the stored rows awaiting the processor. */
  inbox: InboxTable
  /** Per consumer and partition key, the last message handled. */
  inbox_cursors: InboxCursorsTable
  /** When each consumer's queue was first bound to each routing pattern. */
  inbox_bindings: InboxBindingsTable
  /** Each consumer's policy for dead ordered messages. */
  inbox_consumers: InboxConsumersTable
  /** Per partition key, the counter enqueue numbers messages from. */
  partition_counters: PartitionCountersTable
  /** Which process runs each housekeeping task (the lag probe, retention), until when. */
  housekeeping_leases: HousekeepingLeasesTable
  /** Dead outbox rows moved out of a dropped partition (migration 0016), ids unchanged. */
  outbox_archive: OutboxTable & ArchivedColumns
  /** Dead inbox rows moved out of a dropped partition (migration 0016), keys unchanged. */
  inbox_archive: InboxTable & ArchivedColumns
  /** The migrations applied. */
  txbox_migrations: MigrationsTable
}
