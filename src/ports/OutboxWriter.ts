/**
 * What `Outbox.enqueue` needs from storage: validated rows written into the
 * outbox through the caller's own executor, in the caller's transaction.
 * The SQL writer is `storage/sql/enqueue.ts`; `Outbox.ts` puts it together
 * with the validation in `core/enqueue.ts`.
 */
import type { Effect } from "effect"
import type { Kysely, Transaction } from "kysely"
import type { StoreError } from "../Errors.ts"

/**
 * A driver's client with node-postgres's `query(text, values)`: a `pg` `PoolClient` or `Client`
 * between the caller's `BEGIN` and `COMMIT` (or, for one-off writes, a `pg.Pool`).
 */
export interface SqlClient {
  /** Runs `text` with `values` for its `$1`, `$2`, … parameters; resolves with the rows. */
  // biome-ignore lint/suspicious/noExplicitAny: node-postgres types its values as any[]
  query(text: string, values?: any[]): Promise<{ readonly rows: ReadonlyArray<any> }>
}

/**
 * Where enqueue writes: any Kysely executor, the caller's transaction (the point) or, for one-off
 * writes, the pool; or a node-postgres client in the caller's own transaction (no Kysely on the
 * producer's path at all).
 */
// biome-ignore lint/suspicious/noExplicitAny: enqueue joins whatever database the caller describes
export type Executor = Kysely<any> | Transaction<any> | SqlClient

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
