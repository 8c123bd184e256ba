/**
 * CloudEvents structured content mode (`application/cloudevents+json`): the
 * whole event — attributes and data — is the JSON body, as the CloudEvents
 * SDKs write it. txbox itself publishes in binary mode; a structured message
 * from a foreign producer is read as the same thing: its data becomes the body
 * and its attributes become `cloudEvents:<name>` headers.
 */
import { Buffer } from "node:buffer"

export const STRUCTURED_CONTENT_TYPE = "application/cloudevents+json"

export interface StructuredEvent {
  /** Every attribute but the data, as sent (extensions included). */
  readonly attributes: Readonly<Record<string, unknown>>
  /** The event's data as JSON text; `null` when the event has none. */
  readonly body: string
  /** The decoded bytes of `data_base64`, when the data came that way. */
  readonly bodyBytes?: Uint8Array
}

/** `application/cloudevents+json`, with or without parameters (`; charset=utf-8`). */
export const isStructured = (contentType: unknown): boolean =>
  typeof contentType === "string" &&
  contentType.split(";")[0]!.trim().toLowerCase() === STRUCTURED_CONTENT_TYPE

/**
 * The event in a structured body, or undefined when the body is not a JSON
 * object: then it is handled as an ordinary body, which its contract refuses
 * (a dead row with the body kept), never a crash.
 */
export const parseStructured = (content: Uint8Array): StructuredEvent | undefined => {
  let event: unknown
  try {
    event = JSON.parse(Buffer.from(content).toString("utf8"))
  } catch {
    return undefined
  }
  if (event === null || typeof event !== "object" || Array.isArray(event)) return undefined
  const { data, data_base64: dataBase64, ...attributes } = event as Record<string, unknown>
  if (typeof dataBase64 === "string") {
    const bytes = Buffer.from(dataBase64, "base64")
    return { attributes, body: bytes.toString("utf8"), bodyBytes: bytes }
  }
  return { attributes, body: data === undefined ? "null" : JSON.stringify(data) }
}
