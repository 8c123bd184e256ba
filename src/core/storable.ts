/**
 * PostgreSQL cannot store a NUL character in `text` or `jsonb` (nor a
 * `\u0000` escape in `jsonb`). A foreign producer's binary body or header
 * must still end up in a dead row rather than loop forever on a failed
 * insert, so such values are kept as `base64:<bytes>`: nothing is lost, and
 * the prefix says how to read it back.
 */
const BASE64_PREFIX = "base64:"

const utf8 = new TextEncoder()
const strictUtf8 = new TextDecoder("utf-8", { fatal: true })

export const base64Of = (bytes: Uint8Array): string => {
  let binary = ""
  // In chunks: String.fromCharCode(...all) overflows the stack on large bodies.
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000))
  }
  return BASE64_PREFIX + btoa(binary)
}

/** Half a UTF-16 character: a high surrogate not followed by a low one, or a low one alone. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/
const LONE_SURROGATES = new RegExp(LONE_SURROGATE.source, "g")

const storableText = (text: string): boolean => !text.includes("\u0000") && !LONE_SURROGATE.test(text)

/** Header names and values as PostgreSQL can store them: any NUL-bearing one as base64. */
export const storableHeaders = (
  headers: Readonly<Record<string, string>>,
): Readonly<Record<string, string>> => {
  let clean = true
  for (const [key, value] of Object.entries(headers)) {
    if (!storableText(key) || !storableText(value)) clean = false
  }
  if (clean) return headers
  const out: Record<string, string> = {}
  for (const [key, value] of Object.entries(headers)) {
    const name = storableText(key) ? key : base64Of(utf8.encode(key))
    out[name] = storableText(value) ? value : base64Of(utf8.encode(value))
  }
  return out
}

/**
 * The body of an undecodable message as text PostgreSQL can store: as received
 * when it is valid UTF-8 without NUL, else its exact bytes in base64 (`bytes`
 * when the transport kept them; the text's UTF-8 otherwise).
 */
export const storableBody = (text: string, bytes: Uint8Array | undefined): string => {
  if (bytes !== undefined) {
    try {
      strictUtf8.decode(bytes)
    } catch {
      return base64Of(bytes)
    }
  }
  return storableText(text) ? text : base64Of(bytes ?? utf8.encode(text))
}

/**
 * A name or a message for people as PostgreSQL stores it: a NUL shown as the
 * escape `\u0000`, a lone UTF-16 surrogate (half a character, which no UTF-8
 * column takes) as U+FFFD. Error text may quote anything a handler saw.
 */
export function storableMessage(text: string): string
export function storableMessage(text: string | null): string | null
export function storableMessage(text: string | null): string | null {
  if (text === null || storableText(text)) return text
  return text.replaceAll("\u0000", "\\u0000").replace(LONE_SURROGATES, "\uFFFD")
}

const visible = storableMessage

/**
 * An inbox row as PostgreSQL can store it, whatever a foreign producer sent:
 * names and error text with NUL shown escaped, headers and raw bodies with
 * NUL kept as base64. A row already clean is returned as is.
 */
export const storableRow = <R extends StorableRow>(row: R): R => {
  const clean =
    storableText(row.key) &&
    (row.type === null || storableText(row.type)) &&
    (row.partitionKey === null || storableText(row.partitionKey)) &&
    (row.tenantId === null || storableText(row.tenantId)) &&
    (row.lastError === null || storableText(row.lastError)) &&
    (row.raw === null || storableText(row.raw))
  const headers = storableHeaders(row.headers)
  if (clean && headers === row.headers) return row
  return {
    ...row,
    key: visible(row.key)!,
    type: visible(row.type),
    partitionKey: visible(row.partitionKey),
    tenantId: visible(row.tenantId),
    lastError: visible(row.lastError),
    raw: row.raw === null || storableText(row.raw) ? row.raw : base64Of(utf8.encode(row.raw)),
    headers,
  }
}

interface StorableRow {
  readonly key: string
  readonly type: string | null
  readonly partitionKey: string | null
  readonly tenantId: string | null
  readonly lastError: string | null
  readonly raw: string | null
  readonly headers: Readonly<Record<string, string>>
}
