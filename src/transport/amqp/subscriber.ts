/**
 * Consuming: one confirm channel per subscription, a durable queue per
 * consumer bound to its event types, manual acks after the handler, and
 * retries through per-attempt delay queues so a retried message never blocks
 * the queue behind it.
 */
import type { ConfirmChannel, ConsumeMessage } from "amqplib"
import { Cause, Deferred, Duration, Effect, Exit, Fiber, FiberSet, Option, Scope } from "effect"
import { describeCause, type TransportError } from "../../Errors.ts"
import type {
  Delivery,
  DeliveryDecision,
  PublishOutcome,
  SubscribeOptions,
  TransportShape,
} from "../../ports/Transport.ts"
import { AckCoalescer } from "./acks.ts"
import type { ResolvedConfig } from "./config.ts"
import { ConfirmPublisher } from "./confirms.ts"
import { type Connection, openConfirmChannel, openPlainChannel, rpc, transportError } from "./connection.ts"
import {
  consumerTopology,
  deadQueueName,
  declareConsumerTopology,
  delayQueueName,
  queueName,
} from "./topology.ts"
import { deadLetterReason, decodeDelivery, retryCopyOptions } from "./wire.ts"

// The names and arguments live with the rest of the topology; re-exported for `txbox/amqp`.
export { consumerQueueArguments, deadQueueName, delayQueueName, queueName } from "./topology.ts"

/** A handler that dies is retried after this long (it is a bug, not a transient failure). */
const DEFECT_RETRY: DeliveryDecision = { _tag: "Retry", delayMs: 5_000 }
/**
 * When a retry cannot be scheduled through a delay queue, wait at most this
 * long in memory before sending the message back to the consumer queue.
 */
const FALLBACK_DELAY_MS = 5_000

/** One channel's worth of consuming; replaced after the channel or connection is lost. */
interface Generation {
  readonly channel: ConfirmChannel
  /** Confirms for the copies sent to delay queues. */
  readonly publisher: ConfirmPublisher
  /** Acks, sent together at the end of each turn of the event loop. */
  readonly acks: AckCoalescer
  readonly scope: Scope.Closeable
  /** Completed when the channel closes or the broker cancels the consumer. */
  readonly lost: Deferred.Deferred<unknown>
  /** The consumer queue's consumer and the dead queue's. */
  consumerTags: ReadonlyArray<string>
  open: boolean
}

type Handle = (delivery: Delivery) => Effect.Effect<DeliveryDecision>

const validate = (options: SubscribeOptions): TransportError | undefined => {
  const problem =
    typeof options.consumer !== "string" || options.consumer === ""
      ? "consumer must be a non-empty string"
      : Buffer.byteLength(delayQueueName(options.consumer, 1_000_000)) > 255
        ? "consumer name is too long for an AMQP queue name"
        : !Number.isInteger(options.prefetch) || options.prefetch < 1 || options.prefetch > 65_535
          ? `prefetch must be an integer in [1, 65535], got ${options.prefetch}`
          : !Array.isArray(options.types) || options.types.some((t) => typeof t !== "string")
            ? "types must be an array of strings"
            : undefined
  return problem === undefined ? undefined : transportError("topology", "AmqpTransport.subscribe", problem)
}

export const makeSubscribe = (
  connection: Connection,
  config: ResolvedConfig,
): TransportShape["subscribe"] => {
  const timeoutMs = config.publishTimeoutMs
  // Re-declaring a delay queue resets its `x-expires` clock (publishing does not).
  const redeclareAfterMs = config.retryQueueExpiryMs / 4
  const maxDelayMs = config.retryQueueExpiryMs / 2

  return Effect.fn("AmqpTransport.subscribe")(function* (options: SubscribeOptions, handle: Handle) {
    const invalid = validate(options)
    if (invalid !== undefined) return yield* invalid
    const operation = `AmqpTransport.subscribe(${options.consumer})`
    const queue = queueName(options.consumer)
    const callerScope = yield* Effect.scope
    // Created first so it closes last: channels stay open until the handlers are settled.
    const generations = yield* Scope.fork(callerScope)
    const handlers = yield* FiberSet.make<void, never>()
    const run = yield* FiberSet.runtime(handlers)<never>()
    const stop = Deferred.makeUnsafe<void>()
    const ready = Deferred.makeUnsafe<void, TransportError>()
    const declaredAt = new Map<string, number>()

    const declareDelayQueue = (name: string, force: boolean): Effect.Effect<void, TransportError> =>
      Effect.suspend(() => {
        const last = declaredAt.get(name)
        if (!force && last !== undefined && Date.now() - last < redeclareAfterMs) return Effect.void
        const live = connection.current()
        if (live === undefined) return Effect.fail(connection.notConnected(operation))
        // A short-lived channel of its own: a refused declaration (406 when the
        // queue exists with other arguments) closes that channel, not the consumer's.
        return Effect.scopedWith((scope) =>
          Effect.gen(function* () {
            const channel = yield* openPlainChannel(live, scope, { highWaterMark: 16, timeoutMs, operation })
            yield* rpc(operation, timeoutMs, () =>
              channel.assertQueue(name, {
                durable: true,
                arguments: {
                  "x-queue-type": "quorum",
                  "x-dead-letter-exchange": "",
                  "x-dead-letter-routing-key": queue,
                  // At-least-once dead-lettering needs reject-publish overflow (RabbitMQ ≥ 3.10).
                  "x-dead-letter-strategy": "at-least-once",
                  "x-overflow": "reject-publish",
                  "x-expires": config.retryQueueExpiryMs,
                },
              }),
            )
            declaredAt.set(name, Date.now())
          }),
        )
      })

    /**
     * The exchange, the consumer queue with its dead-letter target and delivery
     * limit, the dead queue and the bindings (topology.ts; the same as
     * `declareTopology`). A queue declared by an earlier txbox without those
     * arguments cannot be redeclared with them; it is used as it is, with a
     * warning that says how to add them.
     */
    let warnedLegacy = false
    const topology = consumerTopology(options.consumer, options.types, config)
    const declareTopology = (live: NonNullable<ReturnType<Connection["current"]>>) =>
      Effect.gen(function* () {
        const { legacyQueue } = yield* declareConsumerTopology(live, topology, { timeoutMs, operation })
        if (!legacyQueue || warnedLegacy) return
        warnedLegacy = true
        yield* Effect.logWarning(
          `txbox amqp: queue ${queue} exists without txbox's dead-letter target and delivery limit ` +
            `(declared by an earlier version or by hand), so RabbitMQ may drop a message that keeps ` +
            `coming back (4.x does at 20 returns). Consuming it as it is. Add them with a policy: ` +
            `rabbitmqctl set_policy --apply-to queues txbox-${options.consumer} '^${queue.replaceAll(".", "\\.")}$' ` +
            `'{"dead-letter-exchange":"","dead-letter-routing-key":"${deadQueueName(options.consumer)}",` +
            `"delivery-limit":${config.deliveryLimit}}' — or delete the queue (when empty) to have it redeclared.`,
        )
      })

    const publishCopy = (
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

    /**
     * Settles on the channel while it is open. A closed channel cannot ack or nack: the broker
     * redelivers what was not settled, so a failure here loses nothing.
     */
    const onChannel = (generation: Generation, settle: () => void): void => {
      if (!generation.open) return
      try {
        settle()
      } catch {}
    }

    const ack = (generation: Generation, message: ConsumeMessage): void =>
      onChannel(generation, () => generation.acks.ack(message))

    const requeue = (generation: Generation, message: ConsumeMessage): void =>
      onChannel(generation, () => {
        generation.acks.settled(message)
        generation.channel.nack(message, false, true)
      })

    /** Copies the message to the delay queue, waits for the broker's confirm, then acks the original. */
    const retry = (
      generation: Generation,
      message: ConsumeMessage,
      attempt: number,
      decision: Extract<DeliveryDecision, { _tag: "Retry" }>,
    ) =>
      Effect.gen(function* () {
        const { delayMs } = decision
        const nextAttempt = decision.spendsAttempt === false ? attempt : attempt + 1
        const delay = Math.min(maxDelayMs, Math.max(0, Number.isFinite(delayMs) ? delayMs : 0))
        const delayQueue = delayQueueName(options.consumer, attempt)
        let problem = "unknown"
        for (let tries = 0; tries < 2; tries++) {
          const declared = yield* Effect.exit(declareDelayQueue(delayQueue, tries > 0))
          if (Exit.isFailure(declared)) {
            problem = describeCause(Cause.squash(declared.cause))
            break
          }
          const outcome = yield* publishCopy(generation, delayQueue, message, nextAttempt, delay)
          if (outcome._tag === "Confirmed") return ack(generation, message)
          // The channel is gone, so is the unacked original: the broker redelivers it.
          if (outcome._tag === "Interrupted") return
          problem = `${outcome._tag}: ${outcome.error}`
          // Returned: the delay queue vanished since we declared it; declare it again once.
          if (outcome._tag !== "Returned") break
        }
        yield* Effect.logWarning(
          `txbox amqp: could not schedule a retry through ${delayQueue} (${problem}); sending it back to ${queue} after an in-memory delay`,
        )
        yield* Effect.sleep(Duration.millis(Math.min(delay, FALLBACK_DELAY_MS)))
        // A copy with the next attempt number, so the attempt is counted as through a delay queue.
        const outcome = yield* publishCopy(generation, queue, message, nextAttempt, undefined)
        if (outcome._tag === "Confirmed") return ack(generation, message)
        if (outcome._tag === "Interrupted") return
        // Last resort: the broker requeues it and counts a delivery; past the limit it goes to the
        // dead queue, which the inbox records.
        requeue(generation, message)
      })

    /** A message the broker dead-lettered: the consumer records it; while it cannot, it stays in the dead queue. */
    const processDeadLettered = (generation: Generation, message: ConsumeMessage): Effect.Effect<void> =>
      Effect.gen(function* () {
        const delivery = { ...decodeDelivery(message), deadLettered: deadLetterReason(message) }
        const decision = yield* Effect.suspend(() => handle(delivery)).pipe(
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

    const processDelivery = (generation: Generation, message: ConsumeMessage): Effect.Effect<void> =>
      Effect.gen(function* () {
        const delivery = decodeDelivery(message)
        const decision = yield* Effect.suspend(() => handle(delivery)).pipe(
          Effect.catchCause((cause) =>
            // Interrupted handlers stay unsettled; the broker redelivers them.
            Cause.hasInterruptsOnly(cause)
              ? Effect.failCause(cause)
              : Effect.logError(`txbox amqp: handler for ${options.consumer} died; retrying`, cause).pipe(
                  Effect.as(DEFECT_RETRY),
                ),
          ),
        )
        if (decision._tag === "Ack") ack(generation, message)
        else yield* retry(generation, message, delivery.attempt, decision)
      })

    /** Opens a channel, declares and binds the queue, and starts consuming. */
    const setup = (live: NonNullable<ReturnType<Connection["current"]>>, scope: Scope.Closeable) =>
      Effect.gen(function* () {
        const generation = yield* openConfirmChannel(
          live,
          scope,
          { highWaterMark: 1024, timeoutMs, operation },
          (channel): Generation => {
            const lost = Deferred.makeUnsafe<unknown>()
            let lastError: unknown
            const acks = new AckCoalescer(channel, (flush) =>
              setImmediate(() => onChannel(generation, flush)),
            )
            const generation: Generation = {
              channel,
              publisher: new ConfirmPublisher(channel, {
                window: config.publishWindow,
                timeoutMs,
                maxMessageSize: config.maxMessageSize,
              }),
              acks,
              scope,
              lost,
              consumerTags: [],
              open: true,
            }
            channel.on("error", (error: unknown) => {
              lastError = error
            })
            channel.on("close", () => {
              generation.open = false
              Deferred.doneUnsafe(lost, Effect.succeed(lastError ?? "channel closed"))
            })
            return generation
          },
        )
        const { channel, lost } = generation
        // Added after the channel's own finalizer, so it runs first: acks still waiting for the end
        // of the turn go out before the channel closes (else the broker redelivers them).
        yield* Scope.addFinalizer(
          scope,
          Effect.sync(() => onChannel(generation, () => generation.acks.flush())),
        )
        yield* declareTopology(live)
        yield* rpc(operation, timeoutMs, () => channel.prefetch(options.prefetch))
        const reply = yield* rpc(operation, timeoutMs, () =>
          channel.consume(
            queue,
            (message) => {
              // null: the broker cancelled the consumer (queue deleted); resubscribe.
              if (message === null)
                Deferred.doneUnsafe(lost, Effect.succeed("consumer cancelled by the broker"))
              else {
                generation.acks.delivered(message)
                run(processDelivery(generation, message))
              }
            },
            { noAck: false },
          ),
        )
        const deadReply = yield* rpc(operation, timeoutMs, () =>
          channel.consume(
            deadQueueName(options.consumer),
            (message) => {
              if (message === null)
                Deferred.doneUnsafe(lost, Effect.succeed("consumer cancelled by the broker"))
              else {
                generation.acks.delivered(message)
                run(processDeadLettered(generation, message))
              }
            },
            { noAck: false },
          ),
        )
        generation.consumerTags = [reply.consumerTag, deadReply.consumerTag]
        return generation
      })

    /** One attempt to subscribe; its channel lives in a scope of its own, closed if the attempt fails. */
    const attach: Effect.Effect<Generation, TransportError> = Effect.uninterruptibleMask((restore) =>
      Effect.gen(function* () {
        const live = connection.current()
        if (live === undefined) return yield* connection.notConnected(operation)
        const scope = yield* Scope.fork(generations)
        const exit = yield* Effect.exit(restore(setup(live, scope)))
        if (Exit.isFailure(exit)) {
          yield* Scope.close(scope, exit)
          return yield* Effect.failCause(exit.cause)
        }
        return exit.value
      }),
    )

    const reattach = connection.awaitConnected.pipe(
      Effect.andThen(attach),
      Effect.tapError((error) =>
        Effect.logWarning(`txbox amqp: resubscribing ${options.consumer} failed: ${error.message}`),
      ),
      Effect.retry(config.reconnect),
    )

    /** Consumes until the channel is lost (false) or the subscription stops (true). */
    const consume = (generation: Generation) =>
      Effect.gen(function* () {
        const stopped = yield* Effect.raceFirst(
          Deferred.await(generation.lost).pipe(Effect.as(false)),
          Deferred.await(stop).pipe(Effect.as(true)),
        )
        if (stopped) {
          // Stop new deliveries, let the handlers in flight finish and settle on this channel, then close it.
          if (generation.open) {
            for (const tag of generation.consumerTags) {
              yield* rpc(operation, timeoutMs, () => generation.channel.cancel(tag)).pipe(Effect.ignore)
            }
          }
          yield* FiberSet.awaitEmpty(handlers)
        } else {
          const cause = yield* Deferred.await(generation.lost)
          yield* Effect.logWarning(
            `txbox amqp: consumer ${options.consumer} lost its channel (${describeCause(cause)}); resubscribing`,
          )
        }
        yield* Scope.close(generation.scope, Exit.void)
        return stopped
      })

    const loop = Effect.gen(function* () {
      const first = yield* Effect.exit(attach)
      Deferred.doneUnsafe(ready, Exit.isFailure(first) ? Effect.failCause(first.cause) : Effect.void)
      if (Exit.isFailure(first)) return
      let generation = first.value
      while (!(yield* consume(generation))) {
        const next = yield* Effect.raceFirst(
          reattach.pipe(Effect.map(Option.some)),
          Deferred.await(stop).pipe(Effect.as(Option.none<Generation>())),
        )
        if (Option.isNone(next)) return
        generation = next.value
      }
    })

    const loopFiber = yield* Effect.forkScoped(loop)
    // Added last, so it runs first when the scope closes: before the loop is
    // interrupted and before the channels close.
    yield* Effect.addFinalizer(() =>
      Effect.gen(function* () {
        Deferred.doneUnsafe(stop, Effect.void)
        yield* Fiber.await(loopFiber)
        yield* FiberSet.awaitEmpty(handlers)
      }),
    )
    yield* Deferred.await(ready)
  })
}
