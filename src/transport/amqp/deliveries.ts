/**
 * Processing one delivery: the handler decides, and the message is acked,
 * retried through a delay queue (retry.ts) or, when the broker dead-lettered
 * it, left in the dead queue for a while.
 */
import type { ConsumeMessage } from "amqplib"
import { Cause, Duration, Effect } from "effect"
import type { Delivery, DeliveryDecision } from "../../ports/Transport.ts"
import { ack, type Generation, requeue } from "./generation.ts"
import { FALLBACK_DELAY_MS, type RetryOptions, retry } from "./retry.ts"
import { deadLetterReason, decodeDelivery } from "./wire.ts"

export type Handle = (delivery: Delivery) => Effect.Effect<DeliveryDecision>

/** A handler that dies is retried after this long (it is a bug, not a transient failure). */
const DEFECT_RETRY: DeliveryDecision = { _tag: "Retry", delayMs: 5_000 }

export interface DeliveryOptions {
  readonly consumer: string
  readonly handle: Handle
  readonly retry: RetryOptions
}

/** A message from the consumer queue: acked, or retried through a delay queue. */
export const processDelivery = (
  options: DeliveryOptions,
  generation: Generation,
  message: ConsumeMessage,
): Effect.Effect<void> =>
  // Combinators, not Effect.gen: once per delivery, and JavaScriptCore kept recompiling the
  // generator body for as long as the consumer ran (core/inboxConsumer.ts says more).
  Effect.suspend(() => {
    const delivery = decodeDelivery(message)
    return Effect.suspend(() => options.handle(delivery)).pipe(
      Effect.catchCause((cause) =>
        // Interrupted handlers stay unsettled; the broker redelivers them.
        Cause.hasInterruptsOnly(cause)
          ? Effect.failCause(cause)
          : Effect.logError(`txbox amqp: handler for ${options.consumer} died; retrying`, cause).pipe(
              Effect.as(DEFECT_RETRY),
            ),
      ),
      Effect.flatMap((decision) => {
        if (decision._tag !== "Ack")
          return retry(options.retry, generation, message, delivery.attempt, decision)
        ack(generation, message)
        return Effect.void
      }),
    )
  })

/** A message the broker dead-lettered: the consumer records it; while it cannot, it stays in the dead queue. */
export const processDeadLettered = (
  options: DeliveryOptions,
  generation: Generation,
  message: ConsumeMessage,
): Effect.Effect<void> =>
  Effect.gen(function* () {
    const delivery = { ...decodeDelivery(message), deadLettered: deadLetterReason(message) }
    const decision = yield* Effect.suspend(() => options.handle(delivery)).pipe(
      Effect.catchCause((cause) =>
        Cause.hasInterruptsOnly(cause)
          ? Effect.failCause(cause)
          : Effect.logError(
              `txbox amqp: handler for ${options.consumer} died on a dead-lettered message`,
              cause,
            ).pipe(Effect.as(DEFECT_RETRY)),
      ),
    )
    if (decision._tag === "Ack") return ack(generation, message)
    yield* Effect.sleep(Duration.millis(Math.min(Math.max(0, decision.delayMs), FALLBACK_DELAY_MS)))
    requeue(generation, message)
  })
