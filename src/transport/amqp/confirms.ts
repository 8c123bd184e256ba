/**
 * Publisher confirms for a whole batch, with every message in flight at once.
 *
 * This is plain callback code on purpose: at 15–30k msg/s the per-message cost
 * matters, so there is no promise, fiber or closure per message. The channel's
 * `ack`/`nack`/`return`/`close`/`drain` events are handled by one listener each,
 * and messages are correlated by delivery tag (a confirm channel numbers its
 * publishes 1, 2, 3 …, exactly as amqplib does internally). The Effect side
 * wraps a batch in a single `Effect.callback`.
 */
import type { ConfirmChannel, Message } from "amqplib"
import { describeCause } from "../../Errors.ts"
import type { PublishOutcome } from "../../ports/Transport.ts"
import type { EncodeResult } from "./wire.ts"

export interface ConfirmPublisherOptions {
  /** Most unconfirmed messages on the channel at once. */
  readonly window: number
  /** A message unconfirmed this long after it was sent is `TimedOut`. */
  readonly timeoutMs: number
  /** Larger bodies are `Rejected` unsent (the broker would close the channel). */
  readonly maxMessageSize: number
}

// Shared: `Confirmed` carries nothing, so one object serves every message.
const CONFIRMED: PublishOutcome = { _tag: "Confirmed" }

class Batch {
  readonly outcomes: Array<PublishOutcome | undefined>
  remaining: number
  /** Index of the next message to send. */
  next = 0
  abandoned = false
  readonly exchange: string
  readonly items: ReadonlyArray<EncodeResult>
  readonly onDone: (outcomes: ReadonlyArray<PublishOutcome>) => void
  constructor(
    exchange: string,
    items: ReadonlyArray<EncodeResult>,
    onDone: (outcomes: ReadonlyArray<PublishOutcome>) => void,
  ) {
    this.exchange = exchange
    this.items = items
    this.onDone = onDone
    this.outcomes = new Array<PublishOutcome | undefined>(items.length)
    this.remaining = items.length
  }
}

/** One sent, unconfirmed message. */
class Entry {
  /** Set by `basic.return`, which the broker sends before the ack of the same message. */
  returned: string | undefined = undefined
  /** Other in-flight messages with the same id (rare: only if a caller reuses ids). */
  sameId: Entry | undefined = undefined
  readonly batch: Batch
  readonly index: number
  readonly messageId: string
  readonly size: number
  readonly sentAt: number
  constructor(batch: Batch, index: number, messageId: string, size: number, sentAt: number) {
    this.batch = batch
    this.index = index
    this.messageId = messageId
    this.size = size
    this.sentAt = sentAt
  }
}

/** An opaque handle on a batch handed to `publish`, for `abandon`. */
export interface BatchHandle {
  readonly _batch: unknown
}

export class ConfirmPublisher {
  /** Unconfirmed messages by delivery tag; a Map iterates in insertion (= send) order. */
  private readonly pending = new Map<number, Entry>()
  /** Unconfirmed messages by message id, for correlating returns. */
  private readonly byId = new Map<string, Entry>()
  /** Batches with messages not sent yet, waiting for window or socket room; FIFO. */
  private queue: Array<Batch> = []
  private nextTag = 1
  /** No unconfirmed message has a lower tag than this. */
  private lowestTag = 1
  private awaitingDrain = false
  private pumping = false
  private closed = false
  private lastError: unknown = undefined
  /** Last time a message was sent or a confirm arrived; a queue stalled longer than the timeout gives up. */
  private lastProgress = Date.now()
  private sweeper: ReturnType<typeof setInterval> | undefined = undefined

  readonly channel: ConfirmChannel
  private readonly options: ConfirmPublisherOptions

  constructor(channel: ConfirmChannel, options: ConfirmPublisherOptions) {
    this.channel = channel
    this.options = options
    channel.on("ack", this.onAck)
    channel.on("nack", this.onNack)
    channel.on("return", this.onReturn)
    channel.on("drain", this.onDrain)
    channel.on("error", this.onError)
    channel.on("close", this.onClose)
  }

  get isOpen(): boolean {
    return !this.closed
  }

  /** Messages sent and not yet confirmed. */
  get inFlight(): number {
    return this.pending.size
  }

  /**
   * Sends every message of `items` to `exchange` (as many at once as the window
   * allows) and calls `onDone` once with one outcome per item, in input order.
   * `onDone` may run synchronously, before `publish` returns.
   */
  publish(
    exchange: string,
    items: ReadonlyArray<EncodeResult>,
    onDone: (outcomes: ReadonlyArray<PublishOutcome>) => void,
  ): BatchHandle {
    const batch = new Batch(exchange, items, onDone)
    if (items.length === 0) {
      onDone([])
    } else if (this.closed) {
      this.failUnsent(batch, this.interrupted())
    } else {
      this.queue.push(batch)
      this.lastProgress = Date.now()
      this.pump()
      this.ensureSweeper()
    }
    return { _batch: batch }
  }

  /**
   * Forgets the caller of a batch (its fiber was interrupted): unsent messages
   * stay unsent; sent ones keep their window slots until the broker confirms them.
   */
  abandon(handle: BatchHandle): void {
    const batch = handle._batch as Batch
    batch.abandoned = true
    const at = this.queue.indexOf(batch)
    if (at >= 0) this.queue.splice(at, 1)
  }

  private pump(): void {
    if (this.pumping) return
    this.pumping = true
    try {
      const { window, maxMessageSize } = this.options
      const channel = this.channel
      const now = Date.now()
      while (this.queue.length > 0 && !this.awaitingDrain && !this.closed) {
        const batch = this.queue[0]!
        const items = batch.items
        while (batch.next < items.length && this.pending.size < window && !this.awaitingDrain) {
          const index = batch.next++
          const item = items[index]!
          if (item._tag === "Invalid") {
            this.settle(batch, index, { _tag: item.transient ? "Nacked" : "Rejected", error: item.error })
            continue
          }
          const message = item.message
          const size = message.content.length
          if (size > maxMessageSize) {
            this.settle(batch, index, {
              _tag: "Rejected",
              error: `message body of ${size} bytes exceeds maxMessageSize ${maxMessageSize}`,
            })
            continue
          }
          let writable: boolean
          try {
            writable = channel.publish(batch.exchange, message.routingKey, message.content, message.options)
          } catch (error) {
            if (isChannelGone(error)) {
              // Closing or closed: no confirm can come any more. Settle now rather
              // than wait for a `close` event that may already have been emitted.
              batch.next = index
              this.lastError ??= error
              this.onClose()
              return
            }
            // amqplib validates and encodes before writing anything (e.g. a
            // RangeError for headers over its 64 KiB table buffer), so no
            // delivery tag was used and the channel is intact.
            this.settle(batch, index, { _tag: "Rejected", error: describeCause(error) })
            continue
          }
          const tag = this.nextTag++
          const entry = new Entry(batch, index, message.options.messageId ?? "", size, now)
          this.pending.set(tag, entry)
          this.linkId(entry)
          this.lastProgress = now
          // The channel's write buffer is full: wait for `drain` (back-pressure).
          if (!writable) this.awaitingDrain = true
        }
        if (batch.next < items.length) break
        this.queue.shift()
      }
    } finally {
      this.pumping = false
    }
  }

  private settle(batch: Batch, index: number, outcome: PublishOutcome): void {
    if (batch.outcomes[index] !== undefined) return
    batch.outcomes[index] = outcome
    if (--batch.remaining === 0 && !batch.abandoned) {
      batch.onDone(batch.outcomes as ReadonlyArray<PublishOutcome>)
    }
  }

  private linkId(entry: Entry): void {
    const head = this.byId.get(entry.messageId)
    if (head === undefined) {
      this.byId.set(entry.messageId, entry)
      return
    }
    let last = head
    while (last.sameId !== undefined) last = last.sameId
    last.sameId = entry
  }

  private unlinkId(entry: Entry): void {
    const head = this.byId.get(entry.messageId)
    if (head === entry) {
      if (entry.sameId === undefined) this.byId.delete(entry.messageId)
      else this.byId.set(entry.messageId, entry.sameId)
      return
    }
    let previous = head
    while (previous !== undefined && previous.sameId !== entry) previous = previous.sameId
    if (previous !== undefined) previous.sameId = entry.sameId
  }

  /** Removes a confirmed (or timed-out) tag and settles its message. */
  private complete(tag: number, outcome: (entry: Entry) => PublishOutcome): void {
    const entry = this.pending.get(tag)
    if (entry === undefined) return
    this.pending.delete(tag)
    this.unlinkId(entry)
    this.settle(entry.batch, entry.index, outcome(entry))
  }

  private confirm(tag: number, multiple: boolean, outcome: (entry: Entry) => PublishOutcome): void {
    if (multiple) {
      // Bounded by what was sent: a confirm can only cover tags already used.
      const last = Math.min(tag, this.nextTag - 1)
      for (let t = this.lowestTag; t <= last; t++) this.complete(t, outcome)
      if (last >= this.lowestTag) this.lowestTag = last + 1
    } else {
      this.complete(tag, outcome)
    }
    while (this.lowestTag < this.nextTag && !this.pending.has(this.lowestTag)) this.lowestTag++
    this.lastProgress = Date.now()
    if (this.queue.length > 0) this.pump()
    this.stopSweeperIfIdle()
  }

  private readonly onAck = (fields: { deliveryTag: number; multiple: boolean }): void => {
    this.confirm(fields.deliveryTag, fields.multiple, ackOutcome)
  }

  private readonly onNack = (fields: { deliveryTag: number; multiple: boolean }): void => {
    this.confirm(fields.deliveryTag, fields.multiple, nackOutcome)
  }

  private readonly onReturn = (message: Message): void => {
    const id = typeof message.properties?.messageId === "string" ? message.properties.messageId : ""
    // Returns come in send order, so the first not-yet-returned entry with this id is the one.
    let entry = this.byId.get(id)
    while (entry !== undefined && entry.returned !== undefined) entry = entry.sameId
    if (entry === undefined) return
    const fields = message.fields as unknown as {
      readonly replyCode?: number
      readonly replyText?: string
      readonly exchange?: string
      readonly routingKey?: string
    }
    entry.returned =
      `unroutable: no queue bound to ${JSON.stringify(fields.exchange ?? "")} ` +
      `for routing key ${JSON.stringify(fields.routingKey ?? "")} (${fields.replyCode ?? "?"} ${fields.replyText ?? ""})`
  }

  private readonly onDrain = (): void => {
    this.awaitingDrain = false
    this.lastProgress = Date.now()
    this.pump()
  }

  private readonly onError = (error: unknown): void => {
    this.lastError = error
  }

  private interrupted(): PublishOutcome {
    return {
      _tag: "Interrupted",
      error: `channel closed before the broker confirmed: ${this.lastError === undefined ? "closed" : describeCause(this.lastError)}`,
    }
  }

  private failUnsent(batch: Batch, outcome: PublishOutcome): void {
    for (let i = batch.next; i < batch.items.length; i++) this.settle(batch, i, outcome)
    batch.next = batch.items.length
  }

  private readonly onClose = (): void => {
    if (this.closed) return
    this.closed = true
    this.stopSweeper()
    const interrupted = this.interrupted()
    // RabbitMQ closes the channel with 406 "message size N is larger than
    // configured max size M" for an oversized message; that message is
    // Rejected (it can never go through), the others merely Interrupted.
    const tooLarge = oversizedBody(this.lastError)
    let rejectedOne = false
    const pending = [...this.pending.values()]
    this.pending.clear()
    this.byId.clear()
    for (const entry of pending) {
      let outcome = interrupted
      if (entry.returned !== undefined) outcome = { _tag: "Returned", error: entry.returned }
      else if (!rejectedOne && tooLarge !== undefined && entry.size === tooLarge) {
        rejectedOne = true
        outcome = { _tag: "Rejected", error: describeCause(this.lastError) }
      }
      this.settle(entry.batch, entry.index, outcome)
    }
    const queued = this.queue
    this.queue = []
    for (const batch of queued) this.failUnsent(batch, interrupted)
  }

  private ensureSweeper(): void {
    if (this.sweeper !== undefined || this.closed) return
    // A tenth of the timeout keeps the overshoot small; capped so short timeouts stay cheap.
    const every = Math.max(10, Math.min(1000, Math.floor(this.options.timeoutMs / 10)))
    this.sweeper = setInterval(this.sweep, every)
    // Never keep the process alive just for this timer.
    if (typeof this.sweeper === "object" && "unref" in this.sweeper) this.sweeper.unref()
  }

  private stopSweeper(): void {
    if (this.sweeper === undefined) return
    clearInterval(this.sweeper)
    this.sweeper = undefined
  }

  private stopSweeperIfIdle(): void {
    if (this.pending.size === 0 && this.queue.length === 0) this.stopSweeper()
  }

  private readonly sweep = (): void => {
    const now = Date.now()
    const { timeoutMs } = this.options
    let freed = false
    // Oldest first: stop at the first message still within its time.
    for (const [tag, entry] of this.pending) {
      if (now - entry.sentAt < timeoutMs) break
      freed = true
      this.complete(tag, timedOutOutcome)
    }
    if (this.queue.length > 0 && now - this.lastProgress >= timeoutMs) {
      // Nothing moved for a whole timeout (broker blocked by an alarm, socket stuck): give up on unsent messages.
      const queued = this.queue
      this.queue = []
      const outcome: PublishOutcome = {
        _tag: "TimedOut",
        error: `not sent within ${timeoutMs} ms (no room on the channel)`,
      }
      for (const batch of queued) this.failUnsent(batch, outcome)
    } else if (freed && this.queue.length > 0) {
      this.pump()
    }
    this.stopSweeperIfIdle()
  }
}

const ackOutcome = (entry: Entry): PublishOutcome =>
  entry.returned === undefined ? CONFIRMED : { _tag: "Returned", error: entry.returned }

const nackOutcome = (entry: Entry): PublishOutcome =>
  entry.returned === undefined
    ? { _tag: "Nacked", error: "the broker nacked the message (basic.nack)" }
    : { _tag: "Returned", error: entry.returned }

const timedOutOutcome = (entry: Entry): PublishOutcome =>
  entry.returned === undefined
    ? { _tag: "TimedOut", error: "no confirm from the broker within the publish timeout" }
    : { _tag: "Returned", error: entry.returned }

const isChannelGone = (error: unknown): boolean =>
  error instanceof Error &&
  (error.name === "IllegalOperationError" || /Channel (closed|closing)/i.test(error.message))

/** The body size in RabbitMQ's "message size N is larger than configured max size" channel error. */
const oversizedBody = (error: unknown): number | undefined => {
  if (!(error instanceof Error)) return undefined
  const match = /message size (\d+) is larger than/.exec(error.message)
  return match ? Number(match[1]) : undefined
}
