/**
 * Acks on one consuming channel, coalesced. The acks given in one turn of the
 * event loop go out together at its end: one `basic.ack` with `multiple` for
 * the run of delivery tags, from the oldest unsettled one, that they settle,
 * and a single ack for each of the others. The inbox settles a shared
 * transaction's deliveries together after its COMMIT, so that is one frame
 * per commit instead of one per message.
 *
 * `multiple` acks every unsettled delivery up to the tag on the channel, so
 * every delivery is registered here and leaves only when settled: a
 * delivery still in a handler, or nacked, is never covered by a run.
 */
import type { Message } from "amqplib"

/** What the coalescer needs of a channel. */
export interface AckChannel {
  ack(message: Message, allUpTo?: boolean): void
}

export class AckCoalescer {
  /** Delivered and not yet settled, in delivery order (tags rise on a channel). */
  private readonly unsettled = new Map<number, Message>()
  /** Acked since the last flush, by tag. */
  private readonly pending = new Map<number, Message>()
  private scheduled = false
  private readonly channel: AckChannel
  private readonly schedule: (flush: () => void) => void

  /** `schedule` runs `flush` at the end of the current turn of the event loop (the caller's setImmediate). */
  constructor(channel: AckChannel, schedule: (flush: () => void) => void) {
    this.channel = channel
    this.schedule = schedule
  }

  /** A delivery arrived on the channel. */
  delivered(message: Message): void {
    this.unsettled.set(message.fields.deliveryTag, message)
  }

  /** Acks `message` at the end of this turn of the event loop. */
  ack(message: Message): void {
    this.pending.set(message.fields.deliveryTag, message)
    if (this.scheduled) return
    this.scheduled = true
    this.schedule(() => this.flush())
  }

  /** `message` is settled another way (nacked now): later runs must not cover it. */
  settled(message: Message): void {
    this.unsettled.delete(message.fields.deliveryTag)
  }

  /**
   * Sends the pending acks now. Throws what the channel throws (a closed
   * channel): the broker redelivers what was not acked.
   */
  flush(): void {
    this.scheduled = false
    if (this.pending.size === 0) return
    let last: Message | undefined
    let run = 0
    for (const [tag, message] of this.unsettled) {
      if (!this.pending.has(tag)) break
      last = message
      run++
    }
    const covered = last === undefined ? 0 : last.fields.deliveryTag
    const singles: Message[] = []
    for (const [tag, message] of this.pending) {
      this.unsettled.delete(tag)
      if (tag > covered) singles.push(message)
    }
    this.pending.clear()
    if (last !== undefined) this.channel.ack(last, run > 1)
    for (const message of singles) this.channel.ack(message)
  }
}
