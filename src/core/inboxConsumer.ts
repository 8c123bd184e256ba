/**
 * What the inbox does with one delivery, in either mode, ending in the
 * transport's decision (ack, or retry after a delay).
 *
 * - idempotent: one transaction inserts the inbox row (the key is the dedupe)
 *   and runs the handler; commit, then ack. A duplicate finds the row and is
 *   acked without running the handler. Under load, deliveries share a
 *   transaction (one insert for their rows, handlers in turn), with a
 *   transaction each as the fallback when one of them fails.
 * - store-then-process: persist the delivery (batched with concurrent ones)
 *   and ack; the processor (`inboxProcessor.ts`) runs the handler later.
 *
 * Failures go through the one verdict rule (`verdict.ts`): a handler's failure
 * spends an attempt; a database outage does not; what can never be handled
 * is recorded dead at once.
 */
import { Cause, Effect, Exit, Metric } from "effect"
import type { Registry } from "../Contract.ts"
import { StoreError } from "../Errors.ts"
import * as Metrics from "../Metrics.ts"
import type { InboxRow, InboxStoreShape } from "../ports/InboxStore.ts"
import type { Delivery, DeliveryDecision, MessagingIdentity } from "../ports/Transport.ts"
import type { RetryPolicy } from "../Retry.ts"
import { makeBatcher } from "./batcher.ts"
import { bounded } from "./bounded.ts"
import {
  type Decoded,
  decodeDelivery,
  type HandlerIndex,
  positionOfDelivery,
  tombstoneOf,
} from "./decodeDelivery.ts"
import { describe, HandlerFailed, nowRunning, runHandler, timedOut, watchdog } from "./handler.ts"
import { parseKeyRoutes, type RouteBinding, withAfter } from "./keyRoutes.ts"
import { PARTITION_ROUTES_HEADER } from "./position.ts"
import { FailedAt, runShared } from "./sharedTransaction.ts"
import { storableRow } from "./storable.ts"
import { makeTransactionSize } from "./transactionSize.ts"
import { type Failure, outage, permanent, transient, verdictFor } from "./verdict.ts"

export interface InboxCounters {
  processed: number
  duplicates: number
  retried: number
  dead: number
  stored: number
  /** Clock time (ms) of the last delivery or row handled. */
  lastActivityAt: number | undefined
}

export const makeInboxCounters = (): InboxCounters => ({
  processed: 0,
  duplicates: 0,
  retried: 0,
  dead: 0,
  stored: 0,
  lastActivityAt: undefined,
})

export interface InboxParts {
  readonly consumer: string
  readonly store: InboxStoreShape
  readonly registry: Registry
  readonly handlers: HandlerIndex
  readonly retry: RetryPolicy
  /** How long a handler may run before it counts as failed. */
  readonly handlerTimeoutMs: number
  /** Idempotent mode: inbox transactions open at once; deliveries arriving while all are busy share the next. */
  readonly transactions: number
  readonly counters: InboxCounters
  /** Runs after the inbox transaction committed and before the broker ack. */
  readonly afterCommit: ((delivery: Delivery) => Effect.Effect<void>) | undefined
  /** The transport's messaging identity, for the handler spans' attributes. */
  readonly messaging?: MessagingIdentity | undefined
  /** The consumer queue's bindings and when each began: what an ordered message waits for depends on them. */
  readonly bindings: Effect.Effect<ReadonlyArray<RouteBinding>, StoreError>
}

export const deadInbox = Metric.withAttributes(Metrics.dead, { side: "inbox" })
export const retriedInbox = Metric.withAttributes(Metrics.retried, { side: "inbox" })

/** How a failed try reads to the verdict rule: our own database away is an outage; anything else is the message's trouble. */
export const failureOf = (error: HandlerFailed | StoreError): Failure => {
  if (error instanceof HandlerFailed) return transient(error.error)
  if (error.retryable) return outage(error.message)
  // The message holds what the database can never store: dead now, not after maxAttempts.
  if (error.reason === "data") return permanent(error.message)
  // The database refused our own statement for good (a bug, a schema drift), or the handler
  // swallowed a failed statement: count it, so the message ends dead instead of looping.
  return transient(error.message)
}

/** Our own database away: every message of a shared transaction is retried as it is. */
export const isOutage = (error: HandlerFailed | StoreError): boolean =>
  error instanceof StoreError && error.retryable

const ACK: DeliveryDecision = { _tag: "Ack" }

/**
 * What a delivery's own statements (insert, probe, commit) may take on top of
 * the handler's time: beyond that the connection is taken for dead (a
 * postgres.js socket whose server restarted can leave a query hanging) and the
 * delivery is retried as an outage.
 */
export const STATEMENTS_MS = 10_000

/**
 * A shared transaction that outlived its bound (`watchdog`): the handler that
 * was running failed it, or, when none was, a statement did not answer.
 */
export const transactionTimedOut = (
  index: number | undefined,
  handlerTimeoutMs: number,
): FailedAt<HandlerFailed> | StoreError =>
  index === undefined
    ? new StoreError({ reason: "connection", operation: "Inbox.transaction", cause: "no answer in time" })
    : new FailedAt(index, timedOut(handlerTimeoutMs))

/** Deliveries handled in one transaction at most (idempotent mode). */
const MAX_TOGETHER = 64
/**
 * A batch message's events go to free transactions in shares of this many or more: their handlers
 * run one after another in a transaction, so forty in one kept the last waiting for the other
 * thirty-nine (commit → handler p99 at 1,000 msg/s), while a share this size still spreads a
 * transaction's own round trips.
 */
const MIN_SHARE = 12

type Ready = Extract<Decoded, { readonly _tag: "Ok" }>
type Handled = "processed" | "duplicate"

/** What every path does when a delivery fails or ends: count it, record it dead, decide the retry. */
const makeOutcomes = (p: InboxParts) => {
  const touch = Effect.clockWith((clock) =>
    Effect.sync(() => {
      p.counters.lastActivityAt = clock.currentTimeMillisUnsafe()
    }),
  )

  const recordDead = (deadRow: InboxRow) => {
    // The error text may quote what the producer sent (a parser's message), NULs included.
    const row = storableRow(deadRow)
    return p.store.insertDead([row]).pipe(
      bounded("Inbox.insertDead", STATEMENTS_MS),
      // A payload jsonb refuses (a \u0000 escape): keep it as text in `raw` instead.
      Effect.catchIf(
        (error) => error.reason === "data",
        () => p.store.insertDead([{ ...row, payload: null, raw: row.raw ?? row.payload }]),
      ),
      Effect.tap(() =>
        Effect.sync(() => {
          p.counters.dead++
        }).pipe(Effect.andThen(touch), Effect.andThen(Metric.update(deadInbox, 1))),
      ),
      Effect.as(ACK),
    )
  }

  /**
   * The transport's decision after the try numbered `delivery.attempt` failed:
   * retry after the backoff (attempt spent or not), or record the row dead
   * and ack. `row` is undefined when the delivery was not decoded yet, which
   * only an outage can interrupt (an outage is never dead).
   */
  const afterFailure = (
    row: InboxRow | undefined,
    delivery: Delivery,
    failure: Failure,
  ): Effect.Effect<DeliveryDecision, StoreError> =>
    Effect.gen(function* () {
      const verdict = verdictFor(delivery.attempt - 1, failure, p.retry)
      if (verdict._tag === "Done") return ACK
      if (verdict._tag === "Dead" && row !== undefined) {
        return yield* recordDead({ ...row, attempts: delivery.attempt, lastError: verdict.error })
      }
      if (failure._tag === "Outage") {
        yield* Effect.logWarning(`inbox ${p.consumer}: ${failure.error}; retrying delivery`)
      } else {
        p.counters.retried++
        yield* Metric.update(retriedInbox, 1)
      }
      const delayMs = verdict._tag === "Retry" ? verdict.delayMs : 1000
      const spendsAttempt = verdict._tag === "Retry" ? verdict.spendsAttempt : true
      return { _tag: "Retry", delayMs, spendsAttempt } as const
    })

  /** Our database away while deciding (decoding, recording dead, storing): bring the message back later, attempt unspent. */
  const outageDecision = (delivery: Delivery, error: StoreError): Effect.Effect<DeliveryDecision> =>
    afterFailure(undefined, delivery, outage(error.message)).pipe(
      Effect.catch(() => Effect.succeed({ _tag: "Retry", delayMs: 1000, spendsAttempt: false } as const)),
    )

  /**
   * The broker gave up on the message (it came back to the queue more than the
   * delivery limit allows): record it dead with the broker's reason, unhandled.
   * A message the inbox already processed keeps its processed row.
   */
  const deadLettered = (delivery: Delivery, reason: string): Effect.Effect<DeliveryDecision> =>
    Effect.gen(function* () {
      const decoded = yield* decodeDelivery(p.registry, p.handlers, p.consumer, delivery, delivery.attempt)
      const why = `dead-lettered by the broker: ${reason}`
      return yield* recordDead({
        ...decoded.row,
        lastError: decoded._tag === "Bad" ? `${why}; ${decoded.row.lastError}` : why,
      })
    }).pipe(Effect.catch((error: StoreError) => outageDecision(delivery, error)))

  // Combinators, not Effect.gen, on the per-delivery path: JavaScriptCore compiled these generator
  // bodies again and again for as long as the inbox ran (BUN_JSC_reportCompileTimes: a twentieth
  // of the inbox's CPU at 1,000 msg/s in bench/cost.ts).
  const committed = (delivery: Delivery): Effect.Effect<DeliveryDecision> =>
    p.afterCommit ? Effect.as(Effect.andThen(touch, p.afterCommit(delivery)), ACK) : Effect.as(touch, ACK)

  return { touch, recordDead, afterFailure, outageDecision, deadLettered, committed }
}

type Outcomes = ReturnType<typeof makeOutcomes>

/** Store-then-process: persist the delivery (batched with concurrent ones) and ack. */
const makeStoreThenProcess = (p: InboxParts, o: Outcomes) => {
  const { recordDead, outageDecision, deadLettered, committed } = o
  // One INSERT for the batch; if the database refuses a value in it, row by row, so only the
  // offending delivery is turned away (and recorded dead) while the others are stored.
  const storeBatcher = makeBatcher<InboxRow, number, StoreError>((rows) =>
    p.store.insertPending(rows).pipe(
      Effect.map((n) => rows.map(() => ({ ok: true, value: n }) as const)),
      Effect.catchIf(
        (error) => error.reason === "data" && rows.length > 1,
        () =>
          Effect.forEach(rows, (row) =>
            p.store.insertPending([row]).pipe(
              Effect.map((value) => ({ ok: true, value }) as const),
              Effect.catch((error) => Effect.succeed({ ok: false, error } as const)),
            ),
          ),
      ),
    ),
  )

  const storeThenProcess = (delivery: Delivery): Effect.Effect<DeliveryDecision> =>
    Effect.gen(function* () {
      if (delivery.deadLettered !== undefined) return yield* deadLettered(delivery, delivery.deadLettered)
      // A tombstone (the producer's relay gave up on this keyed message) only holds its place.
      const tombstone = tombstoneOf(p.consumer, delivery)
      // Stored with no tries made: the processor's first run is attempt 1.
      const decoded =
        tombstone === undefined
          ? yield* decodeDelivery(p.registry, p.handlers, p.consumer, delivery, 0)
          : undefined
      const received = decoded === undefined ? tombstone! : decoded.row
      const at = received.position
      // An ordered message that can never be handled is stored all the same and goes dead when its
      // turn comes: dead before its turn, under onOrderedDead "skip" it would let its successors
      // pass predecessors still on their way.
      if (decoded?._tag === "Bad" && at == null) return yield* recordDead({ ...received, attempts: 1 })
      const row =
        at == null
          ? received
          : {
              ...received,
              position: withAfter(
                at,
                parseKeyRoutes(delivery.headers[PARTITION_ROUTES_HEADER]),
                yield* p.bindings,
              ),
            }
      const stored = yield* Effect.result(
        storeBatcher.submit(row).pipe(bounded("Inbox.store", STATEMENTS_MS)),
      )
      if (stored._tag === "Failure") {
        if (stored.failure.reason !== "data") return yield* outageDecision(delivery, stored.failure)
        return yield* recordDead({ ...received, attempts: 1, lastError: stored.failure.message })
      }
      p.counters.stored++
      return yield* committed(delivery)
    }).pipe(Effect.catch((error: StoreError) => outageDecision(delivery, error)))

  return storeThenProcess
}

/** Idempotent: the inbox row and the handler in one transaction, shared by deliveries that arrive together. */
const makeIdempotent = (
  p: InboxParts,
  o: Outcomes,
  storeThenProcess: (delivery: Delivery) => Effect.Effect<DeliveryDecision>,
) => {
  const { recordDead, afterFailure, outageDecision, deadLettered, committed } = o
  /**
   * One transaction for deliveries handled together: their rows inserted in
   * one statement (a key already there is a duplicate), then each new one's
   * handler in turn. It commits or fails as a whole.
   */
  const handleTogether = (
    items: ReadonlyArray<Ready>,
  ): Effect.Effect<ReadonlyArray<Handled>, FailedAt<HandlerFailed> | StoreError> =>
    watchdog(
      (running) =>
        p.store.transaction(
          (tx) => {
            const outcomes: Handled[] = []
            // The handlers of the fresh rows in turn, from `from` on.
            const handleFrom = (
              fresh: ReadonlyArray<boolean>,
              from: number,
            ): Effect.Effect<ReadonlyArray<Handled>, FailedAt<HandlerFailed> | StoreError> => {
              let i = from
              while (i < items.length && fresh[i] !== true) {
                outcomes.push("duplicate")
                i++
              }
              if (i === items.length) return Effect.succeed(outcomes)
              const at = i
              const item = items[at]!
              return nowRunning(running, at).pipe(
                Effect.andThen(
                  runHandler(
                    p.consumer,
                    item.handler,
                    item.payload,
                    item.envelope,
                    tx.trx,
                    undefined,
                    p.messaging,
                  ),
                ),
                Effect.mapError((error) => new FailedAt(at, error)),
                Effect.andThen(nowRunning(running, -1)),
                Effect.flatMap(() => {
                  outcomes.push("processed")
                  return handleFrom(fresh, at + 1)
                }),
              )
            }
            const inserted: Effect.Effect<ReadonlyArray<boolean>, StoreError> = items.length === 1
              ? Effect.map(tx.insertProcessed(items[0]!.row), (fresh) => [fresh])
              : tx.insertProcessedAll(items.map((item) => item.row))
            return Effect.flatMap(inserted, (fresh) => handleFrom(fresh, 0))
          },
          // The server cancels a handler's statement stuck past the handler's time (a row lock
          // held elsewhere), so the rollback is not queued behind it holding the connection.
          { statementTimeoutMs: p.handlerTimeoutMs },
        ),
      p.handlerTimeoutMs,
      STATEMENTS_MS,
      (index) => transactionTimedOut(index, p.handlerTimeoutMs),
    )

  // Deliveries that arrive while every transaction is busy share the next one; what one failing
  // handler does to the others is `sharedTransaction.ts`'s rule. Fewer share one for a while after
  // a handler failed one (`transactionSize.ts`): the others of a rolled-back transaction run again.
  const together = makeTransactionSize((error) => error instanceof HandlerFailed, MAX_TOGETHER)
  const handleBatcher = makeBatcher<Ready, Handled, HandlerFailed | StoreError>(
    (items) =>
      Effect.map(runShared(items, handleTogether, isOutage), (results) => {
        // A delivery alone says nothing about sharing.
        if (items.length > 1) together.settle(results)
        return results
      }),
    { concurrency: p.transactions, maxSize: together.current, minShare: MIN_SHARE },
  )

  const handled = (delivery: Delivery, outcome: Handled): Effect.Effect<DeliveryDecision> => {
    if (outcome === "duplicate") {
      p.counters.duplicates++
      return Effect.andThen(Metric.update(Metrics.duplicates, 1), committed(delivery))
    }
    p.counters.processed++
    return Effect.andThen(Metric.update(Metrics.processed, 1), committed(delivery))
  }

  const handleDecoded = (
    delivery: Delivery,
    decoded: Decoded,
  ): Effect.Effect<DeliveryDecision, StoreError> => {
    if (decoded._tag === "Bad") return recordDead(decoded.row)
    if (decoded._tag === "Failed") return afterFailure(decoded.row, delivery, transient(decoded.error))
    return handleBatcher.submit(decoded).pipe(
      // A defect in the handling (a bug of ours or a driver's) is this message's failure: an
      // attempt spent, dead after maxAttempts, not a retry without end.
      Effect.catchDefect((defect) => Effect.fail(new HandlerFailed(`died: ${describe(defect)}`))),
      Effect.matchEffect({
        onFailure: (error) => afterFailure(decoded.row, delivery, failureOf(error)),
        onSuccess: (outcome) => handled(delivery, outcome),
      }),
    )
  }

  const idempotent = (delivery: Delivery): Effect.Effect<DeliveryDecision> => {
    if (delivery.deadLettered !== undefined) return deadLettered(delivery, delivery.deadLettered)
    // An ordered message may arrive before its predecessor: it is stored, and the processor
    // runs it when its turn comes (store-then-process for it, whatever the mode).
    if (positionOfDelivery(delivery) !== undefined) return storeThenProcess(delivery)
    return decodeDelivery(p.registry, p.handlers, p.consumer, delivery, delivery.attempt).pipe(
      Effect.flatMap((decoded) => handleDecoded(delivery, decoded)),
      Effect.catch((error: StoreError) => outageDecision(delivery, error)),
    )
  }

  return { idempotent, handleDecoded, handled, handleBatcher }
}

type Idempotent = ReturnType<typeof makeIdempotent>

/** Idempotent, for the deliveries of one batch message at once. */
const makeIdempotentMany = (p: InboxParts, o: Outcomes, i: Idempotent) => {
  const { afterFailure, outageDecision } = o
  const { idempotent, handleDecoded, handled, handleBatcher } = i
  /** A batcher's answer for one item, as handleDecoded reads it. */
  const settle = (
    delivery: Delivery,
    decoded: Ready,
    exit: Exit.Exit<Handled, HandlerFailed | StoreError>,
  ): Effect.Effect<DeliveryDecision> => {
    if (Exit.isSuccess(exit)) return handled(delivery, exit.value)
    // Interrupted (shutting down): unsettled, the broker redelivers it.
    if (Cause.hasInterruptsOnly(exit.cause)) return Effect.failCause(exit.cause as Cause.Cause<never>)
    const error = Cause.findErrorOption(exit.cause)
    // A defect in the handling (a bug of ours or a driver's) is this message's failure, as in handleDecoded.
    const failure =
      error._tag === "Some" ? error.value : new HandlerFailed(`died: ${describe(Cause.squash(exit.cause))}`)
    return afterFailure(decoded.row, delivery, failureOf(failure)).pipe(
      Effect.catch((e: StoreError) => outageDecision(delivery, e)),
    )
  }

  /**
   * The deliveries of one batch message: decoded in turn, the handleable ones submitted to the
   * shared transactions together (no fiber per delivery), then settled in turn. What takes the
   * per-delivery path (dead-lettered, ordered) takes it, concurrently.
   */
  const idempotentMany = (
    deliveries: ReadonlyArray<Delivery>,
  ): Effect.Effect<ReadonlyArray<DeliveryDecision>> =>
    Effect.suspend(() => {
      const decisions = new Array<DeliveryDecision>(deliveries.length)
      const together: Array<{ readonly at: number; readonly decoded: Ready }> = []
      const alone: number[] = []
      const decide = (at: number) => (decision: DeliveryDecision) => {
        decisions[at] = decision
      }
      const decodeAll = Effect.forEach(
        deliveries,
        (delivery, at): Effect.Effect<void> => {
          if (delivery.deadLettered !== undefined || positionOfDelivery(delivery) !== undefined) {
            alone.push(at)
            return Effect.void
          }
          return decodeDelivery(p.registry, p.handlers, p.consumer, delivery, delivery.attempt).pipe(
            Effect.flatMap((decoded): Effect.Effect<void, StoreError> => {
              if (decoded._tag !== "Ok") return Effect.map(handleDecoded(delivery, decoded), decide(at))
              together.push({ at, decoded })
              return Effect.void
            }),
            Effect.catch((error: StoreError) => Effect.map(outageDecision(delivery, error), decide(at))),
          )
        },
        { discard: true },
      )
      const handleTogether = (): Effect.Effect<void> =>
        together.length === 0
          ? Effect.void
          : Effect.flatMap(handleBatcher.submitAll(together.map((t) => t.decoded)), (exits) =>
              Effect.forEach(
                exits,
                (exit, i) => {
                  const { at, decoded } = together[i]!
                  return Effect.map(settle(deliveries[at]!, decoded, exit), decide(at))
                },
                { discard: true },
              ),
            )
      const handleAlone = (): Effect.Effect<void> =>
        alone.length === 0
          ? Effect.void
          : Effect.forEach(alone, (at) => Effect.map(idempotent(deliveries[at]!), decide(at)), {
              concurrency: "unbounded",
              discard: true,
            })
      // Both sets at once; the per-delivery path forks only for what takes it.
      return decodeAll.pipe(
        Effect.andThen(
          Effect.suspend(() =>
            alone.length === 0
              ? handleTogether()
              : Effect.all([handleTogether(), handleAlone()], { concurrency: "unbounded", discard: true }),
          ),
        ),
        Effect.as(decisions),
      )
    })

  return idempotentMany
}

export const makeConsumer = (p: InboxParts) => {
  const outcomes = makeOutcomes(p)
  const storeThenProcess = makeStoreThenProcess(p, outcomes)
  const idempotent = makeIdempotent(p, outcomes, storeThenProcess)
  return {
    idempotent: idempotent.idempotent,
    idempotentMany: makeIdempotentMany(p, outcomes, idempotent),
    storeThenProcess,
  }
}
