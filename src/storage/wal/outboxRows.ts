/**
 * An outbox row from its `pgoutput` insert: the columns' text forms (as the walsender's session
 * writes them: `DateStyle=ISO`, `TimeZone=UTC`, set by the replication connection) by the
 * relation's column names, made the message the relay publishes. The payload stays the text
 * PostgreSQL wrote, as on the polling path (`payload::text`), never parsed and re-serialised.
 */
import type { OutboxLogRow } from "../../ports/OutboxLog.ts"
import type { OutboxStatus } from "../../ports/tables.ts"
import { ProtocolError } from "./pgoutput.ts"

/** A relation's columns: where each outbox column sits in an insert's values. */
export type ColumnIndex = ReadonlyMap<string, number>

export const columnIndex = (columns: ReadonlyArray<string>): ColumnIndex =>
  new Map(columns.map((name, i) => [name, i]))

/** The columns a relay needs: a relation without one of them is not txbox's outbox. */
const REQUIRED = [
  "id",
  "type",
  "version",
  "payload",
  "occurred_at",
  "visible_at",
  "attempts",
  "status",
] as const

export const isOutboxRelation = (index: ColumnIndex): boolean => REQUIRED.every((c) => index.has(c))

/** The digit at `i` of `text`, or -1. */
const digit = (text: string, i: number): number => {
  const d = text.charCodeAt(i) - 48
  return d >= 0 && d <= 9 ? d : -1
}

/** `n` digits of `text` from `i` as a number, or -1 when one is not a digit. */
const digits = (text: string, i: number, n: number): number => {
  let value = 0
  for (let k = 0; k < n; k++) {
    const d = digit(text, i + k)
    if (d < 0) return -1
    value = value * 10 + d
  }
  return value
}

/**
 * `2026-11-28 21:00:00.123456+00` (ISO style, what the replication session writes) read by hand:
 * `new Date` of the text was a tenth of the WAL relay's own CPU (two per row; Node's profiler,
 * bench/cost.ts at 1,000 msg/s). Any other form (a year past 9999, BC) goes through `new Date`.
 */
const fastTimestamp = (text: string): number => {
  if (text.length < 22 || text[4] !== "-" || text[7] !== "-" || text[10] !== " ") return Number.NaN
  if (text[13] !== ":" || text[16] !== ":") return Number.NaN
  const year = digits(text, 0, 4)
  const month = digits(text, 5, 2)
  const day = digits(text, 8, 2)
  const hour = digits(text, 11, 2)
  const minute = digits(text, 14, 2)
  const second = digits(text, 17, 2)
  if (year < 0 || month < 0 || day < 0 || hour < 0 || minute < 0 || second < 0) return Number.NaN
  let i = 19
  let ms = 0
  if (text[i] === ".") {
    i++
    // Milliseconds from the first three digits of the fraction; the µs are dropped.
    let scale = 100
    for (let d = digit(text, i); d >= 0; d = digit(text, i)) {
      ms += d * scale
      scale /= 10
      i++
    }
    ms = Math.floor(ms)
  }
  const sign = text[i] === "+" ? 1 : text[i] === "-" ? -1 : 0
  const offsetHours = digits(text, i + 1, 2)
  if (sign === 0 || offsetHours < 0) return Number.NaN
  i += 3
  let offsetMinutes = 0
  if (i < text.length) {
    if (text[i] === ":") i++
    offsetMinutes = digits(text, i, 2)
    if (offsetMinutes < 0 || i + 2 !== text.length) return Number.NaN
  }
  const utc = Date.UTC(year, month - 1, day, hour, minute, second, ms)
  return utc - sign * (offsetHours * 60 + offsetMinutes) * 60_000
}

/** `2026-11-28 21:00:00.123456+00` (ISO style): a `Date` (ms; the µs are dropped). */
export const parseTimestamp = (text: string): Date => {
  const fast = fastTimestamp(text)
  const date = Number.isNaN(fast)
    ? new Date(text.replace(" ", "T").replace(/([+-]\d\d)$/, "$1:00"))
    : new Date(fast)
  if (Number.isNaN(date.getTime())) throw new ProtocolError(`not a timestamp: ${text}`)
  return date
}

const STATUSES: ReadonlySet<string> = new Set<OutboxStatus>(["pending", "sent", "dead"])

export const outboxRowOf = (index: ColumnIndex, values: ReadonlyArray<string | null>): OutboxLogRow => {
  const at = (name: string): string | null => {
    const i = index.get(name)
    return i === undefined ? null : (values[i] ?? null)
  }
  const required = (name: string): string => {
    const value = at(name)
    if (value === null) throw new ProtocolError(`outbox insert without ${name}`)
    return value
  }
  const status = required("status")
  if (!STATUSES.has(status)) throw new ProtocolError(`outbox insert with status ${status}`)
  const epoch = at("partition_epoch")
  const seq = at("partition_seq")
  const headers = at("headers")
  return {
    id: required("id"),
    type: required("type"),
    version: Number(required("version")),
    payload: required("payload"),
    headers: headers === null ? {} : (JSON.parse(headers) as Record<string, string>),
    routingKey: at("routing_key"),
    partitionKey: at("partition_key"),
    position: epoch === null || seq === null ? null : { epoch: Number(epoch), seq: Number(seq) },
    tenantId: at("tenant_id"),
    occurredAt: parseTimestamp(required("occurred_at")),
    visibleAt: parseTimestamp(required("visible_at")),
    attempts: Number(required("attempts")),
    status: status as OutboxStatus,
  }
}
