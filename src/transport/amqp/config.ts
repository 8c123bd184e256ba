/**
 * Configuration of the RabbitMQ transport: the public interface with its
 * defaults, and the validated, fully resolved form the layer works with.
 */
import { Duration, Effect, Option, type Schedule } from "effect"
import { ConfigError } from "../../Errors.ts"
import { defaultRetryPolicy, makeRetryPolicy, schedule } from "../../Retry.ts"

/** Backoff between reconnect attempts: exponential, capped, always jittered (±20 %). */
export interface ReconnectPolicy {
  /** Delay after the first failed attempt. @default "500 millis" */
  readonly initialDelay?: Duration.Input
  /** Growth per failed attempt. @default 2 */
  readonly factor?: number
  /** No delay is ever longer than this (before jitter). @default "30 seconds" */
  readonly maxDelay?: Duration.Input
}

/**
 * Where the broker is: one URL, or the URLs of a cluster's nodes. Exactly one
 * of `url` and `urls`.
 */
export type BrokerUrls =
  | {
      /**
       * Broker URL, `amqp://user:pass@host:5672/vhost` (or `amqps://`). It is never
       * printed: credentials are removed from every error and log line.
       */
      readonly url: string
      readonly urls?: undefined
    }
  | {
      /**
       * The URLs of a RabbitMQ cluster's nodes, each like `url` (the same vhost
       * on each, or the queues differ). The transport holds one connection, to one
       * of them: it starts at a random one, so the processes that share this
       * list spread their connections over the cluster instead of all landing
       * on the first node (and all falling over to the second when it goes);
       * each later attempt, after a lost connection or a failed connect, takes
       * the next URL, round robin. A round of attempts tries each URL once, back
       * to back; the reconnect backoff is between rounds.
       */
      readonly urls: ReadonlyArray<string>
      readonly url?: undefined
    }

/** The settings of `AmqpTransport.layer` besides the broker's URLs: how the transport publishes, consumes and reconnects (each with its default). */
export interface AmqpTransportOptions {
  /** The durable topic exchange events are published to and consumer queues bind to. @default "txbox.events" */
  readonly exchange?: string
  /** CloudEvents `source` attribute and AMQP `appId` of published messages. @default "txbox" */
  readonly source?: string
  /**
   * Most unconfirmed messages in flight on the publishing channel at once
   * (shared by concurrent `publish` calls). On this machine ≥ 1000 saturates a
   * classic queue; more only costs memory. @default 2000
   */
  readonly publishWindow?: number
  /** A message without a confirm this long after it was sent is `TimedOut`. @default "10 seconds" */
  readonly publishTimeout?: Duration.Input
  /** `x-queue-type` of consumer queues; quorum queues replicate and confirm faster here. @default "quorum" */
  readonly queueType?: "quorum" | "classic"
  /**
   * How many times a message may come back to its consumer queue unsettled (a
   * consumer that died or lost its connection holding it, a requeue) before
   * RabbitMQ moves it to `txbox.<consumer>.dead`, which the inbox records as
   * a dead row. Handler retries do not count: they go through delay queues.
   * Set explicitly because RabbitMQ 4.x gives quorum queues a default limit
   * of 20 and, with no dead-letter target, drops the message at it; 3.x has
   * no default. Quorum queues only (classic queues have no delivery limit).
   *
   * Sized for failover too: a cluster node lost (or a consumer's connection to
   * it) returns the deliveries its consumers held, once each, so a node loss
   * spends one of the 20 for at most `prefetch` messages per consumer; the
   * queue's own replicas on the other nodes keep what they hold. It takes
   * about 20 such losses while one message is in flight to make it dead.
   * @default 20
   */
  readonly deliveryLimit?: number
  /** Backoff for reconnecting after the connection is lost or cannot be opened. @default { initialDelay: "500 millis", factor: 2, maxDelay: "30 seconds" } */
  readonly reconnect?: ReconnectPolicy
  /**
   * AMQP heartbeat (whole seconds; 0 disables). A dead peer is noticed after
   * two to three intervals without a frame from it.
   *
   * For failover: a node that crashes or is killed has its sockets closed by
   * its host, and the transport moves to the next URL at once, heartbeat or
   * not. Heartbeats matter when a node's host vanishes (power, network): at the
   * default, 60–90 s. That is about what the cluster itself takes to declare
   * such a node down (Erlang's `net_ticktime`, 60 s by default: 45–75 s), and
   * quorum queues led by it elect a new leader only then, so a shorter
   * heartbeat reconnects sooner without making those queues available sooner.
   * @default "30 seconds"
   */
  readonly heartbeat?: Duration.Input
  /** Bound on opening the TCP connection and the AMQP handshake. @default "10 seconds" */
  readonly connectTimeout?: Duration.Input
  /**
   * Bodies larger than this are `Rejected` without being sent. Match the
   * broker's `max_message_size` (128 MiB on RabbitMQ 3.x, 16 MiB on 4.x): a
   * larger message makes the broker close the whole channel. @default 134217728
   */
  readonly maxMessageSize?: number
  /**
   * Most events in one AMQP message. The relay's batch goes out as few
   * messages as this allows: the events of one routing key, in order, as a
   * CloudEvents JSON batch (`application/cloudevents-batch+json`, docs/wire-format.md),
   * one publish, one confirm and one delivery for all of them, which is most
   * of what the broker and both clients spend per event. 1: one binary-mode
   * message per event, for consumers that cannot read a batch (any txbox
   * inbox reads both).
   * @default 100
   */
  readonly batchMessages?: number
  /** Most bytes of events in one batch message; an event larger than this goes alone. @default 131072 */
  readonly batchBytes?: number
  /**
   * `x-expires` of the per-attempt retry delay queues, so those a consumer no
   * longer uses disappear. Retry delays are capped at half of it. @default "1 day"
   */
  readonly retryQueueExpiry?: Duration.Input
  /**
   * Fail building the layer when the first round of connection attempts (each
   * URL once) fails (for one-shot tools). Otherwise the layer starts
   * disconnected, `publish` fails fast with `TransportError`, and it keeps
   * reconnecting in the background.
   * @default false
   */
  readonly failFast?: boolean
}

/** The settings of `AmqpTransport.layer`: the broker's URL (or a cluster's URLs) and the options. */
export type AmqpTransportConfig = AmqpTransportOptions & BrokerUrls

/** The config with every default applied and every value checked. */
export interface ResolvedConfig {
  /** At least one; one connection at a time, to the next of them in round robin. */
  readonly urls: ReadonlyArray<string>
  readonly exchange: string
  readonly source: string
  readonly publishWindow: number
  readonly publishTimeoutMs: number
  readonly queueType: "quorum" | "classic"
  readonly deliveryLimit: number
  readonly reconnect: Schedule.Schedule<Duration.Duration>
  /** Pause after a lost connection before the first reconnect attempt. */
  readonly reconnectInitialMs: number
  readonly heartbeatSeconds: number
  readonly connectTimeoutMs: number
  readonly maxMessageSize: number
  readonly batchMessages: number
  readonly batchBytes: number
  readonly retryQueueExpiryMs: number
  readonly failFast: boolean
}

export const defaults = {
  exchange: "txbox.events",
  source: "txbox",
  publishWindow: 2000,
  publishTimeout: "10 seconds",
  queueType: "quorum",
  deliveryLimit: 20,
  reconnect: { initialDelay: "500 millis", factor: 2, maxDelay: "30 seconds" },
  heartbeat: "30 seconds",
  connectTimeout: "10 seconds",
  maxMessageSize: 134_217_728,
  batchMessages: 100,
  batchBytes: 131_072,
  retryQueueExpiry: "1 day",
  failFast: false,
} as const

const millis = (name: string, input: Duration.Input, min: number): number => {
  const duration = Option.getOrUndefined(Duration.fromInput(input))
  const value = duration === undefined ? Number.NaN : Duration.toMillis(duration)
  if (!(value >= min) || !Number.isFinite(value)) {
    throw new ConfigError({ reason: `amqp ${name} must be a finite duration >= ${min} ms` })
  }
  return value
}

const positiveInteger = (name: string, value: number, max = Number.MAX_SAFE_INTEGER): number => {
  if (!Number.isInteger(value) || value < 1 || value > max) {
    throw new ConfigError({ reason: `amqp ${name} must be an integer in [1, ${max}], got ${value}` })
  }
  return value
}

/** `name` names the option in the error: `url`, or `urls[i]`. */
const checkUrl = (name: string, url: unknown): string => {
  let protocol: string
  try {
    if (typeof url !== "string") throw new TypeError("not a string")
    protocol = new URL(url).protocol
  } catch {
    // Never echo the URL: it may carry a password.
    throw new ConfigError({ reason: `amqp ${name} is not a valid URL` })
  }
  if (protocol !== "amqp:" && protocol !== "amqps:") {
    throw new ConfigError({ reason: `amqp ${name} must use amqp: or amqps:, got ${protocol}` })
  }
  return url
}

/** `url` or `urls`, exactly one, as a non-empty list. */
const checkUrls = (config: AmqpTransportConfig): ReadonlyArray<string> => {
  const { url, urls } = config as { readonly url?: unknown; readonly urls?: unknown }
  if (url !== undefined && urls !== undefined) {
    throw new ConfigError({
      reason: "amqp url and urls are exclusive: give one broker URL or a cluster's URLs",
    })
  }
  if (urls === undefined) {
    if (url === undefined) throw new ConfigError({ reason: "amqp url (or urls, for a cluster) is required" })
    return [checkUrl("url", url)]
  }
  if (!Array.isArray(urls) || urls.length === 0) {
    throw new ConfigError({ reason: "amqp urls must be a non-empty array of broker URLs" })
  }
  return urls.map((each, i) => checkUrl(`urls[${i}]`, each))
}

const resolveUnsafe = (config: AmqpTransportConfig): ResolvedConfig => {
  const exchange = config.exchange ?? defaults.exchange
  if (exchange === "" || exchange.length > 255) {
    throw new ConfigError({ reason: "amqp exchange must be a non-empty name of at most 255 characters" })
  }
  const source = config.source ?? defaults.source
  if (source === "") throw new ConfigError({ reason: "amqp source must not be empty" })
  const queueType = config.queueType ?? defaults.queueType
  if (queueType !== "quorum" && queueType !== "classic") {
    throw new ConfigError({
      reason: `amqp queueType must be "quorum" or "classic", got ${String(queueType)}`,
    })
  }
  const reconnect = { ...defaults.reconnect, ...config.reconnect }
  // One backoff policy for the whole library (Retry.ts), jittered by Schedule.jittered.
  const policy = makeRetryPolicy({ ...defaultRetryPolicy, ...reconnect, jitter: true })
  const heartbeatMs = millis("heartbeat", config.heartbeat ?? defaults.heartbeat, 0)
  return {
    urls: checkUrls(config),
    exchange,
    source,
    publishWindow: positiveInteger("publishWindow", config.publishWindow ?? defaults.publishWindow),
    publishTimeoutMs: millis("publishTimeout", config.publishTimeout ?? defaults.publishTimeout, 1),
    queueType,
    deliveryLimit: positiveInteger(
      "deliveryLimit",
      config.deliveryLimit ?? defaults.deliveryLimit,
      1_000_000,
    ),
    reconnect: schedule(policy),
    reconnectInitialMs: millis("reconnect.initialDelay", reconnect.initialDelay, 0),
    // AMQP counts heartbeats in whole seconds; only an explicit 0 disables them.
    heartbeatSeconds: heartbeatMs === 0 ? 0 : Math.max(1, Math.round(heartbeatMs / 1000)),
    connectTimeoutMs: millis("connectTimeout", config.connectTimeout ?? defaults.connectTimeout, 1),
    maxMessageSize: positiveInteger("maxMessageSize", config.maxMessageSize ?? defaults.maxMessageSize),
    batchMessages: positiveInteger("batchMessages", config.batchMessages ?? defaults.batchMessages, 65_535),
    batchBytes: positiveInteger("batchBytes", config.batchBytes ?? defaults.batchBytes),
    retryQueueExpiryMs: millis(
      "retryQueueExpiry",
      config.retryQueueExpiry ?? defaults.retryQueueExpiry,
      60_000,
    ),
    failFast: config.failFast ?? defaults.failFast,
  }
}

/** Applies the defaults and validates once; a bad value is a `ConfigError`, never a silent clamp. */
export const resolveConfig = (config: AmqpTransportConfig): Effect.Effect<ResolvedConfig, ConfigError> =>
  Effect.try({
    try: () => resolveUnsafe(config),
    catch: (error) =>
      error instanceof ConfigError
        ? error
        : new ConfigError({ reason: `invalid amqp config: ${String(error)}` }),
  })
