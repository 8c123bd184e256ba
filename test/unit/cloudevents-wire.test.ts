// The wire format against the CloudEvents SDK, without a broker: SDK events in structured mode and
// in the AMQP binding's binary mode read as deliveries, and txbox's own messages read as CloudEvents.
import { describe, expect, test } from "bun:test"
import type { Message } from "amqplib"
import { CloudEvent } from "cloudevents"
import { decodeDelivery, encodeMessage } from "../../src/transport/amqp/wire.ts"

const delivered = (properties: Partial<Message["properties"]>, content: Buffer): Message =>
  ({
    content,
    fields: { deliveryTag: 1, redelivered: false, exchange: "x", routingKey: "orders.order-placed" },
    properties: { headers: undefined, ...properties },
  }) as Message

const sdkEvent = (extra: Record<string, unknown> = {}) =>
  new CloudEvent({
    id: "ce-1",
    type: "orders.order-placed",
    source: "/legacy/orders",
    time: "2024-05-06T07:08:09.123Z",
    datacontenttype: "application/json",
    data: { orderId: "o-1", total: 12.5, currency: "EUR" },
    ...extra,
  })

/** The CloudEvents AMQP binding, binary mode: each attribute an application property `cloudEvents:<name>`. */
const binaryHeaders = (event: CloudEvent<unknown>) => {
  const headers: Record<string, unknown> = {}
  for (const [name, value] of Object.entries(event.toJSON())) {
    if (name !== "data" && name !== "data_base64" && name !== "datacontenttype")
      headers[`cloudEvents:${name}`] = value
  }
  return headers
}

describe("CloudEvents structured mode (application/cloudevents+json)", () => {
  test("an SDK event's data becomes the body and its attributes cloudEvents:* headers", () => {
    const event = sdkEvent({ txboxversion: 2 })
    const delivery = decodeDelivery(
      delivered(
        { contentType: "application/cloudevents+json; charset=utf-8" },
        Buffer.from(event.toString()),
      ),
    )
    expect(delivery.messageId).toBe("ce-1")
    expect(delivery.type).toBe("orders.order-placed")
    expect(delivery.version).toBe(2)
    expect(JSON.parse(delivery.body)).toEqual({ orderId: "o-1", total: 12.5, currency: "EUR" })
    expect(delivery.headers).toMatchObject({
      "cloudEvents:specversion": "1.0",
      "cloudEvents:source": "/legacy/orders",
      "cloudEvents:time": "2024-05-06T07:08:09.123Z",
      "cloudEvents:txboxversion": "2",
    })
    expect(delivery.headers["cloudEvents:data"]).toBeUndefined()
  })

  test("data_base64 is decoded into the body, bytes kept", () => {
    const body = JSON.stringify({ orderId: "o-2" })
    const event = new CloudEvent({
      id: "ce-2",
      type: "orders.order-placed",
      source: "/x",
      data: new Uint8Array(Buffer.from(body)),
    })
    const text = event.toString()
    expect(text).toContain("data_base64")
    const delivery = decodeDelivery(
      delivered({ contentType: "application/cloudevents+json" }, Buffer.from(text)),
    )
    expect(delivery.body).toBe(body)
    expect(Buffer.from(delivery.bodyBytes!).toString()).toBe(body)
  })

  test("an event without a version attribute has no version (the registry reads it as 1)", () => {
    const delivery = decodeDelivery(
      delivered({ contentType: "application/cloudevents+json" }, Buffer.from(sdkEvent().toString())),
    )
    expect(delivery.version).toBeUndefined()
  })

  test("a structured body that is not a JSON object stays the body, to be refused by its contract", () => {
    const delivery = decodeDelivery(
      delivered({ contentType: "application/cloudevents+json", messageId: "m" }, Buffer.from("[1,2")),
    )
    expect(delivery.body).toBe("[1,2")
    expect(delivery.type).toBeUndefined()
  })
})

describe("the AMQP binding, binary mode", () => {
  test("an SDK event's attributes as cloudEvents: application properties give id, type and version", () => {
    const event = sdkEvent({ txboxversion: 2 })
    const delivery = decodeDelivery(
      delivered(
        { contentType: "application/json", headers: binaryHeaders(event) },
        Buffer.from(JSON.stringify(event.data)),
      ),
    )
    expect(delivery).toMatchObject({ messageId: "ce-1", type: "orders.order-placed", version: 2 })
  })

  test("the cloudEvents_ prefix the binding allows for JMS clients is read too", () => {
    const delivery = decodeDelivery(
      delivered(
        {
          headers: {
            cloudEvents_id: "ce-3",
            cloudEvents_type: "orders.order-placed",
            cloudEvents_txboxversion: "3",
          },
        },
        Buffer.from("{}"),
      ),
    )
    expect(delivery).toMatchObject({ messageId: "ce-3", type: "orders.order-placed", version: 3 })
  })

  test("txbox-version wins over the CloudEvents attribute when both are set", () => {
    const delivery = decodeDelivery(
      delivered(
        { messageId: "m", type: "t", headers: { "txbox-version": 2, "cloudEvents:txboxversion": 5 } },
        Buffer.from("{}"),
      ),
    )
    expect(delivery.version).toBe(2)
  })
})

describe("txbox's messages as CloudEvents", () => {
  test("every required attribute is there: the SDK builds a valid event from the properties alone", () => {
    const result = encodeMessage(
      {
        id: "0190a0b0-0000-7000-8000-000000000001",
        type: "orders.order-placed",
        version: 2,
        routingKey: "orders.order-placed",
        body: JSON.stringify({ orderId: "o-1" }),
        headers: {},
        occurredAt: new Date("2024-05-06T07:08:09.123Z"),
        partitionKey: null,
        tenantId: null,
      },
      "orders-service",
    )
    if (result._tag !== "Encoded") throw new Error(result.error)
    const { options, content } = result.message
    const attributes: Record<string, unknown> = {}
    for (const [key, value] of Object.entries(options.headers ?? {})) {
      if (key.startsWith("cloudEvents:")) attributes[key.slice("cloudEvents:".length)] = value
    }
    const event = new CloudEvent({
      ...attributes,
      datacontenttype: String(options.contentType),
      data: JSON.parse(content.toString()),
    })
    expect(event.validate()).toBe(true)
    expect(event).toMatchObject({
      specversion: "1.0",
      id: "0190a0b0-0000-7000-8000-000000000001",
      type: "orders.order-placed",
      source: "orders-service",
      time: "2024-05-06T07:08:09.123Z",
      datacontenttype: "application/json",
      data: { orderId: "o-1" },
    })
  })
})
