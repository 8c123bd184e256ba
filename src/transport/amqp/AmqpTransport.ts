/**
 * The RabbitMQ transport: provides the `Transport` port with amqplib.
 *
 * - one connection per layer, reconnected in the background with backoff;
 * - one confirm channel for publishing, every message of a batch in flight at
 *   once (bounded by `publishWindow`), `mandatory` so unroutable messages come
 *   back as `Returned` instead of counting as sent;
 * - one channel per subscription, manual acks, retries through delay queues.
 *
 * Topology: a durable topic exchange; each consumer owns a durable queue
 * `txbox.<consumer>` (quorum by default) bound to its event types.
 */
import { Effect, Exit, Layer, Scope, Semaphore } from "effect"
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
import { type EncodeResult, encodeMessage } from "./wire.ts"

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

  return Effect.fn(PUBLISH)(function* (messages: ReadonlyArray<OutgoingMessage>) {
    if (messages.length === 0) return []
    yield* Effect.annotateCurrentSpan("messages", messages.length)
    const target = yield* publisher
    const items = new Array<EncodeResult>(messages.length)
    for (let i = 0; i < messages.length; i++) items[i] = encodeMessage(messages[i]!, config.source)
    return yield* Effect.callback<ReadonlyArray<PublishOutcome>>((resume) => {
      const batch = target.publish(config.exchange, items, (outcomes) => resume(Effect.succeed(outcomes)))
      return Effect.sync(() => target.abandon(batch))
    })
  })
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
    })
  })

/**
 * The `Transport` on RabbitMQ. Fails with `ConfigError` for an invalid config;
 * with `TransportError` only when `failFast` is set and the broker cannot be
 * reached at start.
 */
export const layer = (config: AmqpTransportConfig): Layer.Layer<Transport, TransportError | ConfigError> =>
  Layer.effect(Transport, make(config))
