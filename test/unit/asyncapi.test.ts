// The AsyncAPI document of a module's contracts, read as plain JSON. (@asyncapi/parser takes ~3 s to
// load and parse, so its validation of the same document, written by `txbox asyncapi`, is in
// test/integration/contracts.test.ts.)
import { describe, expect, test } from "bun:test"
import { toJsonSchema } from "@valibot/to-json-schema"
import { Effect, Exit } from "effect"
import { asyncApiDocument, type JsonSchemaConverter } from "../../src/index.ts"
import { encodeMessage } from "../../src/transport/amqp/wire.ts"
import { Note } from "../fixtures/contracts.ts"
import { OrderPlaced } from "../fixtures/orders-v2.ts"

const valibot: JsonSchemaConverter = (c) => toJsonSchema(c.schema as never)

interface Doc {
  readonly channels: Record<
    string,
    { address: string; messages: Record<string, { $ref: string }>; bindings: unknown }
  >
  readonly operations: Record<
    string,
    { action: string; channel: { $ref: string }; messages: Array<{ $ref: string }> }
  >
  readonly components: {
    readonly messages: Record<
      string,
      {
        payload: Record<string, unknown>
        headers: { properties: Record<string, { const?: unknown }>; required: string[] }
        "x-txbox-version": number
        "x-txbox-upcast-from"?: number
      }
    >
  }
  readonly servers?: unknown
}

const documentOf = (): Doc =>
  Effect.runSync(
    asyncApiDocument([OrderPlaced, Note], {
      title: "orders",
      version: "2.1.0",
      exchange: "shop.events",
      source: "orders-service",
      server: "amqp://app:secret@rabbit.internal:5672/shop",
      consumers: [{ name: "billing" }, { name: "shipping", types: ["orders.order-placed"] }],
      toJsonSchema: valibot,
    }),
  ) as unknown as Doc

describe("asyncApiDocument", () => {
  test("channels are the exchange's routing keys and each consumer's queue", () => {
    const doc = documentOf()
    expect(Object.values(doc.channels).map((c) => c.address)).toEqual([
      "orders.order-placed",
      "test.note",
      "txbox.billing",
      "txbox.shipping",
    ])
    expect(Object.keys(doc.channels["txbox.shipping"]!.messages)).toEqual([
      "orders.order-placed.v1",
      "orders.order-placed.v2",
    ])
    expect(doc.channels["orders.order-placed"]!.bindings).toMatchObject({
      amqp: { is: "routingKey", exchange: { name: "shop.events", type: "topic" } },
    })
    expect(doc.operations["receive.billing"]).toMatchObject({
      action: "receive",
      channel: { $ref: "#/channels/txbox.billing" },
    })
    expect(doc.operations["publish.test.note"]!.messages).toEqual([
      { $ref: "#/channels/test.note/messages/test.note.v1" },
    ])
  })

  test("every version of the upcast chain is a message with its payload schema and version headers", () => {
    const { messages } = documentOf().components
    expect(Object.keys(messages)).toEqual([
      "orders.order-placed.v1",
      "orders.order-placed.v2",
      "test.note.v1",
    ])
    const v2 = messages["orders.order-placed.v2"]!
    expect(v2.payload).toMatchObject({ type: "object", required: ["orderId", "total"] })
    expect(v2.payload.$schema).toBeUndefined()
    expect(v2.headers.properties["txbox-version"]!.const).toBe(2)
    expect(v2.headers.properties["cloudEvents:type"]!.const).toBe("orders.order-placed")
    expect(v2["x-txbox-upcast-from"]).toBe(1)
    expect(messages["orders.order-placed.v1"]!["x-txbox-version"]).toBe(1)
  })

  test("the server keeps host and port, never the credentials", () => {
    const doc = documentOf()
    expect(JSON.stringify(doc)).not.toContain("secret")
    expect(doc.servers).toEqual({
      rabbitmq: {
        host: "rabbit.internal:5672",
        protocol: "amqp",
        protocolVersion: "0.9.1",
        description: "virtual host shop",
      },
    })
  })

  test("the headers it documents are the ones the relay writes", () => {
    const result = encodeMessage(
      {
        id: "0190a0b0-0000-7000-8000-000000000001",
        type: "orders.order-placed",
        version: 2,
        routingKey: "orders.order-placed",
        body: "{}",
        headers: { traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" },
        occurredAt: new Date(),
        partitionKey: "k",
        position: { epoch: 1, seq: 1 },
        tenantId: "acme",
      },
      "orders-service",
    )
    if (result._tag !== "Encoded") throw new Error(result.error)
    const written = Object.keys(result.message.options.headers ?? {}).sort()
    const documented = documentOf().components.messages["orders.order-placed.v2"]!.headers
    expect(Object.keys(documented.properties).sort()).toEqual(written)
  })

  test("a consumer of a type the module does not define is a ConfigError", () => {
    const exit = Effect.runSyncExit(
      asyncApiDocument([Note], { consumers: [{ name: "x", types: ["nope"] }], toJsonSchema: valibot }),
    )
    expect(Exit.isFailure(exit) && String(exit.cause)).toContain("consumer x handles nope")
  })
})
