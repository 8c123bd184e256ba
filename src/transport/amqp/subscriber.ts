/**
 * Consuming: one confirm channel per subscription, a durable queue per
 * consumer bound to its event types, manual acks after the handler, and
 * retries through per-attempt delay queues so a retried message never blocks
 * the queue behind it.
 *
 * This module assembles a subscription; its parts each live alone:
 * - generation.ts: a channel's worth of consuming, its acks and requeues;
 * - retry.ts: retry copies through the delay queues, and the fallback;
 * - deliveries.ts: handling a delivery or a dead-lettered one;
 * - resubscribe.ts: setup, consuming until the channel is lost, resubscribing.
 */
import { Deferred, Effect, Fiber, FiberSet, Scope } from "effect"
import type { TransportError } from "../../Errors.ts"
import type { HandleMany, SubscribeOptions, TransportShape } from "../../ports/Transport.ts"
import type { ResolvedConfig } from "./config.ts"
import { type Connection, transportError } from "./connection.ts"
import type { Handle } from "./deliveries.ts"
import { makeDeclareTopology, resubscribeLoop, type Subscription } from "./resubscribe.ts"
import { makeDeclareDelayQueue } from "./retry.ts"
import { consumerTopology, delayQueueName, queueName } from "./topology.ts"

// The names and arguments live with the rest of the topology; re-exported for `txbox/amqp`.
export { consumerQueueArguments, deadQueueName, delayQueueName, queueName } from "./topology.ts"

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

export const makeSubscribe = (connection: Connection, config: ResolvedConfig): TransportShape["subscribe"] =>
  Effect.fn("AmqpTransport.subscribe")(function* (
    options: SubscribeOptions,
    handle: Handle,
    handleMany?: HandleMany,
  ) {
    const invalid = validate(options)
    if (invalid !== undefined) return yield* invalid
    const { consumer } = options
    const operation = `AmqpTransport.subscribe(${consumer})`
    const queue = queueName(consumer)
    const timeoutMs = config.publishTimeoutMs
    const callerScope = yield* Effect.scope
    // Created first so it closes last: channels stay open until the handlers are settled.
    const generations = yield* Scope.fork(callerScope)
    const handlers = yield* FiberSet.make<void, never>()
    const run = yield* FiberSet.runtime(handlers)<never>()
    const stop = Deferred.makeUnsafe<void>()
    const ready = Deferred.makeUnsafe<void, TransportError>()
    const topology = consumerTopology(consumer, options.types, config)
    const subscription: Subscription = {
      connection,
      config,
      consumer,
      queue,
      prefetch: options.prefetch,
      operation,
      generations,
      handlers,
      run,
      stop,
      declareTopology: makeDeclareTopology(topology, consumer, config, { timeoutMs, operation }),
      deliveries: {
        consumer,
        handle,
        handleMany,
        retry: {
          consumer,
          queue,
          maxDelayMs: config.retryQueueExpiryMs / 2,
          declareDelayQueue: makeDeclareDelayQueue(connection, {
            consumer,
            operation,
            timeoutMs,
            retryQueueExpiryMs: config.retryQueueExpiryMs,
          }),
        },
      },
    }

    const loopFiber = yield* Effect.forkScoped(resubscribeLoop(subscription, ready))
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
