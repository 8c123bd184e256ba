/**
 * An in-process broker behind the `Transport` port, for tests and the demo.
 * It keeps RabbitMQ's contract where it matters to txbox — at-least-once
 * delivery, unroutable messages come back as `Returned`, retries come back
 * after their delay with the attempt counted — and can misbehave on demand:
 * duplicate deliveries, lost acks (a processed message is delivered again),
 * and failed publishes.
 */
import { Effect, Layer, Queue, type Scope } from "effect"
import { PARTITION_EPOCH_HEADER, PARTITION_SEQ_HEADER } from "../../core/position.ts"
import { TransportError } from "../../Errors.ts"
import {
  type Delivery,
  type DeliveryDecision,
  type OutgoingMessage,
  type PublishOutcome,
  type SubscribeOptions,
  Transport,
  type TransportShape,
} from "../../ports/Transport.ts"

/** The broker's fault switches, all off by default: set them at `makeBroker`, change them with `setFaults`. */
export interface MemoryFaults {
  /**
   * Probability that a delivery is delivered a second time. The copy is never copied again, so
   * 1 delivers every message exactly twice. @default 0
   */
  readonly duplicateRate?: number
  /** Probability that an ack is lost, so the message is redelivered after it was processed. @default 0 */
  readonly lostAckRate?: number
  /** Probability that a published message is nacked. @default 0 */
  readonly publishFailureRate?: number
  /** While true, `publish` fails as if the broker were unreachable. @default false */
  readonly down?: boolean
  /**
   * Delivers each published batch in a random order (using `random`), as a
   * broker with several relays, retries and redeliveries may: for tests of
   * per-key order. @default false
   */
  readonly shuffle?: boolean
}

/** Options of `makeBroker` and `layer`: the initial faults, and the randomness they draw on. */
export interface MemoryTransportOptions extends MemoryFaults {
  /** Source of randomness for the fault switches; seed it for reproducible runs. @default Math.random */
  readonly random?: () => number
}

/** What the broker did since it was made: counts, for a test's assertions. */
export interface MemoryStats {
  /** Messages confirmed and routed to at least one queue (once each, however many queues). */
  readonly published: number
  /** Deliveries handed to a consumer, redeliveries and duplicates included. */
  readonly delivered: number
  /** Deliveries repeated by `duplicateRate`. */
  readonly duplicatesInjected: number
  /** Acks dropped by `lostAckRate`, each a redelivery. */
  readonly acksLost: number
  /** Publishes nacked by `publishFailureRate`. */
  readonly publishFailuresInjected: number
}

/** What `makeBroker` gives: the `Transport` port, plus the controls a test steers and reads it with. */
export interface MemoryBroker {
  /** The port itself. */
  readonly transport: TransportShape
  /** Changes the fault switches while running. */
  readonly setFaults: (faults: MemoryFaults) => void
  /** Declares a consumer's queue and bindings ahead of `subscribe`, so early publishes are kept. */
  readonly declare: (consumer: string, types: ReadonlyArray<string>) => void
  /** A snapshot of the counts so far. */
  readonly stats: () => MemoryStats
  /** Messages waiting in a consumer's queue. */
  readonly depth: (consumer: string) => number
}

interface Entry {
  readonly message: OutgoingMessage
  readonly attempt: number
  readonly redelivered: boolean
  /** A copy `duplicateRate` made: not copied again, or a rate of 1 would deliver forever. */
  readonly duplicate?: boolean
}

interface MemoryQueue {
  readonly types: Set<string>
  readonly items: Queue.Queue<Entry>
}

const toDelivery = (entry: Entry): Delivery => {
  const m = entry.message
  return {
    messageId: m.id,
    type: m.type,
    version: m.version,
    body: m.body,
    // As the AMQP transport hands them over: its own headers among the user's, as strings.
    headers: {
      ...m.headers,
      "txbox-version": String(m.version),
      ...(m.position
        ? {
            [PARTITION_EPOCH_HEADER]: String(m.position.epoch),
            [PARTITION_SEQ_HEADER]: String(m.position.seq),
          }
        : {}),
    },
    partitionKey: m.partitionKey ?? undefined,
    ...(m.position ? { position: m.position } : {}),
    tenantId: m.tenantId ?? undefined,
    attempt: entry.attempt,
    redelivered: entry.redelivered,
  }
}

/** A fresh broker with no queues: its handle, the transport plus test controls. */
export const makeBroker = (options: MemoryTransportOptions = {}): MemoryBroker => {
  const random = options.random ?? Math.random
  let faults: MemoryFaults = { ...options }
  const queues = new Map<string, MemoryQueue>()
  const stats = { published: 0, delivered: 0, duplicatesInjected: 0, acksLost: 0, publishFailuresInjected: 0 }
  const chance = (rate: number | undefined) => rate !== undefined && rate > 0 && random() < rate

  const declare = (consumer: string, types: ReadonlyArray<string>) => {
    const existing = queues.get(consumer)
    if (existing) {
      for (const t of types) existing.types.add(t)
      return existing
    }
    const queue: MemoryQueue = { types: new Set(types), items: Effect.runSync(Queue.unbounded<Entry>()) }
    queues.set(consumer, queue)
    return queue
  }
  const push = (queue: MemoryQueue, entry: Entry) => {
    Queue.offerUnsafe(queue.items, entry)
  }

  const publish = (messages: ReadonlyArray<OutgoingMessage>) =>
    Effect.suspend(() => {
      if (faults.down) {
        return Effect.fail(
          new TransportError({ reason: "connection", operation: "publish", cause: "broker is down" }),
        )
      }
      const order = messages.map((_, i) => i)
      if (faults.shuffle === true) {
        // Fisher–Yates on the delivery order; outcomes stay in the batch's order.
        for (let i = order.length - 1; i > 0; i--) {
          const j = Math.floor(random() * (i + 1))
          ;[order[i], order[j]] = [order[j]!, order[i]!]
        }
      }
      const outcomes: PublishOutcome[] = new Array(messages.length)
      for (const i of order) outcomes[i] = publishOne(messages[i]!)
      return Effect.succeed(outcomes)
    })

  const publishOne = (message: OutgoingMessage): PublishOutcome => {
    if (chance(faults.publishFailureRate)) {
      stats.publishFailuresInjected++
      return { _tag: "Nacked", error: "injected publish failure" }
    }
    const targets = [...queues.values()].filter((q) => q.types.has(message.routingKey))
    if (targets.length === 0)
      return { _tag: "Returned", error: `unroutable (NO_ROUTE): ${message.routingKey}` }
    for (const q of targets) push(q, { message, attempt: 1, redelivered: false })
    stats.published++
    return { _tag: "Confirmed" }
  }

  /** Acks or schedules the retry. The delay runs on Effect's Clock (TestClock in unit tests), in the subscription's scope. */
  const settle = (queue: MemoryQueue, entry: Entry, decision: DeliveryDecision, scope: Scope.Scope) => {
    if (decision._tag === "Retry") {
      const again = {
        ...entry,
        attempt: entry.attempt + (decision.spendsAttempt === false ? 0 : 1),
        redelivered: false,
      }
      return Effect.asVoid(
        Effect.forkIn(
          Effect.andThen(
            Effect.sleep(decision.delayMs),
            Effect.sync(() => push(queue, again)),
          ),
          scope,
        ),
      )
    }
    if (chance(faults.lostAckRate)) {
      stats.acksLost++
      push(queue, { ...entry, redelivered: true })
    }
    return Effect.void
  }

  const subscribe = (
    opts: SubscribeOptions,
    handle: (delivery: Delivery) => Effect.Effect<DeliveryDecision>,
  ) =>
    Effect.gen(function* () {
      const queue = declare(opts.consumer, opts.types)
      const scope = yield* Effect.scope
      const worker = Effect.gen(function* () {
        while (true) {
          const entry = yield* Queue.take(queue.items)
          // From here the delivery is ours: finish it even if the scope closes.
          yield* Effect.uninterruptible(
            Effect.gen(function* () {
              stats.delivered++
              if (entry.duplicate !== true && chance(faults.duplicateRate)) {
                stats.duplicatesInjected++
                push(queue, { ...entry, redelivered: true, duplicate: true })
              }
              yield* settle(queue, entry, yield* handle(toDelivery(entry)), scope)
            }),
          )
        }
      })
      for (let i = 0; i < Math.max(1, opts.prefetch); i++) yield* Effect.forkScoped(worker)
    })

  const transport: TransportShape = {
    publish,
    subscribe,
    isConnected: Effect.sync(() => !faults.down),
  }
  return {
    transport,
    setFaults: (next) => {
      faults = { ...faults, ...next }
    },
    declare: (consumer, types) => void declare(consumer, types),
    stats: () => ({ ...stats }),
    depth: (consumer) => {
      const q = queues.get(consumer)
      return q ? Queue.sizeUnsafe(q.items) : 0
    },
  }
}

/** A fresh in-memory broker as the `Transport` layer. */
export const layer = (options: MemoryTransportOptions = {}): Layer.Layer<Transport> =>
  Layer.succeed(Transport, makeBroker(options).transport)

/** Provides `Transport` from an existing broker, so a test can keep its control handle. */
export const layerFrom = (broker: MemoryBroker): Layer.Layer<Transport> =>
  Layer.succeed(Transport, broker.transport)
