/**
 * A subscription's life: open a generation (channel, topology, consumers),
 * consume until its channel is lost, open the next one when the connection is
 * back, and so on until the subscription stops.
 */
import type { ConsumeMessage } from "amqplib"
import { Deferred, Effect, Exit, FiberSet, Option, Scope } from "effect"
import { describeCause, type TransportError } from "../../Errors.ts"
import type { ResolvedConfig } from "./config.ts"
import { type Connection, type Live, rpc } from "./connection.ts"
import { type DeliveryOptions, processDeadLettered, processDelivery } from "./deliveries.ts"
import { type Generation, openGeneration } from "./generation.ts"
import {
  type ConsumerTopology,
  deadQueueName,
  declareConsumerTopology,
  legacyQueueWarning,
} from "./topology.ts"

/** What every generation of one subscription shares. */
export interface Subscription {
  readonly connection: Connection
  readonly config: ResolvedConfig
  readonly consumer: string
  readonly queue: string
  readonly prefetch: number
  readonly operation: string
  /** Parent of the generations' scopes; closes after the handlers have settled. */
  readonly generations: Scope.Scope
  /** The handlers in flight, on any generation. */
  readonly handlers: FiberSet.FiberSet<void, never>
  /** Forks a handler into `handlers`. */
  readonly run: (effect: Effect.Effect<void>) => unknown
  /** Completed when the subscription stops. */
  readonly stop: Deferred.Deferred<void>
  readonly declareTopology: (live: Live) => Effect.Effect<void, TransportError>
  readonly deliveries: DeliveryOptions
}

/**
 * The exchange, the consumer queue with its dead-letter target and delivery
 * limit, the dead queue and the bindings (topology.ts; the same as
 * `declareTopology`). A queue declared by an earlier txbox without those
 * arguments cannot be redeclared with them; it is used as it is, with a
 * warning (once per subscription) that says how to add them.
 */
export const makeDeclareTopology = (
  topology: ConsumerTopology,
  consumer: string,
  config: Pick<ResolvedConfig, "deliveryLimit">,
  options: { readonly timeoutMs: number; readonly operation: string },
): ((live: Live) => Effect.Effect<void, TransportError>) => {
  let warnedLegacy = false
  return (live) =>
    Effect.gen(function* () {
      const { legacyQueue } = yield* declareConsumerTopology(live, topology, options)
      if (!legacyQueue || warnedLegacy) return
      warnedLegacy = true
      yield* Effect.logWarning(legacyQueueWarning(consumer, config))
    })
}

/** Opens a channel, declares and binds the queue, and starts consuming. */
const setup = (subscription: Subscription, live: Live, scope: Scope.Closeable) =>
  Effect.gen(function* () {
    const { operation, config, deliveries } = subscription
    const timeoutMs = config.publishTimeoutMs
    const generation = yield* openGeneration(live, scope, {
      timeoutMs,
      operation,
      publishWindow: config.publishWindow,
      maxMessageSize: config.maxMessageSize,
    })
    yield* subscription.declareTopology(live)
    yield* rpc(operation, timeoutMs, () => generation.channel.prefetch(subscription.prefetch))
    const reply = yield* startConsumer(subscription, generation, subscription.queue, (message) =>
      processDelivery(deliveries, generation, message),
    )
    const deadReply = yield* startConsumer(
      subscription,
      generation,
      deadQueueName(subscription.consumer),
      (message) => processDeadLettered(deliveries, generation, message),
    )
    generation.consumerTags = [reply.consumerTag, deadReply.consumerTag]
    return generation
  })

/** Consumes `queue` on the generation's channel, each message in a handler fiber of its own. */
const startConsumer = (
  subscription: Subscription,
  generation: Generation,
  queue: string,
  process: (message: ConsumeMessage) => Effect.Effect<void>,
) =>
  rpc(subscription.operation, subscription.config.publishTimeoutMs, () =>
    generation.channel.consume(
      queue,
      (message) => {
        // null: the broker cancelled the consumer (queue deleted); resubscribe.
        if (message === null)
          Deferred.doneUnsafe(generation.lost, Effect.succeed("consumer cancelled by the broker"))
        else {
          generation.acks.delivered(message)
          subscription.run(process(message))
        }
      },
      { noAck: false },
    ),
  )

/** One attempt to subscribe; its channel lives in a scope of its own, closed if the attempt fails. */
const attach = (subscription: Subscription): Effect.Effect<Generation, TransportError> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.gen(function* () {
      const { connection } = subscription
      const live = connection.current()
      if (live === undefined) return yield* connection.notConnected(subscription.operation)
      const scope = yield* Scope.fork(subscription.generations)
      const exit = yield* Effect.exit(restore(setup(subscription, live, scope)))
      if (Exit.isFailure(exit)) {
        yield* Scope.close(scope, exit)
        return yield* Effect.failCause(exit.cause)
      }
      return exit.value
    }),
  )

/** Attaches again once the connection is up, with the reconnect backoff between failed attempts. */
const reattach = (subscription: Subscription): Effect.Effect<Generation, TransportError> =>
  subscription.connection.awaitConnected.pipe(
    Effect.andThen(attach(subscription)),
    Effect.tapError((error) =>
      Effect.logWarning(`txbox amqp: resubscribing ${subscription.consumer} failed: ${error.message}`),
    ),
    Effect.retry(subscription.config.reconnect),
  )

/** Consumes until the channel is lost (false) or the subscription stops (true). */
const consume = (subscription: Subscription, generation: Generation): Effect.Effect<boolean> =>
  Effect.gen(function* () {
    const stopped = yield* Effect.raceFirst(
      Deferred.await(generation.lost).pipe(Effect.as(false)),
      Deferred.await(subscription.stop).pipe(Effect.as(true)),
    )
    if (stopped) {
      // Stop new deliveries, let the handlers in flight finish and settle on this channel, then close it.
      if (generation.open) {
        for (const tag of generation.consumerTags) {
          yield* rpc(subscription.operation, subscription.config.publishTimeoutMs, () =>
            generation.channel.cancel(tag),
          ).pipe(Effect.ignore)
        }
      }
      yield* FiberSet.awaitEmpty(subscription.handlers)
    } else {
      const cause = yield* Deferred.await(generation.lost)
      yield* Effect.logWarning(
        `txbox amqp: consumer ${subscription.consumer} lost its channel (${describeCause(cause)}); resubscribing`,
      )
    }
    yield* Scope.close(generation.scope, Exit.void)
    return stopped
  })

/**
 * Subscribes, completing `ready` with the first attempt's result, then
 * resubscribes after each loss until the subscription stops.
 */
export const resubscribeLoop = (
  subscription: Subscription,
  ready: Deferred.Deferred<void, TransportError>,
): Effect.Effect<void, TransportError> =>
  Effect.gen(function* () {
    const first = yield* Effect.exit(attach(subscription))
    Deferred.doneUnsafe(ready, Exit.isFailure(first) ? Effect.failCause(first.cause) : Effect.void)
    if (Exit.isFailure(first)) return
    let generation = first.value
    while (!(yield* consume(subscription, generation))) {
      const next = yield* Effect.raceFirst(
        reattach(subscription).pipe(Effect.map(Option.some)),
        Deferred.await(subscription.stop).pipe(Effect.as(Option.none<Generation>())),
      )
      if (Option.isNone(next)) return
      generation = next.value
    }
  })
