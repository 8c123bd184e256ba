/**
 * A consumer's broker topology, in one place: the inbox declares it when it
 * subscribes, and `declareTopology` (the `txbox topology declare` command)
 * declares exactly the same ahead of time, so a producer deployed before its
 * consumers publishes into a queue that waits instead of getting its messages
 * back unroutable.
 *
 * - the durable topic exchange;
 * - `txbox.<consumer>`: durable, quorum by default, with `x-delivery-limit`
 *   and `txbox.<consumer>.dead` as its dead-letter target;
 * - `txbox.<consumer>.dead`, where the broker moves what it gives up on;
 * - one binding of `txbox.<consumer>` per event type (routing key).
 *
 * Quorum queues, these and the delay queues, are declared with
 * `x-queue-leader-locator: balanced`, so that on a cluster their leaders
 * spread over the nodes rather than all landing on the node the declaring
 * connection happens to use (`declareQueue` says how an older queue without
 * it is redeclared).
 *
 * Retry delay queues (`txbox.<consumer>.delay.N`) are not part of it: the
 * inbox declares each on its first retry, and they expire when unused. Their
 * names and arguments are here all the same.
 */
import type { Channel } from "amqplib"
import { Cause, Effect, Exit } from "effect"
import type { ConfigError, TransportError } from "../../Errors.ts"
import { type AmqpTransportConfig, type ResolvedConfig, resolveConfig } from "./config.ts"
import {
  isPreconditionFailed,
  type Live,
  makeConnection,
  openPlainChannel,
  rpc,
  transportError,
} from "./connection.ts"

/**
 * The argument that says where RabbitMQ puts a new quorum queue's leader;
 * txbox gives it `balanced` (RabbitMQ ≥
 * 3.10): on the node with the fewest leaders while the cluster has fewer than
 * `queue_count_start_random_selection` queues (1000), else on a random node;
 * the default, `client-local`, is the node of the declaring connection. It
 * places the leader at creation only: a queue keeps it until that node goes
 * away, when its replicas elect another.
 */
export const LEADER_LOCATOR = "x-queue-leader-locator"

/** The queue a consumer owns. */
export const queueName = (consumer: string): string => `txbox.${consumer}`

/**
 * Where RabbitMQ moves a message of `txbox.<consumer>` that came back to it
 * more than the delivery limit allows (or that the queue otherwise
 * dead-letters). The subscription consumes it too, and the inbox records each
 * such message as a dead row: the broker never drops one silently.
 */
export const deadQueueName = (consumer: string): string => `${queueName(consumer)}.dead`

/**
 * The delay queue for messages whose attempt number `attempt` failed.
 *
 * RabbitMQ expires per-message TTLs only at the head of a queue, so in a single
 * delay queue a 5-minute retry would hold back a 1-second one queued behind it.
 * Retry delays grow with the attempt number (exponential backoff, ±20 %
 * jitter), so messages that share an attempt number have similar delays: one
 * queue per attempt number keeps that head-of-line wait within the jitter.
 *
 * Delay queues are quorum queues with at-least-once dead-lettering: a classic
 * queue dead-letters at most once, and an expiry that meets the main queue
 * unavailable (a broker restart) dropped the message — the soak lost 196 of
 * 26,224 that way. (`.delay.N`, not the classic `.retry.N` of earlier
 * versions, which RabbitMQ would refuse to redeclare with these arguments;
 * the old ones drain and expire by themselves.)
 */
export const delayQueueName = (consumer: string, attempt: number): string =>
  `${queueName(consumer)}.delay.${Math.min(attempt, MAX_DELAY_QUEUES)}`

/**
 * Delay queues per consumer at most: a message retried without end (a bug that
 * dies on every try spends an attempt each time) must not create queues without
 * bound. Past this many attempts the backoff is at its cap, so the delays in the
 * last queue are alike and none waits behind a longer one.
 */
export const MAX_DELAY_QUEUES = 32

/**
 * The arguments of a delay queue: its messages go back to the consumer queue
 * when their per-message TTL runs out, and the queue itself expires after
 * `retryQueueExpiryMs` unused.
 */
export const delayQueueArguments = (
  consumer: string,
  config: Pick<ResolvedConfig, "retryQueueExpiryMs">,
): Record<string, unknown> => ({
  "x-queue-type": "quorum",
  "x-dead-letter-exchange": "",
  "x-dead-letter-routing-key": queueName(consumer),
  // At-least-once dead-lettering needs reject-publish overflow (RabbitMQ ≥ 3.10).
  "x-dead-letter-strategy": "at-least-once",
  "x-overflow": "reject-publish",
  "x-expires": config.retryQueueExpiryMs,
  [LEADER_LOCATOR]: "balanced",
})

/**
 * The arguments of a consumer queue: its delivery limit (quorum only) and its
 * dead-letter target, the dead queue.
 */
export const consumerQueueArguments = (
  consumer: string,
  config: Pick<ResolvedConfig, "queueType" | "deliveryLimit">,
): Record<string, unknown> =>
  config.queueType === "quorum"
    ? {
        "x-queue-type": "quorum",
        "x-delivery-limit": config.deliveryLimit,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": deadQueueName(consumer),
        // At-least-once dead-lettering needs reject-publish overflow (RabbitMQ ≥ 3.10).
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        [LEADER_LOCATOR]: "balanced",
      }
    : {
        "x-queue-type": "classic",
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": deadQueueName(consumer),
      }

/**
 * The dead queue's own delivery limit: high, but explicit, because RabbitMQ
 * 4.x would give it 20 and drop at it (the dead queue has no dead-letter
 * target). Its messages only come back while the inbox's database is away.
 */
const DEAD_QUEUE_DELIVERY_LIMIT = 1_000_000

const deadQueueArguments = (config: Pick<ResolvedConfig, "queueType">): Record<string, unknown> =>
  config.queueType === "quorum"
    ? {
        "x-queue-type": "quorum",
        "x-delivery-limit": DEAD_QUEUE_DELIVERY_LIMIT,
        [LEADER_LOCATOR]: "balanced",
      }
    : { "x-queue-type": "classic" }

/** What a consumer's topology is: every name and argument, nothing declared yet. */
export interface ConsumerTopology {
  /** The durable topic exchange. */
  readonly exchange: string
  /** `txbox.<consumer>`. */
  readonly queue: string
  /** The consumer queue's `x-queue-type`. */
  readonly queueType: "quorum" | "classic"
  /** The consumer queue's arguments: its delivery limit (quorum only) and its dead-letter target. */
  readonly queueArguments: Readonly<Record<string, unknown>>
  /** `txbox.<consumer>.dead`, the consumer queue's dead-letter target. */
  readonly deadQueue: string
  /** The dead queue's arguments (quorum: an explicit, high delivery limit). */
  readonly deadQueueArguments: Readonly<Record<string, unknown>>
  /** Routing keys bound from the exchange to the queue: the event types. */
  readonly bindings: ReadonlyArray<string>
}

export const consumerTopology = (
  consumer: string,
  types: ReadonlyArray<string>,
  config: Pick<ResolvedConfig, "exchange" | "queueType" | "deliveryLimit">,
): ConsumerTopology => ({
  exchange: config.exchange,
  queue: queueName(consumer),
  queueType: config.queueType,
  queueArguments: consumerQueueArguments(consumer, config),
  deadQueue: deadQueueName(consumer),
  deadQueueArguments: deadQueueArguments(config),
  bindings: [...new Set(types)],
})

/** Why a consumer name or type list cannot make a topology, if it cannot. */
export const topologyProblem = (consumer: unknown, types: unknown): string | undefined =>
  typeof consumer !== "string" || consumer === ""
    ? "consumer must be a non-empty string"
    : new TextEncoder().encode(delayQueueName(consumer, 1_000_000)).length > 255
      ? "consumer name is too long for an AMQP queue name"
      : !Array.isArray(types) || types.some((t) => typeof t !== "string")
        ? "types must be an array of strings"
        : types.some((t) => new TextEncoder().encode(t).length > 255)
          ? "a type (routing key) is longer than 255 bytes"
          : undefined

/** Runs one broker RPC on a short-lived channel of its own, so a refusal closes that channel only. */
export type OnChannel = <A>(use: (channel: Channel) => Promise<A>) => Effect.Effect<A, TransportError>

/** `OnChannel` on `live`: each call opens a channel, runs its RPC and closes it. */
export const onOwnChannel =
  (live: Live, options: { readonly timeoutMs: number; readonly operation: string }): OnChannel =>
  (use) =>
    Effect.scopedWith((scope) =>
      Effect.flatMap(openPlainChannel(live, scope, { highWaterMark: 16, ...options }), (channel) =>
        rpc(options.operation, options.timeoutMs, () => use(channel)),
      ),
    )

/**
 * Declares the durable queue `name` with `args`. RabbitMQ refuses (406) to
 * redeclare a queue with x-arguments other than it has, and 3.10 compares
 * `x-queue-leader-locator` of quorum queues like the rest (it is among the
 * queue type's declared arguments; a policy's `queue-leader-locator` is not
 * compared). A queue declared before txbox set it (or by hand, or with a
 * policy instead) has none, so a refused declaration with it is tried again
 * without it: the locator only places a new queue's leader, and that queue
 * has one. Declared either way, the queue is the same; a refusal without it
 * too is the caller's (a queue with other arguments).
 */
export const declareQueue = (
  onChannel: OnChannel,
  name: string,
  args: Readonly<Record<string, unknown>>,
): Effect.Effect<void, TransportError> => {
  const declare = (withArgs: Readonly<Record<string, unknown>>) =>
    Effect.asVoid(onChannel((channel) => channel.assertQueue(name, { durable: true, arguments: withArgs })))
  if (!(LEADER_LOCATOR in args)) return declare(args)
  const { [LEADER_LOCATOR]: _placesNewQueuesOnly, ...withoutLocator } = args
  return declare(args).pipe(Effect.catchIf(isPreconditionFailed, () => declare(withoutLocator)))
}

/**
 * Declares `topology` on `live`. Each step runs on a short-lived channel of
 * its own: a refused declaration (406, the entity exists with other
 * arguments) closes its channel, not the caller's.
 *
 * A consumer queue that exists without txbox's arguments (declared by an
 * earlier txbox or by hand) cannot be redeclared with them; it is used as it
 * is, bound all the same, and `legacyQueue` says so. One that lacks only the
 * leader locator is not legacy (`declareQueue`).
 */
export const declareConsumerTopology = (
  live: Live,
  topology: ConsumerTopology,
  options: { readonly timeoutMs: number; readonly operation: string },
): Effect.Effect<{ readonly legacyQueue: boolean }, TransportError> => {
  const onChannel = onOwnChannel(live, options)
  return Effect.gen(function* () {
    yield* onChannel((channel) => channel.assertExchange(topology.exchange, "topic", { durable: true }))
    yield* declareQueue(onChannel, topology.deadQueue, topology.deadQueueArguments)
    const declared = yield* Effect.exit(declareQueue(onChannel, topology.queue, topology.queueArguments))
    let legacyQueue = false
    if (Exit.isFailure(declared)) {
      if (!isPreconditionFailed(Cause.squash(declared.cause))) return yield* Effect.failCause(declared.cause)
      legacyQueue = true
    }
    if (topology.bindings.length > 0) {
      yield* onChannel(async (channel) => {
        for (const type of topology.bindings) await channel.bindQueue(topology.queue, topology.exchange, type)
      })
    }
    return { legacyQueue }
  })
}

/**
 * What to tell the operator of a consumer queue that exists without txbox's
 * dead-letter target and delivery limit: the policy that adds them.
 */
export const legacyQueueWarning = (
  consumer: string,
  config: Pick<ResolvedConfig, "deliveryLimit">,
): string => {
  const queue = queueName(consumer)
  return (
    `txbox amqp: queue ${queue} exists without txbox's dead-letter target and delivery limit ` +
    `(declared by an earlier version or by hand), so RabbitMQ may drop a message that keeps ` +
    `coming back (4.x does at 20 returns). Consuming it as it is. Add them with a policy: ` +
    `rabbitmqctl set_policy --apply-to queues txbox-${consumer} '^${queue.replaceAll(".", "\\.")}$' ` +
    `'{"dead-letter-exchange":"","dead-letter-routing-key":"${deadQueueName(consumer)}",` +
    `"delivery-limit":${config.deliveryLimit}}' — or delete the queue (when empty) to have it redeclared.`
  )
}

/** Settings for `declareTopology`: the transport's (same defaults, `url` or a cluster's `urls`) and the consumer's. */
export type DeclareTopologyOptions = AmqpTransportConfig & {
  /** The inbox consumer whose queue to declare (`Inbox.make({ consumer })`). */
  readonly consumer: string
  /** The event types it handles: each is bound as a routing key. */
  readonly types: ReadonlyArray<string>
}

/** What `declareTopology` declared. */
export interface DeclaredTopology extends ConsumerTopology {
  /**
   * The consumer queue already existed without txbox's dead-letter target and
   * delivery limit; it was left as it is (and bound). See the README.
   */
  readonly legacyQueue: boolean
}

/**
 * Declares a consumer's topology ahead of time — exactly what the inbox
 * declares when it subscribes (same queue type, arguments, dead-letter target
 * and bindings) — on a connection of its own, closed when done. Idempotent:
 * declaring again, or an inbox subscribing later, changes nothing.
 *
 * ```ts
 * yield* declareTopology({ url: "amqp://rabbitmq", consumer: "billing", types: ["orders.order-placed"] })
 * ```
 */
export const declareTopology = (
  options: DeclareTopologyOptions,
): Effect.Effect<DeclaredTopology, TransportError | ConfigError> =>
  Effect.gen(function* () {
    const operation = `AmqpTransport.declareTopology(${String(options.consumer)})`
    const problem = topologyProblem(options.consumer, options.types)
    if (problem !== undefined) return yield* transportError("topology", operation, problem)
    const config = yield* resolveConfig({ ...options, failFast: true })
    const topology = consumerTopology(options.consumer, options.types, config)
    return yield* Effect.scoped(
      Effect.gen(function* () {
        const connection = yield* makeConnection(config)
        const live = connection.current()
        if (live === undefined) return yield* connection.notConnected(operation)
        const { legacyQueue } = yield* declareConsumerTopology(live, topology, {
          timeoutMs: config.publishTimeoutMs,
          operation,
        })
        return { ...topology, legacyQueue }
      }),
    )
  })
