/**
 * The broker port. The relay publishes through it and the inbox consumes
 * through it; `txbox/amqp` (RabbitMQ) and `txbox/testing` (in-process) provide it.
 * Nothing here names a driver.
 */
import { Context, type Effect, type Scope } from "effect"
import type { TransportError } from "../Errors.ts"

/**
 * A message's place in its partition key's sequence, assigned at enqueue: 1,
 * 2, 3, … in the order the enqueueing transactions committed.
 */
export interface PartitionPosition {
  /** When the key's counter was created (ms since 1970). A counter created anew starts a newer epoch at 1. */
  readonly epoch: number
  /** Its number in the epoch: 1, 2, 3, … with no gap. */
  readonly seq: number
  /**
   * The number of this key's last message before this one that the consumer
   * receives and must handle first (0: none). Set by the inbox from the
   * message's routes (`core/keyRoutes.ts`); absent, `seq − 1`.
   */
  readonly after?: number
  /**
   * When `after` was enqueued (ms, the producer database's clock). A consumer
   * whose cursor for the key was purged as idle (`txbox purge --idle-keys`)
   * does not wait for a predecessor enqueued before the purge's horizon: it
   * may have been handled already, its cursor forgotten.
   */
  readonly afterAtMs?: number
}

/** One message as the relay hands it to the broker. `body` is the JSON text of the payload. */
export interface OutgoingMessage {
  /** The message id: the AMQP `messageId`, and the consumers' dedupe key. */
  readonly id: string
  /** The event type (the CloudEvents `type`). */
  readonly type: string
  /** The contract version the body was written as. */
  readonly version: number
  /** Routing key on the topic exchange; the event type unless overridden at enqueue. */
  readonly routingKey: string
  /** The payload as JSON text, sent as is. */
  readonly body: string
  /** String headers from enqueue (`traceparent` among them). */
  readonly headers: Readonly<Record<string, string>>
  /** When it was enqueued: the CloudEvents `time`. */
  readonly occurredAt: Date
  /** The ordering key it was enqueued with; null for an unordered message. */
  readonly partitionKey: string | null
  /** Set for a message enqueued with a partition key. */
  readonly position?: PartitionPosition | null
  /** The tenant it was enqueued for, if any. */
  readonly tenantId: string | null
}

/**
 * What became of one message of a batch. Only `Confirmed` means the broker
 * took responsibility for it; everything else is retried or dead-lettered.
 */
export type PublishOutcome =
  | { readonly _tag: "Confirmed" }
  /** The broker refused it (`basic.nack`), or the transport could not encode it this time; transient. */
  | { readonly _tag: "Nacked"; readonly error: string }
  /** No queue would receive it (`mandatory` returned it); retried, then dead. */
  | { readonly _tag: "Returned"; readonly error: string }
  /** No confirm within the publish timeout (a blocked broker, a half-open socket): an outage, never counts against maxAttempts. */
  | { readonly _tag: "TimedOut"; readonly error: string }
  /** The channel or connection failed while it was in flight; transient, never counts against maxAttempts. */
  | { readonly _tag: "Interrupted"; readonly error: string }
  /** The message itself can never be published (e.g. larger than the broker accepts); dead at once. */
  | { readonly _tag: "Rejected"; readonly error: string }

/** One delivery as the inbox sees it: raw, not yet validated. */
export interface Delivery {
  /** AMQP `messageId` (the event id); absent on a foreign message that did not set it. */
  readonly messageId: string | undefined
  /** CloudEvents type, from the AMQP `type` property or `cloudEvents:type`. */
  readonly type: string | undefined
  /** Contract version from the `txbox-version` header. */
  readonly version: number | undefined
  /** The body as text (JSON, for a txbox producer). */
  readonly body: string
  /** The body's bytes as received, when the transport has them: kept (base64) if the message ends dead and is not valid text. */
  readonly bodyBytes?: Uint8Array
  /** All application properties/headers as strings (non-strings are JSON-encoded). */
  readonly headers: Readonly<Record<string, string>>
  /** The producer's partition key, when it sent one. */
  readonly partitionKey: string | undefined
  /** The message's place in its partition key's sequence, when the producer sent one. */
  readonly position?: PartitionPosition
  /** The producer's tenant id, when it sent one. */
  readonly tenantId: string | undefined
  /** 1 on first delivery; grows each time the message comes back from a retry delay. */
  readonly attempt: number
  /** The broker says it may have been delivered before (lost ack, consumer crash). */
  readonly redelivered: boolean
  /**
   * Set when the broker gave up on the message and dead-lettered it (e.g. it
   * came back to its queue more than the delivery limit allows): why. The
   * consumer records it dead instead of handling it.
   */
  readonly deadLettered?: string
}

/**
 * What the consumer decided: settle it, or bring it back after a delay. A
 * retry counts an attempt (the next delivery's `attempt` is one more) unless
 * `spendsAttempt` is false: the consumer's database was away, not the
 * message at fault.
 */
export type DeliveryDecision =
  | { readonly _tag: "Ack" }
  | { readonly _tag: "Retry"; readonly delayMs: number; readonly spendsAttempt?: boolean }

/** Several deliveries that came together (the events of one batch message): a decision each, in their order. */
export type HandleMany = (
  deliveries: ReadonlyArray<Delivery>,
) => Effect.Effect<ReadonlyArray<DeliveryDecision>>

/** What `TransportShape.subscribe` consumes: the consumer's queue, the event types bound to it, and its prefetch. */
export interface SubscribeOptions {
  /** Names the consumer's queue; one queue per consumer. */
  readonly consumer: string
  /** Event types (routing keys) bound to the queue. */
  readonly types: ReadonlyArray<string>
  /** Unacknowledged deliveries in flight at once. */
  readonly prefetch: number
}

/**
 * Who the transport is, in OpenTelemetry's messaging semantic conventions: the
 * inbox puts these on its `process` spans (`Inbox.handle`).
 */
export interface MessagingIdentity {
  /** `messaging.system`, e.g. `rabbitmq`. */
  readonly system: string
  /** `messaging.destination.name`: for RabbitMQ, the exchange. */
  readonly destination: string
}

/** What the `Transport` service does: publish the relay's batches with per-message outcomes, and consume a queue for the inbox. */
export interface TransportShape {
  /**
   * Publishes a whole batch with every message in flight at once; one outcome
   * per message, in input order. Fails with `TransportError` only when nothing
   * could be attempted (no connection); per-message trouble is an outcome.
   */
  readonly publish: (
    messages: ReadonlyArray<OutgoingMessage>,
  ) => Effect.Effect<ReadonlyArray<PublishOutcome>, TransportError>
  /**
   * Consumes the consumer's queue until the scope closes. `handle` runs for
   * each delivery (up to `prefetch` at once); the transport acks or schedules
   * the retry only after `handle` completes. Closing the scope stops new
   * deliveries and waits for those in flight.
   */
  readonly subscribe: (
    options: SubscribeOptions,
    handle: (delivery: Delivery) => Effect.Effect<DeliveryDecision>,
    /**
     * Several deliveries that came together (the events of one batch message): one decision
     * each, in their order. A transport that receives such groups uses it when given, else
     * `handle` for each.
     */
    handleMany?: HandleMany,
  ) => Effect.Effect<void, TransportError, Scope.Scope>
  /** Whether the transport currently holds a live connection (for health checks). */
  readonly isConnected: Effect.Effect<boolean>
  /**
   * When (`Date.now()`) the broker last closed the connection because it was stopping; undefined:
   * never, or a transport that cannot tell. A broker confirms a message routed to a queue that
   * stops meanwhile as if the queue took it (rabbitmq-server#1877), so what it confirmed shortly
   * before it stopped may be missing from some queues: the relay publishes that again.
   */
  readonly brokerStoppedAt?: () => number | undefined
  /** Its OpenTelemetry messaging identity, for span attributes; absent for an in-process transport. */
  readonly messaging?: MessagingIdentity
}

// The base class in a variable with its type spelled out: JSR's fast check infers no type from a call.
// `@internal` sits on the name: deno doc reads a variable's tags there, not before `const`.
const /** @internal */ TransportService: Context.ServiceClass<Transport, "txbox/Transport", TransportShape> =
    Context.Service<Transport, TransportShape>()("txbox/Transport")
/** The broker port: the service the relay publishes through and the inbox consumes through, provided by `txbox/amqp` or `txbox/memory`. */
export class Transport extends TransportService {}
