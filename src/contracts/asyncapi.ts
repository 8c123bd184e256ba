/**
 * An AsyncAPI 3.0 document for a module's contracts, as txbox puts them on
 * RabbitMQ: one channel per event type (the routing key on the topic
 * exchange), one per consumer queue (`txbox.<consumer>`), one message per
 * contract version with its payload's JSON Schema and the CloudEvents
 * application properties the relay writes. Plain JSON: write it to a file, or
 * hand it to AsyncAPI tooling.
 */
import { Effect } from "effect"
import { PARTITION_EPOCH_HEADER, PARTITION_SEQ_HEADER } from "../core/position.ts"
import { ConfigError, redactUrls } from "../Errors.ts"
import { contractsByType } from "./compatibility.ts"
import { type JsonSchemaObject as JsonSchema, type JsonSchemaConverter, jsonSchemaOf } from "./jsonSchema.ts"
import type { AnyContract } from "./types.ts"

/** Options of `asyncApiDocument`: the document's `info`, the broker as the transport sees it, and the consumers to list. */
export interface AsyncApiOptions {
  /** The document's `info.title`. @default "txbox contracts" */
  readonly title?: string
  /** The document's `info.version`: the version of your service's API, not txbox's. @default "1.0.0" */
  readonly version?: string
  /** The document's `info.description`; left out when absent. */
  readonly description?: string
  /** The topic exchange, as in `AmqpTransport.layer`. @default "txbox.events" */
  readonly exchange?: string
  /** The CloudEvents `source` producers set, as in `AmqpTransport.layer`. @default "txbox" */
  readonly source?: string
  /** The broker, e.g. `amqp://rabbitmq.internal:5672` (credentials are dropped); no `servers` without it. */
  readonly server?: string
  /** Inbox consumers and the types each handles (all of the module's types when `types` is absent). */
  readonly consumers?: ReadonlyArray<{ readonly name: string; readonly types?: ReadonlyArray<string> }>
  /** For schemas that carry no JSON Schema of their own (see `jsonSchemaOf`). */
  readonly toJsonSchema?: JsonSchemaConverter
}

// The AMQP bindings object's version this document follows.
const AMQP_BINDING = "0.3.0"

/** The queue the AMQP transport declares for a consumer (transport/amqp/subscriber.ts `queueName`). */
const queueOf = (consumer: string) => `txbox.${consumer}`

const messageKey = (contract: AnyContract) => `${contract.type}.v${contract.version}`

/**
 * The application properties of a message as txbox's relay writes them
 * (transport/amqp/wire.ts `Headers`; a unit test holds the two together).
 * Required = always written by txbox; what an inbox needs of a foreign
 * producer is less (see the README's header table).
 */
const headersOf = (contract: AnyContract, source: string): JsonSchema => ({
  type: "object",
  description:
    "AMQP application properties: the CloudEvents 1.0 AMQP binding (binary mode) plus txbox's own. " +
    "The AMQP properties repeat some: message-id = cloudEvents:id, type = cloudEvents:type, app-id = cloudEvents:source, " +
    "content-type = application/json.",
  properties: {
    "cloudEvents:specversion": { type: "string", const: "1.0" },
    "cloudEvents:id": {
      type: "string",
      description: "The event id (UUIDv7 by default); the inbox deduplicates on it.",
    },
    "cloudEvents:type": { type: "string", const: contract.type },
    "cloudEvents:source": { type: "string", examples: [source] },
    "cloudEvents:time": { type: "string", format: "date-time", description: "When the event was enqueued." },
    "txbox-version": {
      type: "integer",
      const: contract.version,
      description:
        "The contract version. A foreign producer may send the CloudEvents extension txboxversion instead; a message with neither is read as version 1.",
    },
    "partition-key": { type: "string", description: "Messages with one key are handled in commit order." },
    [PARTITION_EPOCH_HEADER]: {
      type: "integer",
      description: "The key's counter epoch (with partition-key).",
    },
    [PARTITION_SEQ_HEADER]: {
      type: "integer",
      description: "The message's number within its key and epoch.",
    },
    "tenant-id": { type: "string" },
    traceparent: { type: "string", description: "W3C trace context of the enqueueing span." },
  },
  required: [
    "cloudEvents:specversion",
    "cloudEvents:id",
    "cloudEvents:type",
    "cloudEvents:source",
    "cloudEvents:time",
    "txbox-version",
  ],
})

/** Drops `$schema`: AsyncAPI's schema format is JSON Schema draft-07 already, and names no other. */
const payloadOf = (schema: JsonSchema): JsonSchema => {
  const { $schema: _, ...rest } = schema
  return rest
}

const serverOf = (url: string): Record<string, unknown> => {
  const parsed = new URL(url)
  const vhost = decodeURIComponent(parsed.pathname.slice(1))
  return {
    host: parsed.port === "" ? parsed.hostname : `${parsed.hostname}:${parsed.port}`,
    protocol: parsed.protocol === "amqps:" ? "amqps" : "amqp",
    protocolVersion: "0.9.1",
    ...(vhost === "" ? {} : { description: `virtual host ${vhost}` }),
  }
}

const ref = (path: ReadonlyArray<string>) => ({
  $ref: `#/${path.map((p) => p.replaceAll("~", "~0").replaceAll("/", "~1")).join("/")}`,
})

/** The AsyncAPI 3.0 document (plain JSON) for `contracts` and every version their upcast chains name. */
export const asyncApiDocument = (
  contracts: Iterable<AnyContract>,
  options: AsyncApiOptions = {},
): Effect.Effect<Record<string, unknown>, ConfigError> =>
  Effect.gen(function* () {
    const exchange = options.exchange ?? "txbox.events"
    const source = options.source ?? "txbox"
    const byType = yield* contractsByType(contracts)
    const url = options.server
    const server =
      url === undefined
        ? undefined
        : yield* Effect.try({
            try: () => serverOf(url),
            catch: () =>
              new ConfigError({ reason: `server ${JSON.stringify(redactUrls(url))} is not a URL` }),
          })
    const messages: Record<string, unknown> = {}
    const channels: Record<string, unknown> = {}
    const operations: Record<string, unknown> = {}
    const channelMessages = (types: ReadonlyArray<string>) => {
      const out: Record<string, unknown> = {}
      for (const type of types) {
        for (const contract of byType.get(type)?.values() ?? []) {
          out[messageKey(contract)] = ref(["components", "messages", messageKey(contract)])
        }
      }
      return out
    }
    const types = [...byType.keys()].sort()
    for (const type of types) {
      const versions = [...byType.get(type)!.values()].sort((a, b) => a.version - b.version)
      for (const contract of versions) {
        const payload = yield* jsonSchemaOf(contract, options.toJsonSchema)
        const from = contract.upcast?.from.version
        messages[messageKey(contract)] = {
          name: contract.type,
          title: `${contract.type} @${contract.version}`,
          summary:
            from === undefined
              ? `${contract.type}, version ${contract.version}`
              : `${contract.type}, version ${contract.version}; consumers upcast version ${from} to it`,
          contentType: "application/json",
          headers: headersOf(contract, source),
          payload: payloadOf(payload),
          bindings: { amqp: { messageType: contract.type, bindingVersion: AMQP_BINDING } },
          "x-txbox-version": contract.version,
          ...(from === undefined ? {} : { "x-txbox-upcast-from": from }),
        }
      }
      channels[type] = {
        address: type,
        title: type,
        description: `Messages of type ${type}, published to the topic exchange ${exchange} with the type as routing key.`,
        messages: channelMessages([type]),
        bindings: {
          amqp: {
            is: "routingKey",
            exchange: { name: exchange, type: "topic", durable: true, autoDelete: false, vhost: "/" },
            bindingVersion: AMQP_BINDING,
          },
        },
      }
      operations[`publish.${type}`] = {
        action: "send",
        title: `Publish ${type}`,
        summary: "The relay publishes committed outbox rows, with publisher confirms and mandatory.",
        channel: ref(["channels", type]),
        messages: versions.map((c) => ref(["channels", type, "messages", messageKey(c)])),
        bindings: { amqp: { deliveryMode: 2, mandatory: true, bindingVersion: AMQP_BINDING } },
      }
    }
    for (const consumer of options.consumers ?? []) {
      const handled = consumer.types ?? types
      const unknown = handled.filter((t) => !byType.has(t))
      if (unknown.length > 0) {
        return yield* new ConfigError({
          reason: `consumer ${consumer.name} handles ${unknown.join(", ")}, which the module does not define`,
        })
      }
      const queue = queueOf(consumer.name)
      channels[queue] = {
        address: queue,
        title: queue,
        description: `The queue of inbox consumer ${consumer.name}, bound to ${exchange} by ${handled.join(", ")}.`,
        messages: channelMessages(handled),
        bindings: {
          amqp: {
            is: "queue",
            queue: { name: queue, durable: true, exclusive: false, autoDelete: false, vhost: "/" },
            bindingVersion: AMQP_BINDING,
          },
        },
      }
      operations[`receive.${consumer.name}`] = {
        action: "receive",
        title: `Inbox ${consumer.name}`,
        summary:
          "Each message is handled once per consumer (its id is the inbox key); an older version is upcast to the newest one the consumer handles.",
        channel: ref(["channels", queue]),
        messages: Object.keys(channelMessages(handled)).map((key) =>
          ref(["channels", queue, "messages", key]),
        ),
        bindings: { amqp: { ack: true, bindingVersion: AMQP_BINDING } },
      }
    }
    return {
      asyncapi: "3.0.0",
      info: {
        title: options.title ?? "txbox contracts",
        version: options.version ?? "1.0.0",
        ...(options.description === undefined ? {} : { description: options.description }),
      },
      ...(server === undefined ? {} : { servers: { rabbitmq: server } }),
      defaultContentType: "application/json",
      channels,
      operations,
      components: { messages },
    }
  })
