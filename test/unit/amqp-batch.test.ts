import { describe, expect, test } from "bun:test"
import type { Message } from "amqplib"
import type { OutgoingMessage } from "../../src/ports/Transport.ts"
import {
  BATCH_CONTENT_TYPE,
  batchOfOne,
  decodeBatch,
  encodeBatches,
  isBatch,
} from "../../src/transport/amqp/batch.ts"
import { decodeDelivery, type EncodeResult, encodeMessage, Headers } from "../../src/transport/amqp/wire.ts"

const outgoing = (n: number, overrides: Partial<OutgoingMessage> = {}): OutgoingMessage => ({
  id: `0190a0b0-0000-7000-8000-${String(n).padStart(12, "0")}`,
  type: "orders.order-placed",
  version: 3,
  routingKey: "orders.order-placed",
  body: JSON.stringify({ orderId: `o-${n}`, total: 12.5, note: 'grüße " \\ \u2028' }),
  headers: { traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-custom": "yes" },
  occurredAt: new Date("2024-05-06T07:08:09.123Z"),
  partitionKey: "customer-7",
  position: { epoch: 1700000000000, seq: n },
  tenantId: "acme",
  ...overrides,
})

const delivered = (item: EncodeResult, headers?: Record<string, unknown>, redelivered = false): Message => {
  if (item._tag !== "Encoded") throw new Error(`expected Encoded, got ${item.error}`)
  const { options, content } = item.message
  return {
    content,
    fields: { deliveryTag: 1, redelivered, exchange: "txbox.events", routingKey: item.message.routingKey },
    properties: { ...options, headers: headers ?? options.headers } as Message["properties"],
  }
}

describe("encodeBatches", () => {
  test("one message per routing key, its events in their order", () => {
    const messages = [
      outgoing(1),
      outgoing(2, { routingKey: "orders.shipped", type: "orders.shipped" }),
      outgoing(3),
      outgoing(4, { routingKey: "orders.shipped", type: "orders.shipped" }),
    ]
    const { items, members } = encodeBatches(messages, "orders-service", { messages: 100, bytes: 1 << 20 })
    expect(members).toEqual([
      [0, 2],
      [1, 3],
    ])
    const routed = items.map((item) => (item._tag === "Encoded" ? item.message.routingKey : item.error))
    expect(routed).toEqual(["orders.order-placed", "orders.shipped"])
    for (const item of items) {
      if (item._tag !== "Encoded") throw new Error("expected Encoded")
      expect(item.message.options.contentType).toBe(BATCH_CONTENT_TYPE)
      expect(item.message.options.persistent).toBe(true)
      expect(item.message.options.mandatory).toBe(true)
      expect(item.message.options.headers).toBeUndefined()
    }
  })

  test("a batch holds at most `messages` events and `bytes` bytes", () => {
    const messages = Array.from({ length: 7 }, (_, i) => outgoing(i + 1))
    expect(encodeBatches(messages, "s", { messages: 3, bytes: 1 << 20 }).members).toEqual([
      [0, 1, 2],
      [3, 4, 5],
      [6],
    ])
    const one = encodeBatches([outgoing(1)], "s", { messages: 100, bytes: 1 << 20 }).items[0]!
    const size = one._tag === "Encoded" ? one.message.content.length : 0
    // Room for two events, not three.
    const { items, members } = encodeBatches(messages.slice(0, 3), "s", { messages: 100, bytes: size * 2 })
    expect(members).toEqual([[0, 1], [2]])
    for (const item of items) {
      if (item._tag === "Encoded") expect(item.message.content.length).toBeLessThanOrEqual(size * 2)
    }
  })

  test("bytes are counted in UTF-8 near the limit: multi-byte events fill a batch to it, never past", () => {
    // 3-byte characters: each event's bytes are well over its UTF-16 length.
    const wide = (n: number) => outgoing(n, { body: JSON.stringify({ note: "€".repeat(300 + n) }) })
    const messages = Array.from({ length: 12 }, (_, i) => wide(i + 1))
    const one = encodeBatches([messages[0]!], "s", { messages: 100, bytes: 1 << 20 }).items[0]!
    const size = one._tag === "Encoded" ? one.message.content.length : 0
    for (const limit of [size * 3, size * 4 + 10, size * 7]) {
      const { items, members } = encodeBatches(messages, "s", { messages: 100, bytes: limit })
      expect(members.flat()).toEqual(messages.map((_, i) => i))
      const lengths = items.map((item) => (item._tag === "Encoded" ? item.message.content.length : -1))
      for (const length of lengths) expect(length).toBeLessThanOrEqual(limit)
      // Full: the next event would not have fitted (exact counting, not the upper bound).
      for (let b = 0; b + 1 < members.length; b++) {
        const next = encodeBatches([messages[members[b + 1]![0]!]!], "s", { messages: 100, bytes: 1 << 20 })
          .items[0]!
        const nextBytes = next._tag === "Encoded" ? next.message.content.length - 2 : 0
        expect(lengths[b]! + 1 + nextBytes).toBeGreaterThan(limit)
      }
    }
  })

  test("an event larger than `bytes` goes alone; the others are not held back", () => {
    const big = outgoing(2, { body: JSON.stringify({ blob: "x".repeat(5000) }) })
    const { members } = encodeBatches([outgoing(1), big, outgoing(3)], "s", { messages: 100, bytes: 2000 })
    expect(members).toEqual([[0], [1], [2]])
  })

  test("an event that cannot be encoded is its own Invalid item", () => {
    const messages = [outgoing(1), outgoing(2, { occurredAt: new Date(Number.NaN) }), outgoing(3)]
    const { items, members } = encodeBatches(messages, "s", { messages: 100, bytes: 1 << 20 })
    expect(members).toEqual([[1], [0, 2]])
    expect(items[0]!._tag).toBe("Invalid")
    expect(items[1]!._tag).toBe("Encoded")
  })
})

describe("decodeBatch", () => {
  test("each event decodes to what its binary-mode message decodes to", () => {
    const messages = [
      outgoing(1),
      outgoing(2, { partitionKey: null, position: null, tenantId: null, headers: {} }),
    ]
    const { items } = encodeBatches(messages, "orders-service", { messages: 100, bytes: 1 << 20 })
    const message = delivered(items[0]!, undefined, true)
    expect(isBatch(message.properties.contentType)).toBe(true)
    const events = decodeBatch(message)!
    expect(events.length).toBe(2)
    events.forEach((event, i) => {
      const { bodyBytes: _, ...binary } = decodeDelivery(
        delivered(encodeMessage(messages[i]!, "orders-service")),
      )
      expect(event.delivery).toEqual({ ...binary, redelivered: true })
      expect(JSON.parse(event.delivery.body)).toEqual(JSON.parse(messages[i]!.body))
    })
    expect(events[0]!.delivery.position).toEqual({ epoch: 1700000000000, seq: 1 })
  })

  test("the message's own headers (a retry copy's attempt) apply to each event", () => {
    const { items } = encodeBatches([outgoing(1), outgoing(2)], "s", { messages: 100, bytes: 1 << 20 })
    const events = decodeBatch(delivered(items[0]!, { [Headers.attempt]: 3 }))!
    expect(events.map((e) => e.delivery.attempt)).toEqual([3, 3])
  })

  test("a batch of one (a retry copy) carries the event as it came", () => {
    const { items } = encodeBatches([outgoing(1), outgoing(2)], "s", { messages: 100, bytes: 1 << 20 })
    const second = decodeBatch(delivered(items[0]!))![1]!
    const copy = delivered(items[0]!, { [Headers.attempt]: 2 })
    const again = decodeBatch({ ...copy, content: batchOfOne(second.event) })!
    expect(again.length).toBe(1)
    expect(again[0]!.delivery).toEqual({
      ...second.delivery,
      attempt: 2,
      headers: { ...second.delivery.headers, [Headers.attempt]: "2" },
    })
  })

  test("a body that is no JSON array is not a batch; an element that is no event has no id", () => {
    const base = delivered(encodeBatches([outgoing(1)], "s", { messages: 100, bytes: 1 << 20 }).items[0]!)
    expect(decodeBatch({ ...base, content: Buffer.from("not json") })).toBeUndefined()
    expect(decodeBatch({ ...base, content: Buffer.from('{"id":"x"}') })).toBeUndefined()
    expect(decodeBatch({ ...base, content: Buffer.from("[]") })).toBeUndefined()
    const odd = decodeBatch({ ...base, content: Buffer.from('[42, {"id":"a","type":"t","data":{"k":1}}]') })!
    expect(odd[0]!.delivery.messageId).toBeUndefined()
    expect(odd[0]!.delivery.body).toBe("42")
    expect(odd[1]!.delivery.messageId).toBe("a")
    expect(odd[1]!.delivery.body).toBe('{"k":1}')
  })
})
