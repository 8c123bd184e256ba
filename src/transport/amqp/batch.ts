/**
 * Several events in one AMQP message: a CloudEvents JSON batch
 * (`application/cloudevents-batch+json`, a JSON array of structured events).
 * The relay sends a batch's events of one routing key this way, so the broker
 * routes, stores, replicates, confirms and delivers one message for all of
 * them, and neither client encodes or parses AMQP headers per event: per event
 * that was most of the broker's CPU and a large share of both clients'
 * (bench/cost.ts). Each event keeps its own id, attributes and headers; the
 * consumer side (deliveries.ts) hands the inbox one `Delivery` per event,
 * exactly as if each had come alone in binary mode.
 *
 * An event's attributes: the CloudEvents ones, `txboxversion`, and
 * `txboxheaders` (what binary mode sends as AMQP application properties:
 * the enqueue's headers, the partition key, its position, the tenant), a JSON
 * object in a string, as CloudEvents allows extension values of simple types only.
 */
import { Buffer } from "node:buffer"
import type { Message, MessagePropertyHeaders } from "amqplib"
import type { Delivery, OutgoingMessage } from "../../ports/Transport.ts"
import {
  CONTENT_TYPE,
  deliveryFrom,
  type EncodeResult,
  encodeMessage,
  Headers,
  SPEC_VERSION,
} from "./wire.ts"

export const BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"

/** `application/cloudevents-batch+json`, with or without parameters. */
export const isBatch = (contentType: unknown): boolean =>
  typeof contentType === "string" && contentType.split(";")[0]!.trim().toLowerCase() === BATCH_CONTENT_TYPE

/**
 * How many events, and how many bytes of them, one batch message carries at most. Keep `bytes`
 * within the publisher's `maxMessageSize`: a batch over it would be refused whole.
 */
export interface BatchLimits {
  readonly messages: number
  readonly bytes: number
}

/** The publish arguments of a relay batch, and which of its events each item carries. */
export interface EncodedBatches {
  readonly items: ReadonlyArray<EncodeResult>
  /** `members[i]`: the indexes (into the relay's batch) of the events `items[i]` carries. */
  readonly members: ReadonlyArray<ReadonlyArray<number>>
}

/** The event's structured-mode JSON text; throws on an invalid time. */
const eventJson = (message: OutgoingMessage, source: string): string => {
  const time = message.occurredAt.toISOString()
  let extra: Record<string, string | number> | undefined
  for (const key in message.headers) {
    extra ??= {}
    extra[key] = message.headers[key]!
  }
  if (message.partitionKey !== null) {
    extra ??= {}
    extra[Headers.partitionKey] = message.partitionKey
  }
  if (message.position) {
    extra ??= {}
    extra[Headers.partitionEpoch] = message.position.epoch
    extra[Headers.partitionSeq] = message.position.seq
  }
  if (message.tenantId !== null) {
    extra ??= {}
    extra[Headers.tenantId] = message.tenantId
  }
  // Built as text: the payload is JSON text already (the store's), placed as it is.
  return (
    `{"specversion":"${SPEC_VERSION}","id":${JSON.stringify(message.id)},"source":${JSON.stringify(source)}` +
    `,"type":${JSON.stringify(message.type)},"time":"${time}","datacontenttype":"${CONTENT_TYPE}"` +
    `,"txboxversion":${Number(message.version)}` +
    (extra === undefined ? "" : `,"txboxheaders":${JSON.stringify(JSON.stringify(extra))}`) +
    `,"data":${message.body === "" ? "null" : message.body}}`
  )
}

const batchItem = (
  messages: ReadonlyArray<OutgoingMessage>,
  texts: ReadonlyArray<string>,
  first: number,
  source: string,
): EncodeResult => {
  const head = messages[first]!
  return {
    _tag: "Encoded",
    message: {
      routingKey: head.routingKey,
      content: Buffer.from(`[${texts.join(",")}]`, "utf8"),
      options: {
        // The first event's id: unique among messages in flight, so a return finds its batch.
        messageId: head.id,
        type: head.type,
        timestamp: Math.floor(head.occurredAt.getTime() / 1000),
        contentType: BATCH_CONTENT_TYPE,
        appId: source,
        persistent: true,
        mandatory: true,
      },
    },
  }
}

/** A batch message being filled: its events' indexes and texts, and its size in bytes. */
interface OpenBatch {
  readonly indexes: number[]
  readonly texts: string[]
  /** Bytes so far: an upper bound until `exact`. */
  bytes: number
  /** Counted exactly since it came near the limit. */
  exact: boolean
}

/**
 * The batch's bytes with `text` added. Bytes, not UTF-16 units: the broker's and the publisher's
 * limits are in bytes. Counted only near `limit`: a UTF-16 unit is at most 3 bytes, so far from it
 * an upper bound does, and counting every event's bytes was 3 % of a relay's CPU (bench/cost.ts,
 * 1,000 msg/s).
 */
const bytesWith = (batch: OpenBatch, text: string, limit: number): number => {
  if (!batch.exact) {
    const bound = batch.bytes + text.length * 3 + 1
    if (bound <= limit) return bound
    batch.exact = true
    batch.bytes = 2
    for (const t of batch.texts) batch.bytes += Buffer.byteLength(t, "utf8") + 1
  }
  return batch.bytes + Buffer.byteLength(text, "utf8") + 1
}

/**
 * The relay's batch as batch messages: the events of each routing key in their order, up to
 * `limits` per message. An event that cannot be encoded is its own `Invalid` item (its failure,
 * never its neighbours').
 */
export const encodeBatches = (
  messages: ReadonlyArray<OutgoingMessage>,
  source: string,
  limits: BatchLimits,
): EncodedBatches => {
  const items: EncodeResult[] = []
  const members: Array<ReadonlyArray<number>> = []
  // Open batch per routing key: its events' indexes, texts and bytes so far.
  const open = new Map<string, OpenBatch>()
  const close = (key: string) => {
    const batch = open.get(key)
    if (batch === undefined) return
    open.delete(key)
    items.push(batchItem(messages, batch.texts, batch.indexes[0]!, source))
    members.push(batch.indexes)
  }
  for (let i = 0; i < messages.length; i++) {
    const message = messages[i]!
    let text: string
    try {
      if (!Number.isFinite(message.occurredAt.getTime())) throw new Error("invalid occurredAt")
      text = eventJson(message, source)
    } catch {
      // Said as binary mode says it (an invalid time is the message's fault, anything else transient).
      items.push(encodeMessage(message, source))
      members.push([i])
      continue
    }
    const key = message.routingKey
    let batch = open.get(key)
    let bytes = batch === undefined ? 0 : bytesWith(batch, text, limits.bytes)
    if (batch !== undefined && (batch.indexes.length >= limits.messages || bytes > limits.bytes)) {
      close(key)
      batch = undefined
    }
    if (batch === undefined) {
      batch = { indexes: [], texts: [], bytes: 2, exact: false }
      open.set(key, batch)
      bytes = bytesWith(batch, text, limits.bytes)
    }
    batch.indexes.push(i)
    batch.texts.push(text)
    batch.bytes = bytes
  }
  for (const key of [...open.keys()]) close(key)
  return { items, members }
}

/** One event of a batch delivery: what the inbox sees, and the event as sent (for its retry copy). */
export interface BatchedEvent {
  readonly delivery: Delivery
  readonly event: unknown
}

const CE_ATTRIBUTES = ["specversion", "id", "type", "source", "time"] as const

/** `txboxheaders`: a JSON object in a string (or, from a lenient producer, the object itself). */
const headersOf = (value: unknown): Record<string, unknown> | undefined => {
  let parsed = value
  if (typeof value === "string") {
    try {
      parsed = JSON.parse(value)
    } catch {
      return undefined
    }
  }
  return parsed !== null && typeof parsed === "object" && !Array.isArray(parsed)
    ? (parsed as Record<string, unknown>)
    : undefined
}

/** One event of a batch as the `Delivery` binary mode would have made of it. */
const eventDelivery = (event: unknown, outer: MessagePropertyHeaders, redelivered: boolean): Delivery => {
  if (event === null || typeof event !== "object" || Array.isArray(event)) {
    // Not an event: no id, so the inbox records it dead with the body kept.
    return deliveryFrom(outer, undefined, undefined, JSON.stringify(event) ?? "null", undefined, redelivered)
  }
  const e = event as Record<string, unknown>
  const raw: MessagePropertyHeaders = { ...outer }
  const extra = headersOf(e.txboxheaders)
  if (extra !== undefined) Object.assign(raw, extra)
  for (const name of CE_ATTRIBUTES) if (e[name] !== undefined) raw[`cloudEvents:${name}`] = e[name]
  if (e.txboxversion !== undefined) raw[Headers.version] = e.txboxversion
  let body: string
  let bodyBytes: Uint8Array | undefined
  if (typeof e.data_base64 === "string") {
    const bytes = Buffer.from(e.data_base64, "base64")
    body = bytes.toString("utf8")
    bodyBytes = bytes
  } else {
    body = e.data === undefined ? "null" : JSON.stringify(e.data)
  }
  return deliveryFrom(raw, undefined, undefined, body, bodyBytes, redelivered)
}

/**
 * The events of a batch delivery, or undefined when its body is no JSON array (then it is
 * handled as one ordinary message, which the inbox records dead with the body kept).
 * The message's own application properties (a retry copy's attempt) apply to every event.
 */
export const decodeBatch = (message: Message): ReadonlyArray<BatchedEvent> | undefined => {
  let events: unknown
  try {
    events = JSON.parse(message.content.toString("utf8"))
  } catch {
    return undefined
  }
  if (!Array.isArray(events) || events.length === 0) return undefined
  const headers = message.properties?.headers
  const outer: MessagePropertyHeaders = headers !== null && typeof headers === "object" ? headers : {}
  const redelivered = message.fields?.redelivered === true
  return events.map((event) => ({ delivery: eventDelivery(event, outer, redelivered), event }))
}

/** The body of a batch of one: the copy of one event sent through a retry delay queue. */
export const batchOfOne = (event: unknown): Buffer => Buffer.from(`[${JSON.stringify(event)}]`, "utf8")
