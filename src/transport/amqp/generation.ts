/**
 * A subscription's generation: its confirm channel with the acks coalesced on
 * it and the publisher for retry copies. A generation lasts until its channel
 * or connection is lost; the subscription then opens the next one.
 */
import type { ConfirmChannel, ConsumeMessage } from "amqplib"
import { Deferred, Effect, Scope } from "effect"
import type { TransportError } from "../../Errors.ts"
import { AckCoalescer } from "./acks.ts"
import { ConfirmPublisher } from "./confirms.ts"
import { type Live, openConfirmChannel } from "./connection.ts"

/** One channel's worth of consuming; replaced after the channel or connection is lost. */
export interface Generation {
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

export interface GenerationOptions {
  readonly timeoutMs: number
  readonly operation: string
  /** Most unconfirmed retry copies on the channel at once. */
  readonly publishWindow: number
  readonly maxMessageSize: number
}

/**
 * Opens a generation's confirm channel in `scope` (closed with it). Acks still
 * waiting for the end of the turn are flushed before the channel closes.
 */
export const openGeneration = (
  live: Live,
  scope: Scope.Closeable,
  options: GenerationOptions,
): Effect.Effect<Generation, TransportError> =>
  Effect.gen(function* () {
    const generation = yield* openConfirmChannel(
      live,
      scope,
      { highWaterMark: 1024, timeoutMs: options.timeoutMs, operation: options.operation },
      (channel) => watchChannel(channel, scope, options),
    )
    // Added after the channel's own finalizer, so it runs first: acks still waiting for the end
    // of the turn go out before the channel closes (else the broker redelivers them).
    yield* Scope.addFinalizer(
      scope,
      Effect.sync(() => onChannel(generation, () => generation.acks.flush())),
    )
    return generation
  })

/** Builds the generation of a channel just opened, with its listeners attached at once. */
const watchChannel = (
  channel: ConfirmChannel,
  scope: Scope.Closeable,
  options: GenerationOptions,
): Generation => {
  const lost = Deferred.makeUnsafe<unknown>()
  let lastError: unknown
  const acks = new AckCoalescer(channel, (flush) => setImmediate(() => onChannel(generation, flush)))
  const generation: Generation = {
    channel,
    publisher: new ConfirmPublisher(channel, {
      window: options.publishWindow,
      timeoutMs: options.timeoutMs,
      maxMessageSize: options.maxMessageSize,
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
}

/**
 * Settles on the channel while it is open. A closed channel cannot ack or nack: the broker
 * redelivers what was not settled, so a failure here loses nothing.
 */
export const onChannel = (generation: Generation, settle: () => void): void => {
  if (!generation.open) return
  try {
    settle()
  } catch {}
}

/** Acks `message` with the others of this turn of the event loop. */
export const ack = (generation: Generation, message: ConsumeMessage): void =>
  onChannel(generation, () => generation.acks.ack(message))

/** Gives `message` back to its queue now; the broker counts a delivery. */
export const requeue = (generation: Generation, message: ConsumeMessage): void =>
  onChannel(generation, () => {
    generation.acks.settled(message)
    generation.channel.nack(message, false, true)
  })
