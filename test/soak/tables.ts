// The soak's verdict, read from the tables alone: business rows, effects, the consumers the soak
// deployed, and txbox's own outbox and inbox. Nothing here asks a process what it did.
import { type Kysely, sql } from "kysely"
import { OrderPaid, OrderPlaced } from "./contract.ts"

// biome-ignore lint/suspicious/noExplicitAny: the soak's own tables next to txbox's
export type Db = Kysely<any>

const PLACED = OrderPlaced.type
const PAID = OrderPaid.type

/**
 * The business tables: orders (written with their events), effects (one row per handler run) and
 * the consumers the soak deploys (what each one is owed is counted from them).
 */
export const createBusinessTables = async (db: Db): Promise<void> => {
  // An order calls for an OrderPlaced, and an OrderPaid too when `paid`. created_at is now(), the
  // start of the producer's transaction: the very time Outbox.enqueue, in that transaction, stamps
  // on the order's events (the enqueue time their successors' headers carry).
  await sql`
    CREATE TABLE orders (
      id         uuid        PRIMARY KEY,
      n          integer     NOT NULL,
      paid       boolean     NOT NULL DEFAULT false,
      created_at timestamptz NOT NULL DEFAULT now()
    )`.execute(db)
  // No unique key on purpose: a handler applied twice must show up as two rows, not as an error.
  await sql`
    CREATE TABLE effects (
      id         bigserial   PRIMARY KEY,
      order_id   uuid        NOT NULL,
      type       text        NOT NULL,
      consumer   text        NOT NULL,
      message_id text        NOT NULL,
      pid        integer     NOT NULL,
      applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
    )`.execute(db)
  await sql`CREATE INDEX effects_order ON effects (order_id)`.execute(db)
  // Written by the orchestrator before any process starts. `types`: the event types its handlers
  // take (its queue's bindings). `joined_late`: started part-way through the load, so an order
  // written before its binding began is not owed to it.
  await sql`
    CREATE TABLE soak_consumers (
      consumer    text    PRIMARY KEY,
      role        text    NOT NULL,
      types       text[]  NOT NULL,
      joined_late boolean NOT NULL DEFAULT false
    )`.execute(db)
  // The verdict reads the outbox and the inbox through these views, not the tables: partitions are
  // dropped during the load (their rows gone, dead ones moved to the archives), and an event's
  // evidence must outlive its row. Every outbox row is copied at insert (in the producer's
  // transaction: a rolled-back one leaves no copy); a row no longer in the outbox nor its archive was
  // in a dropped partition, which holds no pending row: it was sent.
  await sql`CREATE TABLE soak_events (LIKE txbox.outbox)`.execute(db)
  await sql`ALTER TABLE soak_events ADD PRIMARY KEY (id)`.execute(db)
  await sql`
    CREATE FUNCTION soak_capture() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO public.soak_events SELECT NEW.*;
      RETURN NULL;
    END $$`.execute(db)
  await sql`CREATE TRIGGER soak_capture AFTER INSERT ON txbox.outbox FOR EACH ROW EXECUTE FUNCTION soak_capture()`.execute(
    db,
  )
  await sql`
    CREATE VIEW soak_outbox AS
    SELECT e.id, e.type, e.version, e.payload, e.headers, e.routing_key, e.partition_key, e.tenant_id,
           e.occurred_at, e.partition_epoch, e.partition_seq,
           coalesce(x.visible_at, a.visible_at) AS visible_at,
           coalesce(x.attempts, a.attempts, e.attempts) AS attempts,
           coalesce(x.status, a.status, 'sent') AS status,
           coalesce(x.published_at, a.published_at) AS published_at,
           coalesce(x.lock_token, a.lock_token) AS lock_token,
           coalesce(x.last_error, a.last_error) AS last_error
    FROM soak_events e
    LEFT JOIN txbox.outbox x ON x.id = e.id
    LEFT JOIN txbox.outbox_archive a ON a.id = e.id`.execute(db)
  const columns = await sql<{ name: string }>`
    SELECT quote_ident(column_name) AS name FROM information_schema.columns
    WHERE table_schema = 'txbox' AND table_name = 'inbox' ORDER BY ordinal_position`.execute(db)
  const list = columns.rows.map((c) => c.name).join(", ")
  await sql
    .raw(
      `CREATE VIEW soak_inbox AS SELECT ${list} FROM txbox.inbox UNION ALL SELECT ${list} FROM txbox.inbox_archive`,
    )
    .execute(db)
}

export interface SoakConsumer {
  readonly consumer: string
  /** A name for reports and assertions that does not change from run to run. */
  readonly role: string
  readonly types: ReadonlyArray<string>
  readonly joinedLate: boolean
}

export const registerConsumers = async (db: Db, consumers: ReadonlyArray<SoakConsumer>): Promise<void> => {
  await db
    .insertInto("soak_consumers")
    .values(
      consumers.map((c) => ({
        consumer: c.consumer,
        role: c.role,
        types: sql`${[...c.types]}::text[]`,
        joined_late: c.joinedLate,
      })),
    )
    .execute()
}

/**
 * What each consumer is owed: one row per consumer and event of its types a committed order calls
 * for. `required` unless the consumer joined late and the order was written before its binding to
 * the event's type began (`inbox_bindings.bound_at`): such an event may never have reached its
 * queue, so 0 or 1 effects are right (never 2). "After" holds both exactly and in the whole
 * milliseconds a successor's header carries for the event (docs/ordering.md: a consumer waits for a
 * predecessor whose header time is at or after its binding's); an order within the half
 * millisecond where the two disagree counts as before. A late consumer without its binding row is
 * owed everything: a missing row shows up as lost events, never as fewer ones required.
 */
const EXPECTED = sql`
  wanted AS (
    SELECT o.id AS order_id, t.type, o.created_at
    FROM orders o
    CROSS JOIN LATERAL (VALUES (${PLACED}::text, true), (${PAID}::text, o.paid)) AS t(type, due)
    WHERE o.n > 0 AND t.due
  ), expected AS (
    SELECT c.consumer, w.order_id, w.type,
           NOT c.joined_late OR b.bound_at IS NULL
             OR (w.created_at >= b.bound_at
                 AND (extract(epoch FROM w.created_at) * 1000)::bigint >= extract(epoch FROM b.bound_at) * 1000)
             AS required
    FROM soak_consumers c
    JOIN wanted w ON w.type = ANY (c.types)
    LEFT JOIN txbox.inbox_bindings b ON b.consumer = c.consumer AND b.pattern = w.type
  )`

/**
 * Each consumer's effects of the events it is owed, keyed, in the order they were applied: by
 * effects.id, since a key's next event is handled only after its predecessor's transaction
 * committed (a handler run that came earlier got the smaller id).
 */
const HANDLED = sql`
  handled AS (
    SELECT e.id, e.consumer, e.type, e.message_id, e.applied_at, e.pid, x.partition_key AS key,
           x.partition_seq AS seq, w.required
    FROM effects e
    JOIN expected w ON w.consumer = e.consumer AND w.order_id = e.order_id AND w.type = e.type
    JOIN soak_outbox x ON x.id::text = e.message_id
    WHERE x.partition_key IS NOT NULL
  ), inversions AS (
    -- Among the events a consumer is owed (a late consumer's from its binding on), one applied
    -- after a later number of its key, or applied twice.
    SELECT * FROM (
      SELECT h.*, lag(seq) OVER (PARTITION BY consumer, key ORDER BY id) AS before
      FROM handled h WHERE required) r
    WHERE seq <= before
  )`

const num = (value: unknown): number => Number(value ?? 0)

/** What the drain waits for: every owed event's effect, no row left pending anywhere. */
export interface DrainProgress {
  readonly orders: number
  /** Events owed to consumers (one per consumer and event), summed over the consumers. */
  readonly deliveries: number
  /** Owed events with no effect, not dead either (outbox, or that consumer's inbox): something may still deliver them. */
  readonly waiting: number
  readonly outboxPending: number
  readonly inboxPending: number
}

export const drainProgress = async (db: Db): Promise<DrainProgress> => {
  const { rows } = await sql<Record<string, string>>`
    WITH ${EXPECTED}, dead AS (
      SELECT (x.payload->>'orderId')::uuid AS order_id, x.type, NULL::text AS consumer
      FROM soak_outbox x WHERE x.status = 'dead'
      UNION ALL
      SELECT (x.payload->>'orderId')::uuid, x.type, i.consumer
      FROM soak_inbox i JOIN soak_outbox x ON i.message_id = x.id::text WHERE i.status = 'dead'
    )
    SELECT
      (SELECT count(*) FROM orders WHERE n > 0) AS orders,
      (SELECT count(*) FROM expected WHERE required) AS deliveries,
      (SELECT count(*) FROM expected w
        WHERE w.required
          AND NOT EXISTS (SELECT 1 FROM effects e
                          WHERE e.consumer = w.consumer AND e.order_id = w.order_id AND e.type = w.type)
          AND NOT EXISTS (SELECT 1 FROM dead d
                          WHERE d.order_id = w.order_id AND d.type = w.type
                            AND (d.consumer IS NULL OR d.consumer = w.consumer))) AS waiting,
      (SELECT count(*) FROM soak_outbox WHERE status = 'pending') AS outbox_pending,
      (SELECT count(*) FROM soak_inbox WHERE status = 'pending') AS inbox_pending`.execute(db)
  const r = rows[0] ?? {}
  return {
    orders: num(r.orders),
    deliveries: num(r.deliveries),
    waiting: num(r.waiting),
    outboxPending: num(r.outbox_pending),
    inboxPending: num(r.inbox_pending),
  }
}

export const settled = (p: DrainProgress): boolean =>
  p.waiting === 0 && p.outboxPending === 0 && p.inboxPending === 0

/** One consumer's share of the verdict: the events of its types, counted against its own effects. */
export interface ConsumerCounts {
  readonly consumer: string
  readonly role: string
  readonly types: ReadonlyArray<string>
  readonly joinedLate: boolean
  /** When its queue's first binding began (inbox_bindings), ISO; null when none was recorded. */
  readonly boundAt: string | null
  /** Its effect rows, all of them. */
  readonly effects: number
  /** Events of its types it must apply exactly once. */
  readonly required: number
  /** Events of its types written before its binding began (a late consumer's): 0 or 1 effects each. */
  readonly optional: number
  /** Optional events it applied. */
  readonly optionalApplied: number
  /** Required events with no effect. */
  readonly lost: number
  /** Events (required or optional) applied more than once, and the effects beyond the first. */
  readonly duplicated: number
  readonly extraEffects: number
  /** Keys whose required events it applied out of commit order (or one twice). */
  readonly keysOutOfOrder: number
  /**
   * Optional events it applied after a later number of their key: docs/ordering.md's late-consumer
   * race (enqueued before its binding, published after). Counted, not a failure.
   */
  readonly ranLate: number
  readonly inboxPending: number
  readonly inboxDead: number
}

export interface TableCounts {
  /** Committed orders (all of them: rolled-back ones are counted apart and must be 0). */
  readonly orders: number
  /** Outbox rows: an OrderPlaced per committed order, an OrderPaid per paid one. */
  readonly events: number
  readonly sent: number
  readonly effects: number
  /** Events owed to a consumer (required) with no effect of it, summed over the consumers. */
  readonly lost: number
  /** Events a consumer applied more than once, summed over the consumers, and the effects beyond the first. */
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
  /**
   * Events no order calls for (its order is not in the table, or an OrderPaid of an order not
   * paid); effects no consumer is owed (no such order, or a type the consumer does not handle);
   * orders missing one of their events.
   */
  readonly orphanEvents: number
  readonly orphanEffects: number
  readonly ordersWithoutEvent: number
  /**
   * Partition keys, per consumer (summed), whose effects, in the order the handlers committed
   * them, do not follow the numbers enqueue gave their events (commit order): a number handled
   * after a later one, or twice. Over the types each consumer handles; a late consumer's from its
   * binding on.
   */
  readonly keysOutOfOrder: number
  /** Partition keys whose events are of both types: the key sequences interleave them. */
  readonly mixedKeys: number
  readonly consumers: ReadonlyArray<ConsumerCounts>
}

export const tableCounts = async (db: Db): Promise<TableCounts> => {
  const { rows } = await sql<Record<string, string>>`
    WITH ${EXPECTED}
    SELECT
      (SELECT count(*) FROM orders WHERE n > 0) AS orders,
      (SELECT count(*) FROM orders WHERE n <= 0) AS rolled_back_orders,
      (SELECT count(*) FROM soak_outbox) AS events,
      (SELECT count(*) FROM soak_outbox WHERE status = 'sent') AS sent,
      (SELECT count(*) FROM soak_outbox WHERE status = 'pending') AS outbox_pending,
      (SELECT count(*) FROM soak_outbox WHERE status = 'dead') AS outbox_dead,
      (SELECT count(*) FROM soak_outbox WHERE (payload->>'n')::int <= 0) AS rolled_back_events,
      (SELECT count(*) FROM soak_outbox x
        WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = (x.payload->>'orderId')::uuid
                            AND (x.type = ${PLACED} OR (x.type = ${PAID} AND o.paid)))) AS orphan_events,
      (SELECT count(*) FROM orders o
        WHERE NOT EXISTS (SELECT 1 FROM soak_outbox x
                          WHERE (x.payload->>'orderId')::uuid = o.id AND x.type = ${PLACED})
           OR (o.paid AND NOT EXISTS (SELECT 1 FROM soak_outbox x
                                      WHERE (x.payload->>'orderId')::uuid = o.id AND x.type = ${PAID})))
        AS orders_without_event,
      (SELECT count(*) FROM soak_inbox WHERE status = 'processed') AS inbox_processed,
      (SELECT count(*) FROM soak_inbox WHERE status = 'pending') AS inbox_pending,
      (SELECT count(*) FROM soak_inbox WHERE status = 'dead') AS inbox_dead,
      (SELECT count(*) FROM effects) AS effects,
      (SELECT count(*) FROM effects e
        WHERE NOT EXISTS (SELECT 1 FROM expected w
                          WHERE w.consumer = e.consumer AND w.order_id = e.order_id AND w.type = e.type))
        AS orphan_effects,
      (SELECT count(*) FROM (
        SELECT partition_key FROM soak_outbox WHERE partition_key IS NOT NULL
        GROUP BY partition_key HAVING count(DISTINCT type) > 1) k) AS mixed_keys`.execute(db)
  const r = rows[0] ?? {}
  const perConsumer = await sql<Record<string, unknown>>`
    WITH ${EXPECTED}, ${HANDLED},
    applied AS (SELECT consumer, order_id, type, count(*) AS n FROM effects GROUP BY 1, 2, 3),
    owed AS (
      SELECT w.consumer,
             count(*) FILTER (WHERE w.required) AS required,
             count(*) FILTER (WHERE NOT w.required) AS optional,
             count(*) FILTER (WHERE NOT w.required AND a.n IS NOT NULL) AS optional_applied,
             count(*) FILTER (WHERE w.required AND a.n IS NULL) AS lost,
             count(*) FILTER (WHERE a.n > 1) AS duplicated,
             coalesce(sum(a.n - 1) FILTER (WHERE a.n > 1), 0) AS extra_effects
      FROM expected w LEFT JOIN applied a USING (consumer, order_id, type)
      GROUP BY w.consumer
    ), out_of_order AS (
      SELECT consumer, count(DISTINCT key) AS keys FROM inversions GROUP BY consumer
    ), ran_late AS (
      SELECT consumer, count(*) AS n FROM (
        SELECT consumer, required, seq,
               max(seq) OVER (PARTITION BY consumer, key ORDER BY id
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS highest_before
        FROM handled) h
      WHERE NOT required AND seq < highest_before GROUP BY consumer
    ), inbox AS (
      SELECT consumer, count(*) FILTER (WHERE status = 'pending') AS pending,
             count(*) FILTER (WHERE status = 'dead') AS dead
      FROM soak_inbox GROUP BY consumer
    )
    SELECT c.consumer, c.role, c.types, c.joined_late,
           (SELECT min(b.bound_at) FROM txbox.inbox_bindings b WHERE b.consumer = c.consumer) AS bound_at,
           (SELECT count(*) FROM effects e WHERE e.consumer = c.consumer) AS effects,
           o.required, o.optional, o.optional_applied, o.lost, o.duplicated, o.extra_effects,
           k.keys AS keys_out_of_order, l.n AS ran_late, i.pending AS inbox_pending, i.dead AS inbox_dead
    FROM soak_consumers c
    LEFT JOIN owed o USING (consumer)
    LEFT JOIN out_of_order k USING (consumer)
    LEFT JOIN ran_late l USING (consumer)
    LEFT JOIN inbox i USING (consumer)
    ORDER BY c.joined_late, c.consumer`.execute(db)
  const consumers = perConsumer.rows.map(
    (c): ConsumerCounts => ({
      consumer: String(c.consumer),
      role: String(c.role),
      types: c.types as string[],
      joinedLate: c.joined_late === true,
      boundAt:
        c.bound_at instanceof Date
          ? c.bound_at.toISOString()
          : c.bound_at == null
            ? null
            : String(c.bound_at),
      effects: num(c.effects),
      required: num(c.required),
      optional: num(c.optional),
      optionalApplied: num(c.optional_applied),
      lost: num(c.lost),
      duplicated: num(c.duplicated),
      extraEffects: num(c.extra_effects),
      keysOutOfOrder: num(c.keys_out_of_order),
      ranLate: num(c.ran_late),
      inboxPending: num(c.inbox_pending),
      inboxDead: num(c.inbox_dead),
    }),
  )
  const sum = (f: (c: ConsumerCounts) => number) => consumers.reduce((total, c) => total + f(c), 0)
  return {
    orders: num(r.orders),
    events: num(r.events),
    sent: num(r.sent),
    effects: num(r.effects),
    lost: sum((c) => c.lost),
    duplicated: sum((c) => c.duplicated),
    extraEffects: sum((c) => c.extraEffects),
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
    keysOutOfOrder: sum((c) => c.keysOutOfOrder),
    mixedKeys: num(r.mixed_keys),
    consumers,
  }
}

const LIMIT = 50

type Row = Record<string, unknown>

const show = (value: unknown): string => {
  if (value === null || value === undefined) return "-"
  // An invalid Date (PostgreSQL's `infinity`, say) has no ISO form: toISOString would throw.
  if (value instanceof Date) return Number.isNaN(value.getTime()) ? String(value) : value.toISOString()
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

/** An owed event with no effect of its consumer, with its outbox row and that consumer's inbox row. */
const LOST = sql`
  lost AS (
    SELECT w.consumer, w.type, o.id AS order_id, o.n, o.created_at, x.id AS message_id, x.occurred_at,
           x.status AS outbox_status, x.attempts AS outbox_attempts, x.published_at, x.visible_at,
           x.last_error AS outbox_error, x.partition_key, x.partition_seq, i.status AS inbox_status,
           i.attempts AS inbox_attempts, i.received_at, i.partition_after, i.last_error AS inbox_error
    FROM expected w
    JOIN orders o ON o.id = w.order_id
    LEFT JOIN soak_outbox x ON (x.payload->>'orderId')::uuid = w.order_id AND x.type = w.type
    LEFT JOIN soak_inbox i ON i.message_id = x.id::text AND i.consumer = w.consumer
    WHERE w.required
      AND NOT EXISTS (SELECT 1 FROM effects e
                      WHERE e.consumer = w.consumer AND e.order_id = w.order_id AND e.type = w.type)
  )`

/**
 * Everything an engineer needs when a count is wrong: which events each consumer lost or applied
 * twice and where each one stopped (outbox status, its inbox row), the keys it applied out of
 * order and how, and every stuck or dead row with its error.
 */
export const diagnostics = async (db: Db, counts: TableCounts): Promise<string[]> => {
  const out: string[] = []
  if (counts.lost > 0) {
    const byStage = await sql<Row>`
      WITH ${EXPECTED}, ${LOST}
      SELECT consumer, type, outbox_status, inbox_status, count(*) AS events
      FROM lost GROUP BY 1, 2, 3, 4 ORDER BY 5 DESC`.execute(db)
    out.push(`LOST events (no effect of a consumer they are owed to) by where they stopped:`)
    out.push(...table(byStage.rows).map((l) => `  ${l}`))
    const lost = await sql<Row>`
      WITH ${EXPECTED}, ${LOST}
      SELECT * FROM lost ORDER BY occurred_at NULLS FIRST LIMIT ${LIMIT}`.execute(db)
    out.push(`LOST events (first ${LIMIT} of ${counts.lost}, oldest first):`)
    out.push(...table(lost.rows).map((l) => `  ${l}`))
  }
  if (counts.duplicated > 0) {
    const dup = await sql<Row>`
      SELECT e.consumer, e.type, e.order_id, count(*) AS effects, array_agg(DISTINCT e.message_id) AS message_ids,
             array_agg(e.pid ORDER BY e.applied_at) AS pids, array_agg(e.applied_at ORDER BY e.applied_at) AS applied_at,
             min(i.status) AS inbox_status, min(i.attempts) AS inbox_attempts
      FROM effects e LEFT JOIN soak_inbox i ON i.message_id = e.message_id AND i.consumer = e.consumer
      GROUP BY e.consumer, e.type, e.order_id HAVING count(*) > 1
      ORDER BY min(e.applied_at) LIMIT ${LIMIT}`.execute(db)
    out.push(`DUPLICATED events (first ${LIMIT} of ${counts.duplicated}): effect rows per consumer and event`)
    out.push(...table(dup.rows).map((l) => `  ${l}`))
  }
  if (counts.keysOutOfOrder > 0) {
    const keys = await sql<Row>`
      WITH ${EXPECTED}, ${HANDLED}, flagged AS (
        SELECT DISTINCT consumer, key FROM inversions ORDER BY 1, 2 LIMIT 10
      )
      SELECT h.consumer, h.key,
             string_agg(h.seq || CASE WHEN h.type = ${PAID} THEN 'p' ELSE '' END
                          || CASE WHEN h.required THEN '' ELSE '?' END, ' ' ORDER BY h.id) AS applied
      FROM handled h JOIN flagged f USING (consumer, key) GROUP BY 1, 2 ORDER BY 1, 2`.execute(db)
    out.push(
      "KEYS OUT OF ORDER (first 10): numbers as each consumer applied them (p: OrderPaid, ?: enqueued before its binding)",
    )
    out.push(...table(keys.rows).map((l) => `  ${l}`))
    const rows = await sql<Row>`
      WITH ${EXPECTED}, ${HANDLED}
      SELECT v.consumer, v.key, v.seq, v.before, v.type, v.message_id, v.applied_at, v.pid,
             i.partition_after, i.partition_after_at, i.attempts AS inbox_attempts, i.received_at,
             o.created_at AS enqueued_at, x.headers->>'txbox-partition-routes' AS routes,
             (SELECT min(b.bound_at) FROM txbox.inbox_bindings b WHERE b.consumer = v.consumer) AS bound_at
      FROM inversions v
      JOIN soak_outbox x ON x.id::text = v.message_id
      JOIN orders o ON o.id = (x.payload->>'orderId')::uuid
      LEFT JOIN soak_inbox i ON i.message_id = v.message_id AND i.consumer = v.consumer
      ORDER BY v.id LIMIT ${LIMIT}`.execute(db)
    out.push(`  each event applied after a later number of its key (first ${LIMIT}):`)
    out.push(...table(rows.rows).map((l) => `    ${l}`))
    // How it came to pass: the consumer's inbox rows of the key from the number before the one
    // applied late to the last applied before it, with their effects (which process, when).
    const around = await sql<Row>`
      WITH ${EXPECTED}, ${HANDLED}, first AS (
        SELECT DISTINCT ON (consumer, key) consumer, key, seq, before FROM inversions
        ORDER BY consumer, key, id LIMIT 5
      )
      SELECT f.consumer, f.key, i.partition_seq AS seq, i.type, i.message_id, i.status, i.attempts,
             i.partition_after, i.received_at, i.processed_at, i.visible_at, i.last_error,
             e.id AS effect_id, e.pid, e.applied_at
      FROM first f
      JOIN soak_inbox i ON i.consumer = f.consumer AND i.partition_key = f.key
                        AND i.partition_seq BETWEEN f.seq - 1 AND f.before
      LEFT JOIN effects e ON e.consumer = i.consumer AND e.message_id = i.message_id
      ORDER BY f.consumer, f.key, i.partition_seq, e.id`.execute(db)
    out.push("  the inbox rows around each (first 5 keys), by number, with their effects:")
    out.push(...table(around.rows).map((l) => `    ${l}`))
  }
  if (counts.outboxPending > 0 || counts.outboxDead > 0) {
    const rows = await sql<Row>`
      SELECT id, type, status, attempts, occurred_at, visible_at, lock_token IS NOT NULL AS claimed,
             published_at, last_error
      FROM soak_outbox WHERE status <> 'sent' ORDER BY status, occurred_at LIMIT ${LIMIT}`.execute(db)
    const errors = await sql<Row>`
      SELECT status, attempts, coalesce(last_error, '-') AS last_error, count(*) AS rows
      FROM soak_outbox WHERE status <> 'sent' GROUP BY 1, 2, 3 ORDER BY 4 DESC LIMIT 20`.execute(db)
    out.push(`OUTBOX rows not sent, grouped (status, attempts, last_error):`)
    out.push(...table(errors.rows).map((l) => `  ${l}`))
    out.push(`OUTBOX rows not sent (first ${LIMIT}):`)
    out.push(...table(rows.rows).map((l) => `  ${l}`))
  }
  if (counts.inboxPending > 0 || counts.inboxDead > 0) {
    const rows = await sql<Row>`
      SELECT message_id, consumer, type, status, attempts, received_at, visible_at, lock_token IS NOT NULL AS claimed,
             partition_key, partition_seq, partition_after, partition_after_at, last_error, left(raw, 200) AS raw
      FROM soak_inbox WHERE status <> 'processed' ORDER BY status, received_at LIMIT ${LIMIT}`.execute(db)
    out.push(`INBOX rows not processed (first ${LIMIT}):`)
    out.push(...table(rows.rows).map((l) => `  ${l}`))
  }
  if (counts.rolledBackOrders > 0 || counts.rolledBackEvents > 0) {
    const rows = await sql<Row>`
      SELECT 'order' AS what, id::text, n::text AS n FROM orders WHERE n <= 0
      UNION ALL
      SELECT 'event', id::text, payload->>'n' FROM soak_outbox WHERE (payload->>'n')::int <= 0
      LIMIT ${LIMIT}`.execute(db)
    out.push(`ROWS OF ROLLED-BACK TRANSACTIONS that are visible (first ${LIMIT}):`)
    out.push(...table(rows.rows).map((l) => `  ${l}`))
  }
  if (counts.orphanEvents > 0 || counts.orphanEffects > 0 || counts.ordersWithoutEvent > 0) {
    const rows = await sql<Row>`
      WITH ${EXPECTED}
      SELECT 'event no order calls for' AS what, x.id::text AS id, x.type FROM soak_outbox x
        WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = (x.payload->>'orderId')::uuid
                            AND (x.type = ${PLACED} OR (x.type = ${PAID} AND o.paid)))
      UNION ALL
      SELECT 'effect owed to no consumer (' || e.consumer || ')', e.order_id::text, e.type FROM effects e
        WHERE NOT EXISTS (SELECT 1 FROM expected w
                          WHERE w.consumer = e.consumer AND w.order_id = e.order_id AND w.type = e.type)
      UNION ALL
      SELECT 'order without its event', o.id::text, t.type FROM orders o
        CROSS JOIN LATERAL (VALUES (${PLACED}::text, true), (${PAID}::text, o.paid)) AS t(type, due)
        WHERE t.due AND NOT EXISTS (SELECT 1 FROM soak_outbox x
                                    WHERE (x.payload->>'orderId')::uuid = o.id AND x.type = t.type)
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

/** Message ids of the first lost events and of the first duplicated ones, to trace through the logs. */
export const suspectMessageIds = async (
  db: Db,
  limit = 10,
): Promise<{ lost: string[]; duplicated: string[] }> => {
  const lost = await sql<{ id: string }>`
    WITH ${EXPECTED}, ${LOST}
    SELECT message_id::text AS id FROM lost WHERE message_id IS NOT NULL
    GROUP BY message_id ORDER BY min(occurred_at) LIMIT ${limit}`.execute(db)
  const duplicated = await sql<{ id: string }>`
    SELECT min(message_id) AS id FROM effects GROUP BY consumer, type, order_id HAVING count(*) > 1
    ORDER BY min(applied_at) LIMIT ${limit}`.execute(db)
  return { lost: lost.rows.map((r) => r.id), duplicated: duplicated.rows.map((r) => r.id) }
}
