// The soak's verdict, read from the tables alone: business rows, effects, and txbox's own outbox
// and inbox. Nothing here asks a process what it did.
import { type Kysely, sql } from "kysely"

// biome-ignore lint/suspicious/noExplicitAny: the soak's own tables next to txbox's
export type Db = Kysely<any>

/** The business tables: orders (written with their event) and effects (one row per handler run). */
export const createBusinessTables = async (db: Db): Promise<void> => {
  await sql`CREATE TABLE orders (id uuid PRIMARY KEY, n integer NOT NULL)`.execute(db)
  // No unique key on purpose: a handler applied twice must show up as two rows, not as an error.
  await sql`
    CREATE TABLE effects (
      id         bigserial   PRIMARY KEY,
      order_id   uuid        NOT NULL,
      consumer   text        NOT NULL,
      message_id text        NOT NULL,
      pid        integer     NOT NULL,
      applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
    )`.execute(db)
  await sql`CREATE INDEX effects_order ON effects (order_id)`.execute(db)
}

const num = (value: unknown): number => Number(value ?? 0)

/** What the drain waits for: every order's effect, no row left pending anywhere. */
export interface DrainProgress {
  readonly orders: number
  /** Orders with no effect whose event is not dead either: something may still deliver them. */
  readonly waiting: number
  readonly outboxPending: number
  readonly inboxPending: number
}

export const drainProgress = async (db: Db): Promise<DrainProgress> => {
  const { rows } = await sql<Record<string, string>>`
    WITH missing AS (
      SELECT o.id FROM orders o
      WHERE o.n > 0 AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.order_id = o.id)
    ), dead_orders AS (
      SELECT (x.payload->>'orderId')::uuid AS id FROM txbox.outbox x
      WHERE x.status = 'dead'
         OR EXISTS (SELECT 1 FROM txbox.inbox i WHERE i.message_id = x.id::text AND i.status = 'dead')
    )
    SELECT
      (SELECT count(*) FROM orders WHERE n > 0) AS orders,
      (SELECT count(*) FROM missing m WHERE m.id NOT IN (SELECT id FROM dead_orders)) AS waiting,
      (SELECT count(*) FROM txbox.outbox WHERE status = 'pending') AS outbox_pending,
      (SELECT count(*) FROM txbox.inbox WHERE status = 'pending') AS inbox_pending`.execute(db)
  const r = rows[0] ?? {}
  return {
    orders: num(r.orders),
    waiting: num(r.waiting),
    outboxPending: num(r.outbox_pending),
    inboxPending: num(r.inbox_pending),
  }
}

export const settled = (p: DrainProgress): boolean =>
  p.waiting === 0 && p.outboxPending === 0 && p.inboxPending === 0

export interface TableCounts {
  /** Committed orders (all of them: rolled-back ones are counted apart and must be 0). */
  readonly orders: number
  /** Outbox rows: one event per committed order. */
  readonly events: number
  readonly sent: number
  readonly effects: number
  /** Committed orders (n > 0) with no effect. */
  readonly lost: number
  /** Committed orders with more than one effect, and the effects beyond the first. */
  readonly duplicated: number
  readonly extraEffects: number
  readonly outboxPending: number
  readonly outboxDead: number
  readonly inboxProcessed: number
  readonly inboxPending: number
  readonly inboxDead: number
  /** Orders and events written by transactions that rolled back on purpose (n < 0): must be 0. */
  readonly rolledBackOrders: number
  readonly rolledBackEvents: number
  /** Events whose order is not in the table, effects of no order, orders without their event. */
  readonly orphanEvents: number
  readonly orphanEffects: number
  readonly ordersWithoutEvent: number
  /**
   * Partition keys whose effects, in the order the handlers committed them, do not follow the
   * numbers enqueue gave their events (commit order): a number handled after a later one, or twice.
   */
  readonly keysOutOfOrder: number
}

export const tableCounts = async (db: Db): Promise<TableCounts> => {
  const { rows } = await sql<Record<string, string>>`
    WITH per_order AS (
      SELECT o.id, count(e.id) AS n FROM orders o LEFT JOIN effects e ON e.order_id = o.id
      WHERE o.n > 0 GROUP BY o.id
    )
    SELECT
      (SELECT count(*) FROM orders WHERE n > 0) AS orders,
      (SELECT count(*) FROM orders WHERE n <= 0) AS rolled_back_orders,
      (SELECT count(*) FROM txbox.outbox) AS events,
      (SELECT count(*) FROM txbox.outbox WHERE status = 'sent') AS sent,
      (SELECT count(*) FROM txbox.outbox WHERE status = 'pending') AS outbox_pending,
      (SELECT count(*) FROM txbox.outbox WHERE status = 'dead') AS outbox_dead,
      (SELECT count(*) FROM txbox.outbox WHERE (payload->>'n')::int <= 0) AS rolled_back_events,
      (SELECT count(*) FROM txbox.outbox x
        WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = (x.payload->>'orderId')::uuid)) AS orphan_events,
      (SELECT count(*) FROM orders o
        WHERE NOT EXISTS (SELECT 1 FROM txbox.outbox x WHERE (x.payload->>'orderId')::uuid = o.id)) AS orders_without_event,
      (SELECT count(*) FROM txbox.inbox WHERE status = 'processed') AS inbox_processed,
      (SELECT count(*) FROM txbox.inbox WHERE status = 'pending') AS inbox_pending,
      (SELECT count(*) FROM txbox.inbox WHERE status = 'dead') AS inbox_dead,
      (SELECT count(*) FROM effects) AS effects,
      (SELECT count(*) FROM effects e WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = e.order_id)) AS orphan_effects,
      (SELECT count(*) FROM per_order WHERE n = 0) AS lost,
      (SELECT count(*) FROM per_order WHERE n > 1) AS duplicated,
      (SELECT coalesce(sum(n - 1), 0) FROM per_order WHERE n > 1) AS extra_effects,
      (SELECT count(DISTINCT key) FROM (
        SELECT x.partition_key AS key, x.partition_seq AS seq,
               lag(x.partition_seq) OVER (PARTITION BY x.partition_key ORDER BY e.id) AS before
        FROM effects e JOIN txbox.outbox x ON x.id::text = e.message_id
        WHERE x.partition_key IS NOT NULL) handled
       WHERE seq <= before) AS keys_out_of_order`.execute(db)
  const r = rows[0] ?? {}
  return {
    orders: num(r.orders),
    events: num(r.events),
    sent: num(r.sent),
    effects: num(r.effects),
    lost: num(r.lost),
    duplicated: num(r.duplicated),
    extraEffects: num(r.extra_effects),
    outboxPending: num(r.outbox_pending),
    outboxDead: num(r.outbox_dead),
    inboxProcessed: num(r.inbox_processed),
    inboxPending: num(r.inbox_pending),
    inboxDead: num(r.inbox_dead),
    rolledBackOrders: num(r.rolled_back_orders),
    rolledBackEvents: num(r.rolled_back_events),
    orphanEvents: num(r.orphan_events),
    orphanEffects: num(r.orphan_effects),
    ordersWithoutEvent: num(r.orders_without_event),
    keysOutOfOrder: num(r.keys_out_of_order),
  }
}

const LIMIT = 50

type Row = Record<string, unknown>

const show = (value: unknown): string => {
  if (value === null || value === undefined) return "-"
  if (value instanceof Date) return value.toISOString()
  if (Array.isArray(value)) return `[${value.map(show).join(", ")}]`
  const text = String(value).replace(/\s+/g, " ")
  return text.length > 300 ? `${text.slice(0, 300)}…` : text
}

const table = (rows: ReadonlyArray<Row>): string[] =>
  rows.map((row) =>
    Object.entries(row)
      .map(([key, value]) => `${key}=${show(value)}`)
      .join("  "),
  )

/**
 * Everything an engineer needs when a count is wrong: which orders were lost or duplicated and
 * where each one stopped (outbox status, inbox row), and every stuck or dead row with its error.
 */
export const diagnostics = async (db: Db, counts: TableCounts): Promise<string[]> => {
  const out: string[] = []
  if (counts.lost > 0) {
    const byStage = await sql<Row>`
      SELECT x.status AS outbox_status, i.status AS inbox_status, count(*) AS orders
      FROM orders o
      LEFT JOIN txbox.outbox x ON (x.payload->>'orderId')::uuid = o.id
      LEFT JOIN txbox.inbox i ON i.message_id = x.id::text
      WHERE o.n > 0 AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.order_id = o.id)
      GROUP BY 1, 2 ORDER BY 3 DESC`.execute(db)
    out.push(`LOST orders (no effect) by where they stopped (outbox status / inbox status):`)
    out.push(...table(byStage.rows).map((l) => `  ${l}`))
    const lost = await sql<Row>`
      SELECT o.id AS order_id, o.n, x.id AS message_id, x.occurred_at, x.status AS outbox_status,
             x.attempts AS outbox_attempts, x.published_at, x.visible_at, x.last_error AS outbox_error,
             i.status AS inbox_status, i.attempts AS inbox_attempts, i.received_at, i.last_error AS inbox_error
      FROM orders o
      LEFT JOIN txbox.outbox x ON (x.payload->>'orderId')::uuid = o.id
      LEFT JOIN txbox.inbox i ON i.message_id = x.id::text
      WHERE o.n > 0 AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.order_id = o.id)
      ORDER BY x.occurred_at NULLS FIRST LIMIT ${LIMIT}`.execute(db)
    out.push(`LOST orders (first ${LIMIT} of ${counts.lost}, oldest first):`)
    out.push(...table(lost.rows).map((l) => `  ${l}`))
  }
  if (counts.duplicated > 0) {
    const dup = await sql<Row>`
      SELECT e.order_id, count(*) AS effects, array_agg(DISTINCT e.message_id) AS message_ids,
             array_agg(e.pid ORDER BY e.applied_at) AS pids, array_agg(e.applied_at ORDER BY e.applied_at) AS applied_at,
             min(i.status) AS inbox_status, min(i.attempts) AS inbox_attempts
      FROM effects e LEFT JOIN txbox.inbox i ON i.message_id = e.message_id
      GROUP BY e.order_id HAVING count(*) > 1
      ORDER BY min(e.applied_at) LIMIT ${LIMIT}`.execute(db)
    out.push(`DUPLICATED orders (first ${LIMIT} of ${counts.duplicated}): effect rows per order`)
    out.push(...table(dup.rows).map((l) => `  ${l}`))
  }
  if (counts.outboxPending > 0 || counts.outboxDead > 0) {
    const rows = await sql<Row>`
      SELECT id, status, attempts, occurred_at, visible_at, lock_token IS NOT NULL AS claimed,
             published_at, last_error
      FROM txbox.outbox WHERE status <> 'sent' ORDER BY status, occurred_at LIMIT ${LIMIT}`.execute(db)
    const errors = await sql<Row>`
      SELECT status, attempts, coalesce(last_error, '-') AS last_error, count(*) AS rows
      FROM txbox.outbox WHERE status <> 'sent' GROUP BY 1, 2, 3 ORDER BY 4 DESC LIMIT 20`.execute(db)
    out.push(`OUTBOX rows not sent, grouped (status, attempts, last_error):`)
    out.push(...table(errors.rows).map((l) => `  ${l}`))
    out.push(`OUTBOX rows not sent (first ${LIMIT}):`)
    out.push(...table(rows.rows).map((l) => `  ${l}`))
  }
  if (counts.inboxPending > 0 || counts.inboxDead > 0) {
    const rows = await sql<Row>`
      SELECT message_id, consumer, status, attempts, received_at, visible_at, lock_token IS NOT NULL AS claimed,
             last_error, left(raw, 200) AS raw
      FROM txbox.inbox WHERE status <> 'processed' ORDER BY status, received_at LIMIT ${LIMIT}`.execute(db)
    out.push(`INBOX rows not processed (first ${LIMIT}):`)
    out.push(...table(rows.rows).map((l) => `  ${l}`))
  }
  if (counts.rolledBackOrders > 0 || counts.rolledBackEvents > 0) {
    const rows = await sql<Row>`
      SELECT 'order' AS what, id::text, n::text AS n FROM orders WHERE n <= 0
      UNION ALL
      SELECT 'event', id::text, payload->>'n' FROM txbox.outbox WHERE (payload->>'n')::int <= 0
      LIMIT ${LIMIT}`.execute(db)
    out.push(`ROWS OF ROLLED-BACK TRANSACTIONS that are visible (first ${LIMIT}):`)
    out.push(...table(rows.rows).map((l) => `  ${l}`))
  }
  if (counts.orphanEvents > 0 || counts.orphanEffects > 0 || counts.ordersWithoutEvent > 0) {
    const rows = await sql<Row>`
      SELECT 'event without order' AS what, x.id::text AS id FROM txbox.outbox x
        WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = (x.payload->>'orderId')::uuid)
      UNION ALL
      SELECT 'effect without order', e.order_id::text FROM effects e
        WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = e.order_id)
      UNION ALL
      SELECT 'order without event', o.id::text FROM orders o
        WHERE NOT EXISTS (SELECT 1 FROM txbox.outbox x WHERE (x.payload->>'orderId')::uuid = o.id)
      LIMIT ${LIMIT}`.execute(db)
    out.push(`ORPHANS (first ${LIMIT}):`)
    out.push(...table(rows.rows).map((l) => `  ${l}`))
  }
  return out
}

/** Connections on the run's database, per driver (application_name) and state. */
export const connections = async (db: Db, database: string): Promise<string[]> => {
  const { rows } = await sql<Row>`
    SELECT coalesce(nullif(application_name, ''), '(none)') AS application, coalesce(state, '-') AS state,
           count(*) AS n
    FROM pg_stat_activity WHERE datname = ${database} AND pid <> pg_backend_pid()
    GROUP BY 1, 2 ORDER BY 1, 2`.execute(db)
  return table(rows)
}

/** Message ids of the first lost orders and of the first duplicated ones, to trace through the logs. */
export const suspectMessageIds = async (
  db: Db,
  limit = 10,
): Promise<{ lost: string[]; duplicated: string[] }> => {
  const lost = await sql<{ id: string }>`
    SELECT x.id::text AS id FROM orders o JOIN txbox.outbox x ON (x.payload->>'orderId')::uuid = o.id
    WHERE o.n > 0 AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.order_id = o.id)
    ORDER BY x.occurred_at LIMIT ${limit}`.execute(db)
  const duplicated = await sql<{ id: string }>`
    SELECT min(message_id) AS id FROM effects GROUP BY order_id HAVING count(*) > 1
    ORDER BY min(applied_at) LIMIT ${limit}`.execute(db)
  return { lost: lost.rows.map((r) => r.id), duplicated: duplicated.rows.map((r) => r.id) }
}
