/**
 * The RabbitMQ transport: provides the `Transport` port with amqplib.
 *
 * - one connection per layer, reconnected in the background with backoff; to
 *   a cluster, given its nodes' `urls`, to the next node in round robin;
 * - one confirm channel for publishing, every message of a batch in flight at
 *   once (bounded by `publishWindow`), `mandatory` so unroutable messages come
 *   back as `Returned` instead of counting as sent;
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
    items: Array<EncodeResult>,
  ): Effect.Effect<ReadonlyArray<Tracer.Span>> =>
    Effect.gen(function* () {
      const batch = yield* Effect.option(Effect.currentSpan)
      const links = batch._tag === "Some" ? [{ span: batch.value, attributes: {} }] : []
      const spans = new Array<Tracer.Span>(messages.length)
      for (let i = 0; i < messages.length; i++) {
        const message = messages[i]!
        const parent = parentFromTraceparent(message.headers[Headers.traceparent])
        const span = yield* Effect.makeSpan(messageSpanName, {
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
        spans[i] = span
        const item = items[i]!
        const traceparent = traceparentOf(span)
        if (item._tag === "Encoded" && traceparent !== undefined) {
          ;(item.message.options.headers as Record<string, unknown>)[Headers.traceparent] = traceparent
        }
      }
      return spans
    })

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
    const items = new Array<EncodeResult>(messages.length)
    for (let i = 0; i < messages.length; i++) items[i] = encodeMessage(messages[i]!, config.source)
    const send = (target: ConfirmPublisher, spans: ReadonlyArray<Tracer.Span>) =>
      Effect.callback<ReadonlyArray<PublishOutcome>>((resume) => {
        const batch = target.publish(config.exchange, items, (outcomes) => resume(Effect.succeed(outcomes)))
        return Effect.sync(() => target.abandon(batch))
      }).pipe(Effect.onExit((exit) => endSpans(spans, Exit.isSuccess(exit) ? exit.value : undefined)))
    // Without a tracer no span per message: the stored traceparent (the producer's) goes as it is.
    if (!tracing) return Effect.flatMap(publisher, (target) => send(target, []))
    return Effect.annotateCurrentSpan("messaging.batch.message_count", messages.length).pipe(
      Effect.andThen(publisher),
      Effect.flatMap((target) =>
        Effect.flatMap(messageSpans(messages, items), (spans) => send(target, spans)),
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
