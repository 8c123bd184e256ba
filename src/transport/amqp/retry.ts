/**
 * Retrying a delivery: a copy with the next attempt number goes to the delay
 * queue of its attempt (topology.ts), and the original is acked once the
 * broker confirms the copy. When no delay queue can take it, the copy goes
 * back to the consumer queue after an in-memory delay instead.
 */
import type { ConsumeMessage } from "amqplib"
import { Cause, Duration, Effect, Exit } from "effect"
import { describeCause, type TransportError } from "../../Errors.ts"
import type { DeliveryDecision, PublishOutcome } from "../../ports/Transport.ts"
import type { Connection } from "./connection.ts"
import { ack, type Generation, requeue } from "./generation.ts"
import { declareQueue, delayQueueArguments, delayQueueName, onOwnChannel } from "./topology.ts"
import { retryCopyOptions } from "./wire.ts"

/**
 * When a retry cannot be scheduled through a delay queue, wait at most this
 * long in memory before sending the message back to the consumer queue.
 */
export const FALLBACK_DELAY_MS = 5_000

/** Declares the delay queue `name`; `force` declares it even if it was declared lately. */
export type DeclareDelayQueue = (name: string, force: boolean) => Effect.Effect<void, TransportError>

export interface DelayQueueOptions {
  readonly consumer: string
  readonly operation: string
  readonly timeoutMs: number
  readonly retryQueueExpiryMs: number
}

/** One subscription's delay-queue declarations, each remembered until it is due again. */
export const makeDeclareDelayQueue = (
  connection: Connection,
  options: DelayQueueOptions,
): DeclareDelayQueue => {
  const { operation, timeoutMs } = options
  // Re-declaring a delay queue resets its `x-expires` clock (publishing does not).
  const redeclareAfterMs = options.retryQueueExpiryMs / 4
  const declaredAt = new Map<string, number>()
  return (name, force) =>
    Effect.suspend(() => {
      const last = declaredAt.get(name)
      if (!force && last !== undefined && Date.now() - last < redeclareAfterMs) return Effect.void
      const live = connection.current()
      if (live === undefined) return Effect.fail(connection.notConnected(operation))
      // Short-lived channels of their own: a refused declaration (406 when the
      // queue exists with other arguments) closes that channel, not the consumer's.
      const onChannel = onOwnChannel(live, { timeoutMs, operation })
      return declareQueue(onChannel, name, delayQueueArguments(options.consumer, options)).pipe(
        Effect.tap(() => Effect.sync(() => declaredAt.set(name, Date.now()))),
      )
    })
}

/** Publishes a copy of `message` to queue `target` on the generation's channel; its broker confirm. */
export const publishCopy = (
  generation: Generation,
  target: string,
  message: ConsumeMessage,
  nextAttempt: number,
  delayMs: number | undefined,
): Effect.Effect<PublishOutcome> =>
  Effect.callback<PublishOutcome>((resume) => {
    const item = {
      _tag: "Encoded" as const,
      message: {
        routingKey: target,
        content: message.content,
        options: retryCopyOptions(message, nextAttempt, delayMs),
      },
    }
    const batch = generation.publisher.publish("", [item], (outcomes) =>
      resume(Effect.succeed(outcomes[0] ?? { _tag: "Interrupted", error: "no outcome" })),
    )
    return Effect.sync(() => generation.publisher.abandon(batch))
  })

export interface RetryOptions {
  readonly consumer: string
  /** The consumer queue, where the fallback copy goes. */
  readonly queue: string
  /** Longest delay through a delay queue: half its expiry, so a copy leaves before the queue can expire. */
  readonly maxDelayMs: number
  readonly declareDelayQueue: DeclareDelayQueue
}

/**
 * What became of a retry copy: `copied` (the broker confirmed it: the original may be acked),
 * `gone` (the channel was lost: the broker redelivers the unacked original), `requeue` (no copy
 * could be made: give the original back to the queue).
 */
export type CopyResult = "copied" | "gone" | "requeue"

/** Copies the message to the delay queue, waits for the broker's confirm, then acks the original. */
export const retry = (
  options: RetryOptions,
  generation: Generation,
  message: ConsumeMessage,
  attempt: number,
  decision: Extract<DeliveryDecision, { _tag: "Retry" }>,
): Effect.Effect<void> =>
  Effect.map(retryCopy(options, generation, message, attempt, decision), (result) =>
    settleOriginal(generation, message, result),
  )

/** Settles the original after its copies: acked once every copy is confirmed. */
export const settleOriginal = (generation: Generation, message: ConsumeMessage, result: CopyResult): void => {
  if (result === "copied") ack(generation, message)
  else if (result === "requeue") requeue(generation, message)
}

/**
 * Sends a copy of `message` with the next attempt number to its attempt's delay queue (or, when
 * none can take it, back to the consumer queue after an in-memory delay); leaves the original alone.
 */
export const retryCopy = (
  options: RetryOptions,
  generation: Generation,
  message: ConsumeMessage,
  attempt: number,
  decision: Extract<DeliveryDecision, { _tag: "Retry" }>,
): Effect.Effect<CopyResult> =>
  Effect.gen(function* () {
    const { delayMs } = decision
    const nextAttempt = decision.spendsAttempt === false ? attempt : attempt + 1
    const delay = Math.min(options.maxDelayMs, Math.max(0, Number.isFinite(delayMs) ? delayMs : 0))
    const delayQueue = delayQueueName(options.consumer, attempt)
    let problem = "unknown"
    for (let tries = 0; tries < 2; tries++) {
      const declared = yield* Effect.exit(options.declareDelayQueue(delayQueue, tries > 0))
      if (Exit.isFailure(declared)) {
        problem = describeCause(Cause.squash(declared.cause))
        break
      }
      const outcome = yield* publishCopy(generation, delayQueue, message, nextAttempt, delay)
      if (outcome._tag === "Confirmed") return "copied"
      // The channel is gone, so is the unacked original: the broker redelivers it.
      if (outcome._tag === "Interrupted") return "gone"
      problem = `${outcome._tag}: ${outcome.error}`
      // Returned: the delay queue vanished since we declared it; declare it again once.
      if (outcome._tag !== "Returned") break
    }
    yield* Effect.logWarning(
      `txbox amqp: could not schedule a retry through ${delayQueue} (${problem}); sending it back to ${options.queue} after an in-memory delay`,
    )
    return yield* fallback(options.queue, generation, message, nextAttempt, delay)
  })

/** Sends the message back to the consumer queue after an in-memory delay; requeues it as a last resort. */
const fallback = (
  queue: string,
  generation: Generation,
  message: ConsumeMessage,
  nextAttempt: number,
  delay: number,
): Effect.Effect<CopyResult> =>
  Effect.gen(function* () {
    yield* Effect.sleep(Duration.millis(Math.min(delay, FALLBACK_DELAY_MS)))
    // A copy with the next attempt number, so the attempt is counted as through a delay queue.
    const outcome = yield* publishCopy(generation, queue, message, nextAttempt, undefined)
    if (outcome._tag === "Confirmed") return "copied"
    if (outcome._tag === "Interrupted") return "gone"
    // Last resort: the broker requeues it and counts a delivery; past the limit it goes to the
    // dead queue, which the inbox records.
    return "requeue"
  })
