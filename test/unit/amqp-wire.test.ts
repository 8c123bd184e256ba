import { describe, expect, test } from "bun:test"
import type { Message } from "amqplib"
import { positionFromHeaders, positionOf } from "../../src/core/position.ts"
import type { OutgoingMessage } from "../../src/ports/Transport.ts"
import { delayQueueName, MAX_DELAY_QUEUES } from "../../src/transport/amqp/topology.ts"
import {
  deadLetterReason,
  decodeDelivery,
  encodeMessage,
  Headers,
  retryCopyOptions,
} from "../../src/transport/amqp/wire.ts"

const outgoing = (overrides: Partial<OutgoingMessage> = {}): OutgoingMessage => ({
  id: "0190a0b0-0000-7000-8000-000000000001",
  type: "orders.order-placed",
  version: 3,
  routingKey: "orders.order-placed",
  body: JSON.stringify({ orderId: "o-1", total: 12.5, note: "grüße" }),
  headers: { traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-custom": "yes" },
  occurredAt: new Date("2024-05-06T07:08:09.123Z"),
  partitionKey: "customer-7",
  tenantId: "acme",
  ...overrides,
})

const encoded = (message: OutgoingMessage, source = "orders-service") => {
  const result = encodeMessage(message, source)
  if (result._tag !== "Encoded") throw new Error(`expected Encoded, got ${result.error}`)
  return result.message
}

/** What a consumer would receive for an encoded message (amqplib's decoded shape). */
const asDelivered = (
  properties: Partial<Message["properties"]>,
  content: Buffer,
  redelivered = false,
): Message => ({
  content,
  fields: { deliveryTag: 1, redelivered, exchange: "txbox.events", routingKey: "orders.order-placed" },
  properties: {
    contentType: undefined,
    contentEncoding: undefined,
    headers: undefined,
    deliveryMode: undefined,
    priority: undefined,
    correlationId: undefined,
    replyTo: undefined,
    expiration: undefined,
    messageId: undefined,
    timestamp: undefined,
    type: undefined,
    userId: undefined,
    appId: undefined,
    clusterId: undefined,
    ...properties,
  },
})

describe("encodeMessage", () => {
  test("sets the AMQP properties of the CloudEvents binding", () => {
    const { options, routingKey, content } = encoded(outgoing())
    expect(routingKey).toBe("orders.order-placed")
    expect(content.toString("utf8")).toBe(outgoing().body)
    expect(options.messageId).toBe("0190a0b0-0000-7000-8000-000000000001")
    expect(options.type).toBe("orders.order-placed")
    expect(options.timestamp).toBe(Math.floor(Date.parse("2024-05-06T07:08:09.123Z") / 1000))
    expect(options.contentType).toBe("application/json")
    expect(options.appId).toBe("orders-service")
    expect(options.persistent).toBe(true)
    expect(options.mandatory).toBe(true)
  })

  test("puts the CloudEvents attributes and txbox headers in the application properties", () => {
    const { headers } = encoded(outgoing()).options
    expect(headers).toEqual({
      "cloudEvents:specversion": "1.0",
      "cloudEvents:id": "0190a0b0-0000-7000-8000-000000000001",
      "cloudEvents:type": "orders.order-placed",
      "cloudEvents:source": "orders-service",
      "cloudEvents:time": "2024-05-06T07:08:09.123Z",
      "txbox-version": 3,
      traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      "partition-key": "customer-7",
      "tenant-id": "acme",
      "x-custom": "yes",
    })
  })

  test("leaves out partition-key and tenant-id when they are null", () => {
    const { headers } = encoded(outgoing({ partitionKey: null, tenantId: null, headers: {} })).options
    expect(headers).not.toHaveProperty("partition-key")
    expect(headers).not.toHaveProperty("tenant-id")
    expect(headers).not.toHaveProperty("traceparent")
  })

  test("a user header cannot override a CloudEvents attribute", () => {
    const { headers } = encoded(
      outgoing({ headers: { "cloudEvents:id": "forged", "txbox-version": "9" } }),
    ).options
    expect(headers[Headers.id]).toBe("0190a0b0-0000-7000-8000-000000000001")
    expect(headers[Headers.version]).toBe(3)
  })

  test("an invalid occurredAt is reported instead of thrown", () => {
    const result = encodeMessage(outgoing({ occurredAt: new Date(Number.NaN) }), "s")
    expect(result._tag).toBe("Invalid")
  })
})

describe("decodeDelivery", () => {
  test("round-trips what encodeMessage wrote", () => {
    const { options, content } = encoded(outgoing())
    const delivery = decodeDelivery(asDelivered(options as Partial<Message["properties"]>, content))
    expect(delivery).toEqual({
      messageId: "0190a0b0-0000-7000-8000-000000000001",
      type: "orders.order-placed",
      version: 3,
      body: outgoing().body,
      bodyBytes: content,
      headers: {
        "cloudEvents:specversion": "1.0",
        "cloudEvents:id": "0190a0b0-0000-7000-8000-000000000001",
        "cloudEvents:type": "orders.order-placed",
        "cloudEvents:source": "orders-service",
        "cloudEvents:time": "2024-05-06T07:08:09.123Z",
        "txbox-version": "3",
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "partition-key": "customer-7",
        "tenant-id": "acme",
        "x-custom": "yes",
      },
      partitionKey: "customer-7",
      tenantId: "acme",
      attempt: 1,
      redelivered: false,
    })
  })

  test("a foreign message without properties or headers decodes to undefineds, attempt 1", () => {
    const delivery = decodeDelivery(asDelivered({}, Buffer.from("hello"), true))
    expect(delivery).toEqual({
      messageId: undefined,
      type: undefined,
      version: undefined,
      body: "hello",
      bodyBytes: Buffer.from("hello"),
      headers: {},
      partitionKey: undefined,
      tenantId: undefined,
      attempt: 1,
      redelivered: true,
    })
  })

  test("falls back to the cloudEvents:id and cloudEvents:type application properties", () => {
    const delivery = decodeDelivery(
      asDelivered({ headers: { "cloudEvents:id": "ce-1", "cloudEvents:type": "a.b" } }, Buffer.from("{}")),
    )
    expect(delivery.messageId).toBe("ce-1")
    expect(delivery.type).toBe("a.b")
  })

  test("non-string header values become strings, and odd ones do not throw", () => {
    const circular: Record<string, unknown> = {}
    circular.self = circular
    const delivery = decodeDelivery(
      asDelivered(
        {
          messageId: "m",
          headers: {
            n: 42,
            b: true,
            nil: null,
            bytes: Buffer.from("raw text"),
            big: 10n,
            obj: { a: [1, 2] },
            stamp: { "!": "timestamp", value: 1700000000 },
            circular,
            "txbox-version": "not a number",
            "x-txbox-attempt": "3",
            "partition-key": 17,
          },
        },
        Buffer.from(""),
      ),
    )
    expect(delivery.headers.n).toBe("42")
    expect(delivery.headers.b).toBe("true")
    expect(delivery.headers.nil).toBe("null")
    expect(delivery.headers.bytes).toBe("raw text")
    expect(delivery.headers.big).toBe("10")
    expect(delivery.headers.obj).toBe('{"a":[1,2]}')
    expect(delivery.headers.stamp).toBe('{"!":"timestamp","value":1700000000}')
    expect(typeof delivery.headers.circular).toBe("string")
    expect(delivery.version).toBeUndefined()
    expect(delivery.attempt).toBe(3)
    // Only a string is a partition key; the raw value is still in the headers.
    expect(delivery.partitionKey).toBeUndefined()
    expect(delivery.headers["partition-key"]).toBe("17")
  })

  test("a nonsensical attempt header counts as the first attempt", () => {
    for (const value of [0, -1, 1.5, "x", null]) {
      const delivery = decodeDelivery(asDelivered({ headers: { "x-txbox-attempt": value } }, Buffer.from("")))
      expect(delivery.attempt).toBe(1)
    }
  })

  test("tolerates headers that are not an object", () => {
    const delivery = decodeDelivery(
      asDelivered({ headers: "nonsense" as never, messageId: 5 }, Buffer.from("x")),
    )
    expect(delivery.headers).toEqual({})
    expect(delivery.messageId).toBeUndefined()
  })
})

describe("retryCopyOptions", () => {
  test("keeps the event's properties and headers, sets the next attempt and the delay as TTL", () => {
    const { options, content } = encoded(outgoing())
    const delivered = asDelivered(
      {
        ...(options as Partial<Message["properties"]>),
        headers: {
          ...options.headers,
          "x-death": [{ count: 1 }],
          "x-first-death-queue": "q",
          "x-txbox-attempt": 2,
        },
        deliveryMode: 2,
      },
      content,
    )
    const copy = retryCopyOptions(delivered, 3, 1234.4)
    expect(copy.expiration).toBe("1234")
    expect(copy.persistent).toBe(true)
    expect(copy.mandatory).toBe(true)
    expect(copy.messageId).toBe(options.messageId)
    expect(copy.type).toBe(options.type)
    expect(copy.timestamp).toBe(options.timestamp)
    expect(copy.appId).toBe(options.appId)
    expect(copy.contentType).toBe("application/json")
    expect(copy.headers).toEqual({ ...options.headers, "x-txbox-attempt": 3 })
    // The copy decodes to the same event, one attempt later.
    const back = decodeDelivery(asDelivered(copy as Partial<Message["properties"]>, content))
    expect(back.messageId).toBe(outgoing().id)
    expect(back.attempt).toBe(3)
    expect(back.version).toBe(3)
  })

  test("a negative delay becomes an immediate expiry", () => {
    const copy = retryCopyOptions(asDelivered({}, Buffer.from("")), 2, -50)
    expect(copy.expiration).toBe("0")
    expect(copy.headers).toEqual({ "x-txbox-attempt": 2 })
  })
})

describe("deadLetterReason", () => {
  test("names the newest x-death entry: reason, queue and count", () => {
    const message = asDelivered(
      {
        // RabbitMQ 3.10+ also says delivery_limit, which amqplib's XDeath type does not list.
        headers: {
          "x-death": [
            { reason: "delivery_limit", queue: "txbox.orders", count: 1 },
            { reason: "expired", queue: "txbox.orders.delay.1", count: 2 },
          ],
        } as unknown as Message["properties"]["headers"],
      },
      Buffer.from("{}"),
    )
    expect(deadLetterReason(message)).toBe("delivery_limit in txbox.orders (x-death count 1)")
  })

  test("a message without x-death still gets a reason", () => {
    expect(deadLetterReason(asDelivered({}, Buffer.from("")))).toBe("dead-lettered by the broker")
    expect(
      deadLetterReason(
        asDelivered(
          { headers: { "x-death": "odd" } as unknown as Message["properties"]["headers"] },
          Buffer.from(""),
        ),
      ),
    ).toBe("dead-lettered by the broker")
  })
})

describe("retryCopyOptions for the consumer queue itself", () => {
  test("sets no TTL, which would dead-letter the copy there", () => {
    const copy = retryCopyOptions(asDelivered({ messageId: "m" }, Buffer.from("{}")), 2, undefined)
    expect(copy.expiration).toBeUndefined()
    expect(copy.headers?.[Headers.attempt]).toBe(2)
  })
})

describe("partition position on the wire", () => {
  const message: OutgoingMessage = {
    id: "01a209b0-da45-7005-bcca-b3e3d3d5c3e8",
    type: "orders.order-placed",
    version: 1,
    routingKey: "orders.order-placed",
    body: "{}",
    headers: {},
    occurredAt: new Date(0),
    partitionKey: "order-7",
    position: { epoch: 1_795_000_000_123, seq: 42 },
    tenantId: null,
  }

  test("round-trips through encode and decode, and stays in the headers for a stored row", () => {
    const encoded = encodeMessage(message, "test")
    if (encoded._tag !== "Encoded") throw new Error(encoded.error)
    const delivery = decodeDelivery(asDelivered(encoded.message.options, encoded.message.content))
    expect(delivery.position).toEqual({ epoch: 1_795_000_000_123, seq: 42 })
    expect(positionFromHeaders(delivery.headers)).toEqual({ epoch: 1_795_000_000_123, seq: 42 })
  })

  test("a message without one carries none", () => {
    const encoded = encodeMessage({ ...message, position: null }, "test")
    if (encoded._tag !== "Encoded") throw new Error(encoded.error)
    expect(encoded.message.options.headers?.[Headers.partitionSeq]).toBeUndefined()
    expect(
      decodeDelivery(asDelivered(encoded.message.options, encoded.message.content)).position,
    ).toBeUndefined()
  })

  test.each([
    ["half of one", 5, undefined],
    ["a seq of 0", 5, 0],
    ["a negative epoch", -1, 3],
    ["a fraction", 5, 1.5],
    ["text", "x", "1"],
    ["beyond 2^53", "9007199254740993", "1"],
  ])("%s is no position", (_, epoch, seq) => {
    expect(positionOf(epoch, seq)).toBeUndefined()
  })

  test("numbers sent as strings (a foreign producer, a stored row) are read", () => {
    expect(positionOf("17", "3")).toEqual({ epoch: 17, seq: 3 })
  })
})

describe("delay queues", () => {
  test("one per attempt up to MAX_DELAY_QUEUES, then the last one: a message retried without end creates no more", () => {
    expect(delayQueueName("billing", 1)).toBe("txbox.billing.delay.1")
    expect(delayQueueName("billing", MAX_DELAY_QUEUES)).toBe(`txbox.billing.delay.${MAX_DELAY_QUEUES}`)
    const names = new Set(Array.from({ length: 1000 }, (_, i) => delayQueueName("billing", i + 1)))
    expect(names.size).toBe(MAX_DELAY_QUEUES)
  })
})
