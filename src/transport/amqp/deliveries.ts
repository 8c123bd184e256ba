/**
 * Processing one delivery: the handler decides, and the message is acked,
 * retried through a delay queue (retry.ts) or, when the broker dead-lettered
 * it, left in the dead queue for a while.
 */
import type { ConsumeMessage } from "amqplib"
import { Cause, Duration, Effect } from "effect"
import type { Delivery, DeliveryDecision, HandleMany } from "../../ports/Transport.ts"
import { type BatchedEvent, batchOfOne, decodeBatch, isBatch } from "./batch.ts"
import { ack, type Generation, requeue } from "./generation.ts"
import {
  type CopyResult,
  FALLBACK_DELAY_MS,
  type RetryOptions,
  retry,
  retryCopy,
  settleOriginal,
} from "./retry.ts"
import { deadLetterReason, decodeDelivery } from "./wire.ts"

export type Handle = (delivery: Delivery) => Effect.Effect<DeliveryDecision>

/** A handler that dies is retried after this long (it is a bug, not a transient failure). */
const DEFECT_RETRY: DeliveryDecision = { _tag: "Retry", delayMs: 5_000 }

export interface DeliveryOptions {
  readonly consumer: string
  readonly handle: Handle
  readonly handleMany?: HandleMany | undefined
  readonly retry: RetryOptions
}

/**
 * `handling`'s answer; when it dies, `died` (logged): a bug is retried later, never the end of the
 * consumer. Interrupted handlers stay unsettled; the broker redelivers them.
 */
const orOnDefect = <A>(
  options: DeliveryOptions,
  what: string,
  handling: () => Effect.Effect<A>,
  died: A,
): Effect.Effect<A> =>
  Effect.suspend(handling).pipe(
    Effect.catchCause((cause) =>
      Cause.hasInterruptsOnly(cause)
        ? Effect.failCause(cause)
        : Effect.logError(`txbox amqp: handler for ${options.consumer} died${what}; retrying`, cause).pipe(
            Effect.as(died),
          ),
    ),
  )

/** The handler's decision; a handler that dies is retried later (logged). */
const decide = (
  options: DeliveryOptions,
  delivery: Delivery,
  what: string,
): Effect.Effect<DeliveryDecision> => orOnDefect(options, what, () => options.handle(delivery), DEFECT_RETRY)

/** The events of a batch message, or undefined for a message of one event (binary or structured mode). */
const eventsOf = (message: ConsumeMessage): ReadonlyArray<BatchedEvent> | undefined =>
  isBatch(message.properties?.contentType) ? decodeBatch(message) : undefined

/** A message from the consumer queue: acked, or retried through a delay queue. */
export const processDelivery = (
  options: DeliveryOptions,
  generation: Generation,
  message: ConsumeMessage,
): Effect.Effect<void> =>
  // Combinators, not Effect.gen: once per delivery, and JavaScriptCore kept recompiling the
  // generator body for as long as the consumer ran (core/inboxConsumer.ts says more).
  Effect.suspend(() => {
    const events = eventsOf(message)
    if (events !== undefined) return processBatch(options, generation, message, events)
    const delivery = decodeDelivery(message)
    return Effect.flatMap(decide(options, delivery, ""), (decision) => {
      if (decision._tag !== "Ack")
        return retry(options.retry, generation, message, delivery.attempt, decision)
      ack(generation, message)
      return Effect.void
    })
  })

/** The copy of one event of a batch for its retry: a batch of one, with that event's id. */
const copyOf = (message: ConsumeMessage, event: BatchedEvent): ConsumeMessage => ({
  ...message,
  content: batchOfOne(event.event),
  properties: { ...message.properties, messageId: event.delivery.messageId ?? message.properties.messageId },
})

/** The worst of the copies' results: the original is acked only when every copy is confirmed. */
const worst = (results: ReadonlyArray<CopyResult>): CopyResult =>
  results.includes("gone") ? "gone" : results.includes("requeue") ? "requeue" : "copied"

/**
 * A batch message: each event handled as if it had come alone (the inbox shares transactions
 * between those that arrive together); an event to retry is copied alone to its delay queue; the
 * message is acked once every event is settled. A channel lost meanwhile leaves it unacked: the
 * broker redelivers the whole batch, and the events already handled are duplicates the inbox knows.
 */
const processBatch = (
  options: DeliveryOptions,
  generation: Generation,
  message: ConsumeMessage,
  events: ReadonlyArray<BatchedEvent>,
): Effect.Effect<void> => {
  const copies = (decisions: ReadonlyArray<DeliveryDecision>): Effect.Effect<void> => {
    const retries = events.flatMap((event, i) => {
      const decision = decisions[i]!
      return decision._tag === "Retry" ? [{ event, decision }] : []
    })
    if (retries.length === 0) {
      ack(generation, message)
      return Effect.void
    }
    return Effect.forEach(
      retries,
      ({ event, decision }) =>
        retryCopy(options.retry, generation, copyOf(message, event), event.delivery.attempt, decision),
      { concurrency: "unbounded" },
    ).pipe(Effect.map((results) => settleOriginal(generation, message, worst(results))))
  }
  const { handleMany } = options
  if (handleMany !== undefined) {
    const deliveries = events.map((event) => event.delivery)
    return Effect.flatMap(
      orOnDefect(
        options,
        "",
        () => handleMany(deliveries),
        deliveries.map(() => DEFECT_RETRY),
      ),
      copies,
    )
  }
  return Effect.forEach(events, (event) => decide(options, event.delivery, ""), {
    concurrency: "unbounded",
  }).pipe(Effect.flatMap(copies))
}

/** A message the broker dead-lettered: the consumer records it; while it cannot, it stays in the dead queue. */
export const processDeadLettered = (
  options: DeliveryOptions,
  generation: Generation,
  message: ConsumeMessage,
): Effect.Effect<void> =>
  Effect.gen(function* () {
    const deadLettered = deadLetterReason(message)
    const deliveries = eventsOf(message)?.map((event) => event.delivery) ?? [decodeDelivery(message)]
    const decisions = yield* Effect.forEach(
      deliveries,
      (delivery) => decide(options, { ...delivery, deadLettered }, " on a dead-lettered message"),
      { concurrency: "unbounded" },
    )
    const retries = decisions.flatMap((d) => (d._tag === "Retry" ? [d.delayMs] : []))
    if (retries.length === 0) return ack(generation, message)
    yield* Effect.sleep(Duration.millis(Math.min(Math.max(0, Math.min(...retries)), FALLBACK_DELAY_MS)))
    requeue(generation, message)
  })
