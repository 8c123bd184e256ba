/**
 * What `Outbox.enqueue` needs from storage: validated rows written into the
 * outbox through the caller's own executor, in the caller's transaction.
 * The SQL writer is `storage/sql/enqueue.ts`; `Outbox.ts` puts it together
 * with the validation in `core/enqueue.ts`.
 */
import type { Effect } from "effect"
import type { Kysely, Transaction } from "kysely"
import type { StoreError } from "../Errors.ts"

/** Any Kysely executor: the caller's transaction (the point) or, for one-off writes, the pool. */
// biome-ignore lint/suspicious/noExplicitAny: enqueue joins whatever database the caller describes
export type Executor = Kysely<any> | Transaction<any>

/** One validated outbox row as enqueue hands it to the writer, before any per-key numbering. */
export interface EnqueueRow {
  readonly id: string
  readonly type: string
  readonly version: number
  /** JSON text. */
  readonly payload: string
  /** JSON text of a string → string object. */
  readonly headers: string
  readonly routing_key: string | null
  readonly partition_key: string | null
  readonly tenant_id: string | null
  /** An absolute due time; null: the database's now() plus `delay_ms`. */
  readonly visible_at: Date | null
  /** Milliseconds after the database's now() (0: due at once); ignored when `visible_at` is set. */
  readonly delay_ms: number
}

/**
 * Writes `rows` (at least one) into `schema`'s outbox through `executor`:
 * numbers the keyed rows in their keys' sequences, then inserts them.
 * `schema` is already a validated identifier.
 */
export type WriteOutbox = (
  executor: Executor,
  schema: string,
  rows: ReadonlyArray<EnqueueRow>,
) => Effect.Effect<void, StoreError>
