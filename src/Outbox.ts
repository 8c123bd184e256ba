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

export type { EnqueuedMessage, EnqueueOptions, EventInput } from "./core/enqueue.ts"
export type { Executor, SqlClient } from "./ports/OutboxWriter.ts"

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
