/**
 * The outbox INSERT of `Outbox.enqueue` as SQL text written once per schema.
 * Kysely's builder built and compiled the statement on every call, at a
 * large share of enqueue's client CPU (bench/enqueue.ts); the text depends on
 * the schema and on one row vs. several, so two texts per schema cover every
 * call. Sent as a raw compiled query, it also skips the caller's plugins,
 * which must not rename txbox's columns anyway.
 */
import { CompiledQuery } from "kysely"

/** One outbox row, its values as the statement binds them. */
export interface OutboxValues {
  readonly id: string
  readonly type: string
  readonly version: number
  /** JSON text. */
  readonly payload: string
  /** JSON text of a string → string object. */
  readonly headers: string
  readonly routing_key: string | null
  readonly partition_key: string | null
  readonly tenant_id: string | null
  /** An absolute due time; null: now() plus `delay_ms`. */
  readonly visible_at: Date | null
  /** Milliseconds after the database's now() (0: due at once); ignored when `visible_at` is set. */
  readonly delay_ms: number
  readonly partition_epoch: number | null
  readonly partition_seq: number | null
}

const COLUMNS =
  "id, type, version, payload, headers, routing_key, partition_key, tenant_id, visible_at, partition_epoch, partition_seq"

interface Texts {
  /** One row with nothing but defaults beyond type, version, payload and headers: the common call. */
  readonly plain: string
  readonly one: string
  readonly many: string
}

const texts = new Map<string, Texts>()

/** `schema` must already be a validated identifier (`validateSchemaName`). */
const textsFor = (schema: string): Texts => {
  let t = texts.get(schema)
  if (t === undefined) {
    const table = `"${schema}".outbox`
    t = {
      // Four parameters instead of twelve: each one is serialised by the driver and parsed by the
      // server on every call (visible_at's default is now(), the same as a delay of 0).
      plain: `INSERT INTO ${table} (id, type, version, payload, headers) VALUES ($1, $2, $3, $4::text::jsonb, $5::text::jsonb)`,
      // Database time, not the caller's clock: due times compare against now() in the claim.
      one:
        `INSERT INTO ${table} (${COLUMNS}) VALUES ($1, $2, $3, $4::text::jsonb, $5::text::jsonb, $6, $7, $8, ` +
        `COALESCE($9::timestamptz, now() + $10::bigint * interval '1 millisecond'), $11::bigint, $12::bigint)`,
      // One JSON text parameter for any number of rows: one text, one plan.
      many:
        `INSERT INTO ${table} (${COLUMNS}) SELECT r.id, r.type, r.version, r.payload::jsonb, r.headers::jsonb, ` +
        "r.routing_key, r.partition_key, r.tenant_id, " +
        "COALESCE(r.visible_at, now() + r.delay_ms * interval '1 millisecond'), r.partition_epoch, r.partition_seq " +
        "FROM json_to_recordset($1::text::json) AS r(id uuid, type text, version integer, payload text, headers text, " +
        "routing_key text, partition_key text, tenant_id text, visible_at timestamptz, delay_ms bigint, " +
        "partition_epoch bigint, partition_seq bigint)",
    }
    texts.set(schema, t)
  }
  return t
}

/** The INSERT for `rows` (at least one) into `schema`'s outbox. */
export const insertOutbox = (schema: string, rows: ReadonlyArray<OutboxValues>): CompiledQuery => {
  const t = textsFor(schema)
  if (rows.length === 1) {
    const r = rows[0]!
    if (
      r.routing_key === null &&
      r.partition_key === null &&
      r.tenant_id === null &&
      r.visible_at === null &&
      r.delay_ms === 0 &&
      r.partition_epoch === null &&
      r.partition_seq === null
    )
      return CompiledQuery.raw(t.plain, [r.id, r.type, r.version, r.payload, r.headers])
    return CompiledQuery.raw(t.one, [
      r.id,
      r.type,
      r.version,
      r.payload,
      r.headers,
      r.routing_key,
      r.partition_key,
      r.tenant_id,
      r.visible_at,
      r.delay_ms,
      r.partition_epoch,
      r.partition_seq,
    ])
  }
  return CompiledQuery.raw(t.many, [JSON.stringify(rows)])
}
