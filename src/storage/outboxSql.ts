/**
 * The relay's three statements on the outbox. One round trip each per batch,
 * whatever the batch size: that is the whole performance story of the relay's
 * database side.
 */
import { sql } from "kysely"
import type { DatabaseShape } from "../ports/Database.ts"
import { withDbErrors as run } from "./dbErrors.ts"

export interface ClaimedRow {
  readonly id: string
  readonly type: string
  readonly version: number
  /** The payload as JSON text: cast in SQL so the relay never parses and re-serialises it. */
  readonly payload: string
  readonly headers: Record<string, string>
  readonly routing_key: string | null
  readonly partition_key: string | null
  readonly tenant_id: string | null
  readonly occurred_at: Date
  readonly attempts: number
}

export type RowMark =
  | { readonly id: string; readonly status: "sent" }
  | { readonly id: string; readonly status: "pending"; readonly delayMs: number; readonly error: string }
  | { readonly id: string; readonly status: "dead"; readonly error: string }

const table = (db: DatabaseShape) => sql.id(db.schema, "outbox")

/**
 * Claims up to `limit` due rows: locks them with SKIP LOCKED (other relays
 * take the next rows instead of waiting), stamps them with `token` and pushes
 * `visible_at` out by the lease. Autocommit, so no transaction stays open
 * while the batch is published; a relay that dies leaves rows that come due
 * again when the lease ends.
 */
export const claim = (
  db: DatabaseShape,
  limit: number,
  token: string,
  leaseMs: number,
): Promise<ClaimedRow[]> =>
  run("Relay.claim", async () => {
    const t = table(db)
    const result = await sql<ClaimedRow>`
      WITH due AS (
        SELECT id FROM ${t}
        WHERE status = 'pending' AND visible_at <= now()
        ORDER BY visible_at
        LIMIT ${limit}::int
        FOR UPDATE SKIP LOCKED
      )
      UPDATE ${t} AS o
      SET lock_token = ${token}::uuid, visible_at = now() + ${leaseMs}::int * interval '1 millisecond'
      FROM due WHERE o.id = due.id
      RETURNING o.id, o.type, o.version, o.payload::text AS payload, o.headers, o.routing_key,
                o.partition_key, o.tenant_id, o.occurred_at, o.attempts`.execute(db.db)
    return result.rows
  })

/**
 * Records a whole batch's outcomes in one statement. Rows are matched on the
 * claim's token as well as the id: if this relay's lease ran out and another
 * relay claimed the row, this mark changes nothing (the count tells).
 * The outcomes travel as one JSON parameter: every driver (postgres.js,
 * node-postgres, PGlite) binds a string the same way, which typed arrays for
 * UNNEST do not guarantee.
 */
export const mark = (db: DatabaseShape, token: string, marks: ReadonlyArray<RowMark>): Promise<number> =>
  run("Relay.mark", async () => {
    if (marks.length === 0) return 0
    const rows = marks.map((m) =>
      m.status === "sent"
        ? { id: m.id, status: m.status, delay_ms: 0, inc: 0, error: null }
        : {
            id: m.id,
            status: m.status,
            delay_ms: m.status === "pending" ? m.delayMs : 0,
            inc: 1,
            error: m.error,
          },
    )
    const t = table(db)
    const result = await sql`
      UPDATE ${t} AS o SET
        status = u.status,
        attempts = o.attempts + u.inc,
        visible_at = CASE WHEN u.status = 'pending' THEN now() + u.delay_ms * interval '1 millisecond' ELSE o.visible_at END,
        published_at = CASE WHEN u.status = 'sent' THEN now() ELSE o.published_at END,
        last_error = COALESCE(u.error, o.last_error),
        lock_token = NULL
      FROM json_to_recordset(${JSON.stringify(rows)}::text::json) AS u(id uuid, status text, delay_ms bigint, inc int, error text)
      WHERE o.id = u.id AND o.lock_token = ${token}::uuid AND o.status = 'pending'`.execute(db.db)
    return Number(result.numAffectedRows ?? 0n)
  })

/** Hands rows claimed with `token` back at once (graceful shutdown with a batch that never went out). */
export const release = (db: DatabaseShape, token: string): Promise<number> =>
  run("Relay.release", async () => {
    const result = await sql`
      UPDATE ${table(db)} SET lock_token = NULL, visible_at = now()
      WHERE lock_token = ${token}::uuid AND status = 'pending'`.execute(db.db)
    return Number(result.numAffectedRows ?? 0n)
  })

/** Seconds since the oldest due pending row became due (0 when none): the relay's lag. */
export const lagSeconds = (db: DatabaseShape): Promise<number> =>
  run("Relay.lag", async () => {
    const result = await sql<{ lag: number | string | null }>`
      SELECT extract(epoch FROM now() - min(visible_at)) AS lag FROM ${table(db)}
      WHERE status = 'pending' AND visible_at <= now()`.execute(db.db)
    return Math.max(0, Number(result.rows[0]?.lag ?? 0))
  })
