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

/** `2026-11-28 21:00:00.123456+00` (ISO style): a `Date` (ms; the µs are dropped). */
export const parseTimestamp = (text: string): Date => {
  const date = new Date(text.replace(" ", "T").replace(/([+-]\d\d)$/, "$1:00"))
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
