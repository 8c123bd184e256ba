/** Kysely types for txbox's tables (migrations/*.sql are the source of truth): the shape every SQL statement, store adapter and enqueue is typed against. */
import type { ColumnType, Generated } from "kysely"

type Timestamp = ColumnType<Date, Date | string | undefined, Date | string>
type Json<T> = ColumnType<T, string | T | undefined, string | T>

export type OutboxStatus = "pending" | "sent" | "dead"
export type InboxStatus = "pending" | "processed" | "dead"

export interface OutboxTable {
  id: string
  type: string
  version: number
  payload: Json<unknown>
  headers: Json<Record<string, string>>
  routing_key: string | null
  partition_key: string | null
  /** The key's counter epoch and the message's number in it (migration 0003); null without a key. */
  partition_epoch: ColumnType<string | null, number | null | undefined, number | null>
  partition_seq: ColumnType<string | null, number | null | undefined, number | null>
  tenant_id: string | null
  occurred_at: Timestamp
  visible_at: Timestamp
  attempts: Generated<number>
  status: Generated<OutboxStatus>
  lock_token: string | null
  published_at: Date | null
  last_error: string | null
}

export interface InboxTable {
  message_id: string
  consumer: string
  type: string | null
  version: number | null
  payload: Json<unknown> | null
  raw: string | null
  headers: Json<Record<string, string>>
  partition_key: string | null
  /** The message's place in its key's sequence (migration 0004); null for unordered rows. */
  partition_epoch: ColumnType<string | null, number | null | undefined, number | null>
  partition_seq: ColumnType<string | null, number | null | undefined, number | null>
  /** What the row waits for (migration 0009): its key's last number before it for this consumer; null: seq − 1. */
  partition_after: ColumnType<string | null, number | null | undefined, number | null>
  /** When what the row waits for was enqueued (migration 0010): ms, the producer database's clock. */
  partition_after_at: ColumnType<string | null, number | null | undefined, number | null>
  tenant_id: string | null
  received_at: Timestamp
  visible_at: Timestamp
  attempts: Generated<number>
  status: Generated<InboxStatus>
  lock_token: string | null
  processed_at: Date | null
  last_error: string | null
  /** An ordered duplicate's stand-in (migration 0009): the dedupe key of the row it repeats. */
  stands_in_for: ColumnType<string | null, string | null | undefined, string | null>
}

/** One row per partition key: the last number handed out, and the epoch it counts in. */
export interface PartitionCountersTable {
  partition_key: string
  /** bigint: read as a string by the drivers; cast where a number is needed. */
  epoch: ColumnType<string, number | undefined, never>
  seq: ColumnType<string, number, number>
  updated_at: ColumnType<Date, Date | string | undefined, Date | string>
  /** Per routing key, its last message (migration 0009): `{ route: [seq, enqueuedAtMs] }`. */
  routes: ColumnType<Record<string, ReadonlyArray<number>>, string | undefined, string>
  /** `routes` as it was before the last update, written by that update (migration 0009). */
  routes_before: ColumnType<Record<string, ReadonlyArray<number>>, string | undefined, string>
}

/** What a consumer does with a dead ordered message, as its inbox last said (migration 0009). */
export interface InboxConsumersTable {
  consumer: string
  on_ordered_dead: "block" | "skip"
  /** Cursors last moved before this (ms) may have been purged as idle (migration 0010). */
  cursors_purged_before: ColumnType<string | null, number | null | undefined, number | null>
  updated_at: ColumnType<Date, Date | string | undefined, Date | string>
}

/** When a consumer's queue was first bound to a routing pattern (migration 0009). */
export interface InboxBindingsTable {
  consumer: string
  pattern: string
  bound_at: ColumnType<Date, Date | string | undefined, never>
}

/** Per consumer and key: the last number handled. The processor claims only the next. */
export interface InboxCursorsTable {
  consumer: string
  partition_key: string
  epoch: ColumnType<string, number, number>
  last_seq: ColumnType<string, number, number>
  updated_at: ColumnType<Date, Date | string | undefined, Date | string>
}

export interface MigrationsTable {
  version: number
  name: string
  checksum: string
  applied_at: Generated<Date>
}

/** txbox's tables, unqualified; the store binds them to the configured schema with `withSchema`. */
export interface TxboxDatabase {
  outbox: OutboxTable
  inbox: InboxTable
  inbox_cursors: InboxCursorsTable
  inbox_bindings: InboxBindingsTable
  inbox_consumers: InboxConsumersTable
  partition_counters: PartitionCountersTable
  txbox_migrations: MigrationsTable
}
