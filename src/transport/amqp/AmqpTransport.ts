/**
 * The RabbitMQ transport: provides the `Transport` port with amqplib.
 *
 * - one connection per layer, reconnected in the background with backoff; to
 *   a cluster, given its nodes' `urls`, to the next node in round robin;
 * - one confirm channel for publishing, every message of a batch in flight at
 *   once (bounded by `publishWindow`), `mandatory` so unroutable messages come
 *   back as `Returned` instead of counting as sent; a batch's events of one
 *   routing key go as one CloudEvents batch message (batch.ts, `batchMessages`);
 * - one channel per subscription, manual acks, retries through delay queues.
 *
 * Topology: a durable topic exchange; each consumer owns a durable queue
 * `txbox.<consumer>` (quorum by default, leaders spread over a cluster's
 * nodes) bound to its event types, declared when it subscribes or ahead of
 * time with `declareTopology` (topology.ts).
 *
 * Tracing: the batch is a CLIENT span, each message a PRODUCER span whose
 * context is sent as its `traceparent` (OpenTelemetry messaging conventions).
 */
import { Effect, Exit, Layer, Scope, Semaphore, type Tracer } from "effect"
import { isTracing, parentFromTraceparent, traceparentOf } from "../../core/trace.ts"
import type { ConfigError, TransportError } from "../../Errors.ts"
import {
  type OutgoingMessage,
  type PublishOutcome,
  Transport,
  type TransportShape,
} from "../../ports/Transport.ts"
import { type EncodedBatches, encodeBatches } from "./batch.ts"
import { type AmqpTransportConfig, type ResolvedConfig, resolveConfig } from "./config.ts"
import { ConfirmPublisher } from "./confirms.ts"
import { type Connection, type Live, makeConnection, openConfirmChannel, rpc } from "./connection.ts"
import { makeSubscribe } from "./subscriber.ts"
import { type EncodeResult, encodeMessage, Headers } from "./wire.ts"

export {
  type ConsumerTopology,
  type DeclaredTopology,
  type DeclareTopologyOptions,
  declareTopology,
} from "./topology.ts"

const PUBLISH = "AmqpTransport.publish"

/**
 * Opens the publishing channel on `live` and declares the exchange, once per
 * channel: publishing to an exchange that does not exist would close it.
 */
const openPublisher = (live: Live, config: ResolvedConfig): Effect.Effect<ConfirmPublisher, TransportError> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.gen(function* () {
      // A scope of its own inside the connection's, so a failed attempt leaves nothing behind.
      const scope = yield* Scope.fork(live.scope)
      const exit = yield* Effect.exit(
        restore(
          Effect.gen(function* () {
            const publisher = yield* openConfirmChannel(
              live,
              scope,
              {
                // Room for the whole window in the write buffer: `drain` waits only when the socket is really behind.
                highWaterMark: Math.max(1024, config.publishWindow),
                timeoutMs: config.publishTimeoutMs,
                operation: PUBLISH,
              },
              (channel) =>
                new ConfirmPublisher(channel, {
                  window: config.publishWindow,
                  timeoutMs: config.publishTimeoutMs,
                  maxMessageSize: config.maxMessageSize,
                }),
            )
            yield* rpc(PUBLISH, config.publishTimeoutMs, () =>
              publisher.channel.assertExchange(config.exchange, "topic", { durable: true }),
            )
            return publisher
          }),
        ),
      )
      if (Exit.isFailure(exit)) {
        yield* Scope.close(scope, exit)
        return yield* Effect.failCause(exit.cause)
      }
      return exit.value
    }),
  )

const makePublish = (
  connection: Connection,
  config: ResolvedConfig,
  lock: Semaphore.Semaphore,
): TransportShape["publish"] => {
  /** The open publisher of the current connection, (re)opened under a lock so concurrent batches share one. */
  const publisher: Effect.Effect<ConfirmPublisher, TransportError> = Effect.suspend(() => {
    const live = connection.current()
    if (live === undefined) return Effect.fail(connection.notConnected(PUBLISH))
    if (live.publisher?.isOpen) return Effect.succeed(live.publisher)
    return lock.withPermits(1)(
      Effect.suspend(() => {
        if (connection.current() !== live) return Effect.fail(connection.notConnected(PUBLISH))
        if (live.publisher?.isOpen) return Effect.succeed(live.publisher)
        return openPublisher(live, config).pipe(
          Effect.tap((opened) =>
            Effect.sync(() => {
              live.publisher = opened
            }),
          ),
        )
      }),
    )
  })

  const system = { "messaging.system": "rabbitmq", "messaging.destination.name": config.exchange }
  const messageSpanName = `publish ${config.exchange}`

  /**
   * One PRODUCER span per message (OpenTelemetry messaging conventions, a
   * `send`): a child of the span that enqueued it (its stored `traceparent`),
   * linked to the batch's span, and sent on the wire as the message's
   * `traceparent`, so the consumer's `process` span is its child and producer,
   * relay and consumer share one trace.
   */
  const messageSpans = (
    messages: ReadonlyArray<OutgoingMessage>,
  ): Effect.Effect<ReadonlyArray<Tracer.Span>> =>
    Effect.gen(function* () {
      const batch = yield* Effect.option(Effect.currentSpan)
      const links = batch._tag === "Some" ? [{ span: batch.value, attributes: {} }] : []
      const spans = new Array<Tracer.Span>(messages.length)
      for (let i = 0; i < messages.length; i++) {
        const message = messages[i]!
        const parent = parentFromTraceparent(message.headers[Headers.traceparent])
        spans[i] = yield* Effect.makeSpan(messageSpanName, {
          kind: "producer",
          links,
          ...(parent === undefined ? {} : { parent }),
          attributes: {
            ...system,
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "messaging.message.id": message.id,
            "messaging.rabbitmq.destination.routing_key": message.routingKey,
            "txbox.type": message.type,
          },
        })
      }
      return spans
    })

  /** Each message with its PRODUCER span's traceparent in place of the stored one. */
  const sentUnder = (
    messages: ReadonlyArray<OutgoingMessage>,
    spans: ReadonlyArray<Tracer.Span>,
  ): ReadonlyArray<OutgoingMessage> =>
    messages.map((message, i) => {
      const traceparent = traceparentOf(spans[i]!)
      return traceparent === undefined
        ? message
        : { ...message, headers: { ...message.headers, [Headers.traceparent]: traceparent } }
    })

  // Never a batch the publisher would refuse whole: only an event too large alone is Rejected.
  const limits = { messages: config.batchMessages, bytes: Math.min(config.batchBytes, config.maxMessageSize) }
  /** The publish arguments; with batching, several events per message (batch.ts). */
  const encode = (messages: ReadonlyArray<OutgoingMessage>): EncodedBatches => {
    if (config.batchMessages > 1) return encodeBatches(messages, config.source, limits)
    const items = new Array<EncodeResult>(messages.length)
    for (let i = 0; i < messages.length; i++) items[i] = encodeMessage(messages[i]!, config.source)
    return { items, members: [] }
  }

  const endSpans = (
    spans: ReadonlyArray<Tracer.Span>,
    outcomes: ReadonlyArray<PublishOutcome> | undefined,
  ): Effect.Effect<void> =>
    Effect.clockWith((clock) =>
      Effect.sync(() => {
        const now = clock.currentTimeNanosUnsafe()
        for (let i = 0; i < spans.length; i++) {
          const outcome = outcomes?.[i]
          const span = spans[i]!
          if (outcome?._tag === "Confirmed") span.end(now, Exit.void)
          else {
            span.attribute("error.type", outcome?._tag ?? "Interrupted")
            span.end(now, Exit.fail(outcome?.error ?? "interrupted before the broker confirmed it"))
          }
        }
      }),
    )

  // Combinators, not Effect.gen: once per batch, and JavaScriptCore kept recompiling the generator
  // body for as long as the relay ran (core/inboxConsumer.ts says more).
  const publishBatch = (
    messages: ReadonlyArray<OutgoingMessage>,
    tracing: boolean,
  ): Effect.Effect<ReadonlyArray<PublishOutcome>, TransportError> => {
    if (messages.length === 0) return Effect.succeed([])
    const send = (
      target: ConfirmPublisher,
      spans: ReadonlyArray<Tracer.Span>,
      outgoing: ReadonlyArray<OutgoingMessage>,
    ) =>
      Effect.callback<ReadonlyArray<PublishOutcome>>((resume) => {
        const { items, members } = encode(outgoing)
        const batch = target.publish(config.exchange, items, (outcomes) =>
          // A batch message's outcome is each of its events'.
          resume(
            Effect.succeed(members.length === 0 ? outcomes : perEvent(outcomes, members, outgoing.length)),
          ),
        )
        return Effect.sync(() => target.abandon(batch))
      }).pipe(Effect.onExit((exit) => endSpans(spans, Exit.isSuccess(exit) ? exit.value : undefined)))
    // Without a tracer no span per message: the stored traceparent (the producer's) goes as it is.
    if (!tracing) return Effect.flatMap(publisher, (target) => send(target, [], messages))
    return Effect.annotateCurrentSpan("messaging.batch.message_count", messages.length).pipe(
      Effect.andThen(publisher),
      Effect.flatMap((target) =>
        Effect.flatMap(messageSpans(messages), (spans) => send(target, spans, sentUnder(messages, spans))),
      ),
    )
  }

  // A CLIENT span for the batch (its messages' own spans are the PRODUCER ones).
  const span = {
    kind: "client",
    attributes: { ...system, "messaging.operation.type": "send", "messaging.operation.name": "publish" },
  } as const
  return (messages: ReadonlyArray<OutgoingMessage>) =>
    Effect.flatMap(isTracing, (tracing) =>
      tracing ? Effect.withSpan(publishBatch(messages, true), PUBLISH, span) : publishBatch(messages, false),
    )
}

/** Outcomes per batch message spread over the events each carried, in the events' order. */
const perEvent = (
  outcomes: ReadonlyArray<PublishOutcome>,
  members: ReadonlyArray<ReadonlyArray<number>>,
  count: number,
): ReadonlyArray<PublishOutcome> => {
  const each = new Array<PublishOutcome>(count)
  for (let i = 0; i < members.length; i++) for (const at of members[i]!) each[at] = outcomes[i]!
  return each
}

/**
 * Builds the transport in the current scope: closing the scope stops the
 * reconnect loop and closes every channel and the connection.
 */
export const make = (
  config: AmqpTransportConfig,
): Effect.Effect<TransportShape, TransportError | ConfigError, Scope.Scope> =>
  Effect.gen(function* () {
    const resolved = yield* resolveConfig(config)
    const connection = yield* makeConnection(resolved)
    const lock = yield* Semaphore.make(1)
    return Transport.of({
      publish: makePublish(connection, resolved, lock),
      subscribe: makeSubscribe(connection, resolved),
      isConnected: Effect.sync(() => connection.current() !== undefined),
      brokerStoppedAt: connection.brokerStoppedAt,
      messaging: { system: "rabbitmq", destination: resolved.exchange },
    })
  })

/**
 * The `Transport` on RabbitMQ. Fails with `ConfigError` for an invalid config;
 * with `TransportError` only when `failFast` is set and the broker cannot be
 * reached at start.
 */
export const layer = (config: AmqpTransportConfig): Layer.Layer<Transport, TransportError | ConfigError> =>
  Layer.effect(Transport, make(config))
