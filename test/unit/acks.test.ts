// Coalesced acks (transport/amqp/acks.ts): which basic.ack frames go out for which settlements.
// The broker side (that a multiple ack settles exactly those deliveries) is covered by the
// integration suites, which count what RabbitMQ redelivers.
import { describe, expect, test } from "bun:test"
import type { Message } from "amqplib"
import { AckCoalescer } from "../../src/transport/amqp/acks.ts"

const message = (tag: number) => ({ fields: { deliveryTag: tag } }) as unknown as Message

/** A coalescer over a recording channel, flushed by hand. */
const setup = () => {
  const frames: Array<{ tag: number; multiple: boolean }> = []
  let pending: (() => void) | undefined
  const acks = new AckCoalescer(
    { ack: (m, allUpTo) => frames.push({ tag: m.fields.deliveryTag, multiple: allUpTo === true }) },
    (flush) => {
      pending = flush
    },
  )
  const endOfTurn = () => {
    const flush = pending
    pending = undefined
    flush?.()
  }
  return { acks, frames, endOfTurn }
}

describe("AckCoalescer", () => {
  test("a run of acks from the oldest delivery goes out as one multiple ack", () => {
    const { acks, frames, endOfTurn } = setup()
    for (let tag = 1; tag <= 5; tag++) acks.delivered(message(tag))
    for (const tag of [3, 1, 2, 5, 4]) acks.ack(message(tag))
    expect(frames).toEqual([])
    endOfTurn()
    expect(frames).toEqual([{ tag: 5, multiple: true }])
  })

  test("a delivery still in its handler is never covered: later acks go out one by one", () => {
    const { acks, frames, endOfTurn } = setup()
    for (let tag = 1; tag <= 5; tag++) acks.delivered(message(tag))
    for (const tag of [1, 2, 4, 5]) acks.ack(message(tag))
    endOfTurn()
    expect(frames).toEqual([
      { tag: 2, multiple: true },
      { tag: 4, multiple: false },
      { tag: 5, multiple: false },
    ])
    // 3 settles later: alone, and nothing is acked twice.
    acks.ack(message(3))
    endOfTurn()
    expect(frames.at(-1)).toEqual({ tag: 3, multiple: false })
    expect(frames).toHaveLength(4)
  })

  test("a nacked delivery leaves the run: the multiple ack may pass it, it was settled first", () => {
    const { acks, frames, endOfTurn } = setup()
    for (let tag = 1; tag <= 4; tag++) acks.delivered(message(tag))
    acks.settled(message(2)) // nacked now, by the caller
    for (const tag of [1, 3, 4]) acks.ack(message(tag))
    endOfTurn()
    expect(frames).toEqual([{ tag: 4, multiple: true }])
  })

  test("one ack alone is a plain ack; acks of one turn flush once", () => {
    const { acks, frames, endOfTurn } = setup()
    acks.delivered(message(7))
    acks.delivered(message(8))
    acks.ack(message(8))
    endOfTurn()
    expect(frames).toEqual([{ tag: 8, multiple: false }])
    acks.ack(message(7))
    endOfTurn()
    endOfTurn()
    expect(frames).toEqual([
      { tag: 8, multiple: false },
      { tag: 7, multiple: false },
    ])
  })

  test("flush sends what is pending at once (before a channel closes)", () => {
    const { acks, frames } = setup()
    acks.delivered(message(1))
    acks.delivered(message(2))
    acks.ack(message(1))
    acks.ack(message(2))
    acks.flush()
    expect(frames).toEqual([{ tag: 2, multiple: true }])
  })
})
