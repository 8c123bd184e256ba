/**
 * The inbox's statements. Every write is keyed on (message_id, consumer) with
 * ON CONFLICT DO NOTHING: the primary key is the dedupe, so two consumers
 * racing on one redelivered message cannot both win.
 */
import { type Kysely, sql, type Transaction } from "kysely"
import type { DatabaseShape } from "../ports/Database.ts"
import { withDbErrors as run } from "./dbErrors.ts"

// biome-ignore lint/suspicious/noExplicitAny: any executor on the caller's database
type Executor = Kysely<any> | Transaction<any>

export interface InboxRow {
  readonly message_id: string
  readonly consumer: string
  readonly type: string | null
  readonly version: number | null
  /** JSON text of the payload, or null when the body could not be decoded. */
  readonly payload: string | null
  readonly raw: string | null
  readonly headers: Readonly<Record<string, string>>
  readonly partition_key: string | null
  readonly tenant_id: string | null
  readonly attempts: number
  readonly last_error: string | null
}

const values = (rows: ReadonlyArray<InboxRow>) =>
  JSON.stringify(rows.map((r) => ({ ...r, headers: r.headers })))

const insertRows = (
  executor: Executor,
  schema: string,
  rows: ReadonlyArray<InboxRow>,
  status: "pending" | "processed" | "dead",
) =>
  sql<{ message_id: string }>`
    INSERT INTO ${sql.id(schema, "inbox")}
      (message_id, consumer, type, version, payload, raw, headers, partition_key, tenant_id, attempts, status, processed_at, last_error)
    SELECT r.message_id, r.consumer, r.type, r.version, r.payload::jsonb, r.raw, COALESCE(r.headers, '{}'::jsonb),
           r.partition_key, r.tenant_id, r.attempts, ${status},
           CASE WHEN ${status} = 'processed' THEN now() END, r.last_error
    FROM jsonb_to_recordset(${values(rows)}::text::jsonb) AS r(
      message_id text, consumer text, type text, version int, payload text, raw text, headers jsonb,
      partition_key text, tenant_id text, attempts int, last_error text)
    ON CONFLICT (message_id, consumer) DO NOTHING
    RETURNING message_id`.execute(executor)

/**
 * Inserts the row as processed in the handler's transaction; false when the key exists (a duplicate).
 * A plain single-row VALUES, not the batch form: this runs once per delivery, and the recordset
 * form spends about as long in parse and plan as in execution (measured: 640–700 → 460–490 µs of
 * server CPU per transaction, bench/README.md "inbox").
 */
export const insertProcessed = (trx: Executor, schema: string, row: InboxRow): Promise<boolean> =>
  run("Inbox.insert", async () => {
    const result = await sql<{ message_id: string }>`
      INSERT INTO ${sql.id(schema, "inbox")}
        (message_id, consumer, type, version, payload, headers, partition_key, tenant_id, attempts, status, processed_at)
      VALUES (${row.message_id}, ${row.consumer}, ${row.type}, ${row.version}::int, ${row.payload}::text::jsonb,
              ${JSON.stringify(row.headers ?? {})}::text::jsonb, ${row.partition_key}, ${row.tenant_id},
              ${row.attempts}::int, 'processed', now())
      ON CONFLICT (message_id, consumer) DO NOTHING
      RETURNING message_id`.execute(trx)
    return result.rows.length === 1
  })

/** Records rows that will never be handled (undecodable, unknown, out of attempts). */
export const insertDead = (
  executor: Executor,
  schema: string,
  rows: ReadonlyArray<InboxRow>,
): Promise<number> =>
  run("Inbox.dead", async () => (await insertRows(executor, schema, rows, "dead")).rows.length)

/** Store-then-process: persists a batch of deliveries in one statement; returns how many were new. */
export const insertPending = (db: DatabaseShape, rows: ReadonlyArray<InboxRow>): Promise<number> =>
  run("Inbox.store", async () => (await insertRows(db.db, db.schema, rows, "pending")).rows.length)

/** Store-then-process: claims due pending rows of one consumer (SKIP LOCKED + lease, as the relay does). */
export const claimPending = (
  db: DatabaseShape,
  consumer: string,
  limit: number,
  token: string,
  leaseMs: number,
): Promise<InboxRow[]> =>
  run("Inbox.claim", async () => {
    const t = sql.id(db.schema, "inbox")
    const result = await sql<InboxRow>`
      WITH due AS (
        SELECT message_id FROM ${t}
        WHERE consumer = ${consumer} AND status = 'pending' AND visible_at <= now()
        ORDER BY visible_at
        LIMIT ${limit}::int
        FOR UPDATE SKIP LOCKED
      )
      UPDATE ${t} AS i
      SET lock_token = ${token}::uuid, visible_at = now() + ${leaseMs}::int * interval '1 millisecond'
      FROM due WHERE i.consumer = ${consumer} AND i.message_id = due.message_id
      RETURNING i.message_id, i.consumer, i.type, i.version, i.payload::text AS payload, i.raw, i.headers,
                i.partition_key, i.tenant_id, i.attempts, i.last_error`.execute(db.db)
    return result.rows
  })

/**
 * Marks a claimed row processed inside the handler's transaction, so the
 * effect and the mark commit together. False when the claim was lost.
 */
export const markProcessed = (
  trx: Executor,
  schema: string,
  row: InboxRow,
  token: string,
): Promise<boolean> =>
  run("Inbox.markProcessed", async () => {
    const result = await sql`
      UPDATE ${sql.id(schema, "inbox")}
      SET status = 'processed', processed_at = now(), attempts = attempts + 1, lock_token = NULL
      WHERE consumer = ${row.consumer} AND message_id = ${row.message_id} AND lock_token = ${token}::uuid
        AND status = 'pending'`.execute(trx)
    return Number(result.numAffectedRows ?? 0n) === 1
  })

export type FailureMark = {
  readonly messageId: string
  readonly status: "pending" | "dead"
  readonly delayMs: number
  readonly error: string
}

/** Store-then-process: records a batch's failures (retry later or dead) in one statement. */
export const markFailures = (
  db: DatabaseShape,
  consumer: string,
  token: string,
  marks: ReadonlyArray<FailureMark>,
): Promise<number> =>
  run("Inbox.markFailures", async () => {
    if (marks.length === 0) return 0
    const rows = marks.map((m) => ({
      id: m.messageId,
      status: m.status,
      delay_ms: m.delayMs,
      error: m.error,
    }))
    const result = await sql`
      UPDATE ${sql.id(db.schema, "inbox")} AS i SET
        status = u.status,
        attempts = i.attempts + 1,
        visible_at = now() + u.delay_ms * interval '1 millisecond',
        last_error = u.error,
        lock_token = NULL
      FROM json_to_recordset(${JSON.stringify(rows)}::text::json) AS u(id text, status text, delay_ms bigint, error text)
      WHERE i.consumer = ${consumer} AND i.message_id = u.id AND i.lock_token = ${token}::uuid AND i.status = 'pending'`.execute(
      db.db,
    )
    return Number(result.numAffectedRows ?? 0n)
  })
