/**
 * The producer side: write events into the outbox inside the caller's own
 * transaction, so they commit or roll back with the business data.
 *
 * This module puts two parts together: the validation and rows of
 * `core/enqueue.ts` and the SQL statement of `storage/sql/enqueue.ts`
 * (the `WriteOutbox` port).
 */
import type { Effect } from "effect"
import type { AnyContract, InputOf } from "./Contract.ts"
import { type EnqueuedMessage, type EnqueueOptions, type EventInput, makeEnqueue } from "./core/enqueue.ts"
import type { ConfigError, StoreError, ValidationError } from "./Errors.ts"
import type { Executor } from "./ports/OutboxWriter.ts"
import { writeOutbox } from "./storage/sql/enqueue.ts"
import {
  outboxTransaction,
  type TransactionOf,
  type TransactionTarget,
} from "./storage/sql/outboxTransaction.ts"

export type { EnqueuedMessage, EnqueueOptions, EventInput } from "./core/enqueue.ts"
export type { Executor, SqlClient } from "./ports/OutboxWriter.ts"
export type { ClientOf, SqlPool, TransactionOf, TransactionTarget } from "./storage/sql/outboxTransaction.ts"

const sql = makeEnqueue(writeOutbox)

/**
 * Writes many events with one INSERT in the caller's transaction. Every
 * payload is validated first: one invalid event fails the call and nothing is
 * written.
 */
export const enqueueMany: (
  executor: Executor,
  events: ReadonlyArray<EventInput>,
) => Effect.Effect<ReadonlyArray<EnqueuedMessage>, ValidationError | StoreError | ConfigError> =
  sql.enqueueMany

/**
 * Writes one event in the caller's transaction. See `enqueueMany`. The schema
 * is the store layer's (`TxboxSchema`), so run it under the same layer as the
 * relay, or provide `TxboxSchema` when txbox's tables are not in "txbox".
 */
export const enqueue: <C extends AnyContract>(
  executor: Executor,
  contract: C,
  payload: InputOf<C>,
  options?: EnqueueOptions,
) => Effect.Effect<EnqueuedMessage, ValidationError | StoreError | ConfigError> = sql.enqueue

/**
 * Runs `body` in a transaction that txbox opens on `db` (your Kysely, or a node-postgres pool or
 * client) and commits: the rows of every `Outbox.enqueue(trx, …)` in it go to the server with the
 * COMMIT, in one round trip, instead of a round trip each. Rolls back when `body` fails or is
 * interrupted. Fails with the body's error, or `StoreError` when BEGIN or the COMMIT (with the
 * rows) fails, and then nothing was committed.
 *
 * ```ts
 * const placeOrder = (order: Order) =>
 *   Outbox.transaction(db, (trx) =>
 *     Effect.gen(function* () {
 *       yield* Effect.tryPromise(() => trx.insertInto("orders").values(order).execute())
 *       yield* Outbox.enqueue(trx, OrderPlaced, { orderId: order.id, total: order.total })
 *     }),
 *   )
 * ```
 *
 * Fine print: enqueue still validates at once (a `ValidationError` there); a row the database
 * refuses (a duplicate `messageId`) fails the commit instead of the enqueue call. Keyed events
 * (`partitionKey`) go with the COMMIT too, numbered at the end (one in the COMMIT's own text,
 * several in a round trip just before): same-key transactions wait for each other only from
 * there. With a Kysely, `trx` is that Kysely on the transaction's one connection
 * (`db.connection()`), not a `Transaction`; the body must not commit or roll back itself.
 */
export const transaction: <T extends TransactionTarget, A, E = never, R = never>(
  db: T,
  body: (trx: TransactionOf<T>) => Effect.Effect<A, E, R>,
) => Effect.Effect<A, E | StoreError, R> = outboxTransaction
