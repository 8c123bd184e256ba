/**
 * The wire format, both ways, as pure functions: an `OutgoingMessage` becomes
 * an AMQP publish following the CloudEvents 1.0 AMQP binding (binary mode: the
 * body is the event data, the attributes are AMQP properties and application
 * properties), and any AMQP delivery — ours or a foreign one — becomes a
 * `Delivery` without throwing.
 */
import { Buffer } from "node:buffer"
import type { Message, MessagePropertyHeaders, Options } from "amqplib"
import { PARTITION_EPOCH_HEADER, PARTITION_SEQ_HEADER, positionOf } from "../../core/position.ts"
import type { Delivery, OutgoingMessage } from "../../ports/Transport.ts"
import { isStructured, parseStructured } from "./structured.ts"

/** Application property names (AMQP headers) this library writes and reads. */
export const Headers = {
  specversion: "cloudEvents:specversion",
  id: "cloudEvents:id",
  type: "cloudEvents:type",
  source: "cloudEvents:source",
  time: "cloudEvents:time",
  /** The event contract version, a number. */
  version: "txbox-version",
  /**
   * The same version as a CloudEvents extension attribute (`txboxversion`), for
   * producers that write CloudEvents: read when `txbox-version` is absent.
   */
  versionAttribute: "cloudEvents:txboxversion",
  partitionKey: "partition-key",
  /** The partition key's counter epoch and the message's number in it: numbers, set together. */
  partitionEpoch: PARTITION_EPOCH_HEADER,
  partitionSeq: PARTITION_SEQ_HEADER,
  tenantId: "tenant-id",
  traceparent: "traceparent",
  /** Attempt number of a copy republished through a retry delay queue (2 for the first retry). */
  attempt: "x-txbox-attempt",
} as const

export const CONTENT_TYPE = "application/json"
export const SPEC_VERSION = "1.0"

/** A message ready for `channel.publish`: the body converted once, the properties built once. */
export interface EncodedMessage {
  readonly routingKey: string
  readonly content: Buffer
  readonly options: Options.Publish
}

/** Either the publish arguments or why this message can never be sent. */
export type EncodeResult =
  | { readonly _tag: "Encoded"; readonly message: EncodedMessage }
  /** `transient`: encoding threw (a driver that hands back a field of another type): worth an attempt, not dead at once. */
  | { readonly _tag: "Invalid"; readonly error: string; readonly transient?: boolean }

/**
 * Maps an outgoing message to publish arguments. User headers go first so that
 * the CloudEvents attributes cannot be overridden by a header of the same name.
 */
export const encodeMessage = (message: OutgoingMessage, source: string): EncodeResult => {
  // One message that breaks the encoder is that message's failure, never the batch's or the loop's.
  try {
    return encodeOrThrow(message, source)
  } catch (error) {
    const why = error instanceof Error ? error.message : String(error)
    return { _tag: "Invalid", error: `could not encode message ${message.id}: ${why}`, transient: true }
  }
}

const encodeOrThrow = (message: OutgoingMessage, source: string): EncodeResult => {
  const millis = message.occurredAt.getTime()
  if (!Number.isFinite(millis))
    return { _tag: "Invalid", error: `message ${message.id} has an invalid occurredAt` }
  const headers: Record<string, string | number> = { ...message.headers }
  headers[Headers.specversion] = SPEC_VERSION
  headers[Headers.id] = message.id
  headers[Headers.type] = message.type
  headers[Headers.source] = source
  headers[Headers.time] = message.occurredAt.toISOString()
  headers[Headers.version] = message.version
  if (message.partitionKey !== null) headers[Headers.partitionKey] = message.partitionKey
  if (message.position) {
    headers[Headers.partitionEpoch] = message.position.epoch
    headers[Headers.partitionSeq] = message.position.seq
  }
  if (message.tenantId !== null) headers[Headers.tenantId] = message.tenantId
  return {
    _tag: "Encoded",
    message: {
      routingKey: message.routingKey,
      content: Buffer.from(message.body, "utf8"),
      options: {
        messageId: message.id,
        type: message.type,
        // AMQP timestamps are whole seconds; the exact time is in cloudEvents:time.
        timestamp: Math.floor(millis / 1000),
        contentType: CONTENT_TYPE,
        appId: source,
        headers,
        persistent: true,
        mandatory: true,
      },
    },
  }
}

const headerString = (value: unknown): string => {
  if (typeof value === "string") return value
  // Binary long strings come from other clients; text is what callers expect.
  if (Buffer.isBuffer(value)) return value.toString("utf8")
  if (value === undefined) return ""
  if (typeof value === "number" || typeof value === "boolean" || typeof value === "bigint")
    return String(value)
  try {
    return (
      JSON.stringify(value, (_key, v: unknown) => {
        if (typeof v === "bigint") return v.toString()
        // JSON.stringify has already turned Buffers into {type, data} here.
        if (v !== null && typeof v === "object" && (v as { type?: unknown }).type === "Buffer") {
          const data = (v as { data?: unknown }).data
          if (Array.isArray(data)) return Buffer.from(data as Array<number>).toString("utf8")
        }
        return v
      }) ?? String(value)
    )
  } catch {
    return String(value)
  }
}

const optionalString = (value: unknown): string | undefined =>
  typeof value === "string" ? value : Buffer.isBuffer(value) ? value.toString("utf8") : undefined

const finiteNumber = (value: unknown): number | undefined => {
  const n =
    typeof value === "number"
      ? value
      : typeof value === "string" && value.trim() !== ""
        ? Number(value)
        : Number.NaN
  return Number.isFinite(n) ? n : undefined
}

/**
 * A CloudEvents attribute from the application properties: `cloudEvents:` is
 * the AMQP binding's prefix, `cloudEvents_` the one it allows for JMS clients.
 */
const attribute = (raw: MessagePropertyHeaders, name: string): unknown =>
  raw[`cloudEvents:${name}`] ?? raw[`cloudEvents_${name}`]

/**
 * Maps any delivery to what the inbox sees. Missing properties, missing or
 * odd headers and non-string values are tolerated: a foreign message must
 * reach the inbox (which dead-letters what it cannot handle), never crash the
 * consumer. A CloudEvents structured-mode message (`application/cloudevents+json`)
 * is read as its binary-mode twin: data as the body, attributes as headers.
 */
export const decodeDelivery = (message: Message): Delivery => {
  const properties = message.properties ?? {}
  let raw: MessagePropertyHeaders =
    properties.headers !== null && typeof properties.headers === "object" ? properties.headers : {}
  const content = Buffer.isBuffer(message.content) ? message.content : undefined
  const structured =
    content !== undefined && isStructured(properties.contentType) ? parseStructured(content) : undefined
  let body = content === undefined ? "" : content.toString("utf8")
  let bodyBytes: Uint8Array | undefined = content
  if (structured !== undefined) {
    raw = { ...raw }
    for (const [name, value] of Object.entries(structured.attributes)) raw[`cloudEvents:${name}`] = value
    body = structured.body
    bodyBytes = structured.bodyBytes
  }
  return deliveryFrom(
    raw,
    optionalString(properties.messageId),
    optionalString(properties.type),
    body,
    bodyBytes,
    message.fields?.redelivered === true,
  )
}

/**
 * A `Delivery` from a message's (or a batched event's) application properties `raw`, its
 * `messageId` and `type` properties when it has them, and its body.
 */
export const deliveryFrom = (
  raw: MessagePropertyHeaders,
  messageId: string | undefined,
  type: string | undefined,
  body: string,
  bodyBytes: Uint8Array | undefined,
  redelivered: boolean,
): Delivery => {
  const headers: Record<string, string> = {}
  for (const key of Object.keys(raw)) headers[key] = headerString(raw[key])
  const version = finiteNumber(raw[Headers.version]) ?? finiteNumber(attribute(raw, "txboxversion"))
  const attempt = finiteNumber(raw[Headers.attempt])
  const position = positionOf(raw[Headers.partitionEpoch], raw[Headers.partitionSeq])
  return {
    messageId: messageId ?? optionalString(attribute(raw, "id")),
    type: type ?? optionalString(attribute(raw, "type")),
    version,
    body,
    ...(bodyBytes === undefined ? {} : { bodyBytes }),
    headers,
    partitionKey: optionalString(raw[Headers.partitionKey]),
    ...(position === undefined ? {} : { position }),
    tenantId: optionalString(raw[Headers.tenantId]),
    attempt: attempt !== undefined && Number.isInteger(attempt) && attempt >= 1 ? attempt : 1,
    redelivered,
  }
}

/**
 * Why the broker dead-lettered a message, from its newest `x-death` entry
 * (RabbitMQ puts the latest first): e.g. `delivery_limit in txbox.orders`.
 */
export const deadLetterReason = (message: Message): string => {
  const raw = message.properties?.headers?.["x-death"]
  const latest: unknown = Array.isArray(raw) ? raw[0] : undefined
  if (latest === null || typeof latest !== "object") return "dead-lettered by the broker"
  const { reason, queue, count } = latest as Record<string, unknown>
  const what = optionalString(reason) ?? "dead-lettered"
  const where = optionalString(queue)
  const times = finiteNumber(count)
  return `${what}${where === undefined ? "" : ` in ${where}`}${times === undefined ? "" : ` (x-death count ${times})`}`
}

/** Headers the broker adds on dead-lettering; dropped from retry copies so they do not pile up. */
const isDeathHeader = (key: string): boolean =>
  key === "x-death" || key.startsWith("x-first-death-") || key.startsWith("x-last-death-")

/**
 * Publish options for the copy of a delivery sent to a retry delay queue: the
 * same properties and headers (so the event is unchanged when it comes back),
 * the next attempt number, and the delay as per-message TTL (none when `delayMs`
 * is undefined: a copy for the consumer queue itself).
 */
export const retryCopyOptions = (
  message: Message,
  nextAttempt: number,
  delayMs: number | undefined,
): Options.Publish => {
  const p = message.properties ?? {}
  const headers: Record<string, unknown> = {}
  const raw: Record<string, unknown> = p.headers !== null && typeof p.headers === "object" ? p.headers : {}
  for (const key of Object.keys(raw)) if (!isDeathHeader(key)) headers[key] = raw[key]
  headers[Headers.attempt] = nextAttempt
  const options: Options.Publish = { headers, persistent: true, mandatory: true }
  // No TTL for a copy sent straight back to the consumer queue: a TTL there would dead-letter it.
  if (delayMs !== undefined) options.expiration = String(Math.max(0, Math.round(delayMs)))
  if (p.contentType !== undefined) options.contentType = p.contentType
  if (p.contentEncoding !== undefined) options.contentEncoding = p.contentEncoding
  if (p.priority !== undefined) options.priority = p.priority
  if (p.correlationId !== undefined) options.correlationId = p.correlationId
  if (p.replyTo !== undefined) options.replyTo = p.replyTo
  if (p.messageId !== undefined) options.messageId = p.messageId
  if (p.timestamp !== undefined) options.timestamp = p.timestamp
  if (p.type !== undefined) options.type = p.type
  if (p.appId !== undefined) options.appId = p.appId
  return options
}
