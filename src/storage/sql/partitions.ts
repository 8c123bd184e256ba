/**
 * The outbox's and the inbox's partitions (migration 0015): listed, created
 * ahead of time, and dropped whole once nothing in them is still work or
 * evidence. Behind `txbox partitions` and the relay's and the inbox's
 * housekeeping.
 *
 * Locks, because these run beside the hot path:
 * - create: `CREATE TABLE … (LIKE …)` then `ATTACH PARTITION`, which takes
 *   SHARE UPDATE EXCLUSIVE on the parent (enqueues, claims and marks go on)
 *   and ACCESS EXCLUSIVE on the DEFAULT partition while it checks that no row
 *   there belongs in the new range: a scan of the default partition, during
 *   which statements that read it (every claim) wait. Keep it small.
 * - drop: ACCESS EXCLUSIVE on the parent for the few index probes that prove
 *   the partition holds no pending row, the archiving of its dead rows, and
 *   the DROP. Both wait at most LOCK_WAIT for their locks and then give up, to
 *   try again at the next pass: a lock request that waits makes every later
 *   request on the table queue behind it, so a long wait would stall every
 *   claim (or, for a drop, every enqueue) for as long.
 */
import { Effect } from "effect"
import { type Kysely, sql } from "kysely"
import { quoteIdent } from "../../core/identifier.ts"
import type { StoreError } from "../../Errors.ts"
import type { DatabaseShape } from "../../ports/Database.ts"
import { classifyDbError } from "./errors.ts"
import { boundTime, idBound, missingRanges, parseRange, partitionName } from "./partitionBounds.ts"

/** The two tables txbox partitions. */
export type QueueTable = "outbox" | "inbox"
export const QUEUE_TABLES: ReadonlyArray<QueueTable> = ["outbox", "inbox"]

/** One partition of the outbox or the inbox. */
export interface QueuePartition {
  readonly table: QueueTable
  readonly name: string
  /** The DEFAULT partition: rows whose id falls in no range. Never dropped. */
  readonly isDefault: boolean
  /** The first id of its range, and the time it stands for (undefined when the bound is not a UUIDv7 time). */
  readonly from?: { readonly id: string; readonly at: Date | undefined }
  /** The end of its range (exclusive). */
  readonly to?: { readonly id: string; readonly at: Date | undefined }
  /** The planner's estimate of its rows; undefined before it was ever analyzed. */
  readonly estimatedRows: number | undefined
}

// biome-ignore lint/suspicious/noExplicitAny: the catalog and partitions are outside TxboxDatabase
type AnyDb = Kysely<any>

/** What these need of a database: its Kysely and txbox's schema in it. */
export type Tables = Pick<DatabaseShape, "db" | "schema">

const query = <A>(operation: string, f: () => Promise<A>): Effect.Effect<A, StoreError> =>
  Effect.tryPromise({ try: f, catch: (cause) => classifyDbError(operation, cause) }).pipe(
    Effect.withSpan(`txbox.${operation}`),
  )

/**
 * The autovacuum settings of every partition txbox makes (bench/vacuum.ts). PostgreSQL's defaults
 * vacuum a table once a fifth of its rows are dead: a day partition of a busy outbox holds
 * millions of sent rows by the afternoon, and each message leaves one dead row version (pending,
 * then sent), so vacuum waits for ever more of them while the heap and `outbox_due` grow instead
 * of reusing their space. A fixed number instead: vacuum after 10,000 dead rows whatever the size
 * (and after 100,000 inserts, the inbox's insert-only rows: the visibility map kept current).
 */
export const QUEUE_PARTITION_SETTINGS: Readonly<Record<string, number>> = {
  autovacuum_vacuum_scale_factor: 0,
  autovacuum_vacuum_threshold: 10_000,
  autovacuum_vacuum_insert_scale_factor: 0,
  autovacuum_vacuum_insert_threshold: 100_000,
}
const withSettings = Object.entries(QUEUE_PARTITION_SETTINGS)
  .map(([name, value]) => `${name} = ${value}`)
  .join(", ")

const LOCK_NAMESPACE = 0x7478626f // "txbo", as the migrator's
/** A partition is made only if it begins at least this far ahead: no row of its range exists yet. */
const LEAD_MS = 10_000
/** The longest a create or a drop waits for its lock: what it may stall the statements queued behind it. */
const LOCK_WAIT = "250ms"
/** How many times a creator asks for the lock another creator holds, BUSY_WAIT_MS apart. */
const BUSY_TRIES = 20
const BUSY_WAIT_MS = 50
const KEY_COLUMN: Record<QueueTable, string> = { outbox: "id", inbox: "message_id" }
const KEY_TYPE: Record<QueueTable, string> = { outbox: "uuid", inbox: "text" }

const qualified = (schema: string, name: string) => `${quoteIdent(schema)}.${quoteIdent(name)}`

const asDate = (id: string) => {
  const ms = boundTime(id)
  return { id, at: ms === undefined ? undefined : new Date(ms) }
}

const partitionsOf = async (db: AnyDb, schema: string, table: QueueTable): Promise<QueuePartition[]> => {
  // sql: the catalog (pg_inherits, pg_class), not one of txbox's tables.
  const result = await sql<{ name: string; bound: string; rows: number | string | null }>`
    SELECT c.relname AS name, pg_get_expr(c.relpartbound, c.oid) AS bound, c.reltuples AS rows
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    JOIN pg_class p ON p.oid = i.inhparent
    JOIN pg_namespace n ON n.oid = p.relnamespace
    WHERE n.nspname = ${schema} AND p.relname = ${table}
    ORDER BY c.relname`.execute(db)
  return result.rows.map((r) => {
    const range = parseRange(r.bound)
    const rows = Number(r.rows ?? -1)
    return {
      table,
      name: r.name,
      isDefault: range === undefined,
      ...(range === undefined ? {} : { from: asDate(range.from), to: asDate(range.to) }),
      estimatedRows: rows >= 0 ? rows : undefined,
    }
  })
}

/** Whether `table` is partitioned (migration 0015 applied). */
const isPartitioned = async (db: AnyDb, schema: string, table: QueueTable): Promise<boolean> => {
  // sql: the catalog.
  const result = await sql<{ n: number }>`
    SELECT 1 AS n FROM pg_partitioned_table pt
    JOIN pg_class c ON c.oid = pt.partrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = ${schema} AND c.relname = ${table}`.execute(db)
  return result.rows.length > 0
}

const dbNowMs = async (db: AnyDb): Promise<number> => {
  const result = await sql<{ ms: number | string }>`SELECT extract(epoch FROM now()) * 1000 AS ms`.execute(db)
  return Number(result.rows[0]!.ms)
}

/** Every partition of the outbox and the inbox, by table then name; empty for a table not partitioned. */
export const listPartitions = (db: Tables): Effect.Effect<ReadonlyArray<QueuePartition>, StoreError> =>
  Effect.map(
    Effect.forEach(QUEUE_TABLES, (table) =>
      query("partitions.list", () => partitionsOf(db.db as AnyDb, db.schema, table)),
    ),
    (lists) => lists.flat(),
  )

/** What `ensurePartitions` did. */
export interface EnsureResult {
  /** Partitions created now. */
  readonly created: ReadonlyArray<{ readonly table: QueueTable; readonly name: string }>
  /** Ranges left to the default partition, and why (rows of that range are already there). */
  readonly skipped: ReadonlyArray<{
    readonly table: QueueTable
    readonly name: string
    readonly reason: string
  }>
  /** Tables left alone: not partitioned (a schema before migration 0015). */
  readonly notPartitioned: ReadonlyArray<QueueTable>
}

/** The time ranges of `table`'s partitions that have them (not the default, not hand-made bounds). */
const spansOf = (partitions: ReadonlyArray<QueuePartition>) =>
  partitions.flatMap((p) => {
    const fromMs = p.from?.at?.getTime()
    const toMs = p.to?.at?.getTime()
    return fromMs === undefined || toMs === undefined ? [] : [{ fromMs, toMs }]
  })

/**
 * Makes partition `name` of `table` for `[fromMs, toMs)` in one transaction,
 * unless it exists or rows of that range are already in the default
 * partition. The default partition is locked first (ATTACH needs that lock
 * anyway): no row can land in it between the check and the ATTACH.
 */
const createPartition = (
  db: Tables,
  table: QueueTable,
  name: string,
  range: { readonly fromMs: number; readonly toMs: number },
) =>
  query("partitions.ensure", () =>
    (db.db as AnyDb).transaction().execute(async (trx) => {
      await sql.raw(`SET LOCAL lock_timeout = '${LOCK_WAIT}'`).execute(trx)
      // One creator at a time per schema; another one at work now leaves this pass to it.
      const mine = await sql<{ mine: boolean }>`
        SELECT pg_try_advisory_xact_lock(${LOCK_NAMESPACE}, hashtext(${`${db.schema}.partitions`})) AS mine`.execute(
        trx,
      )
      if (mine.rows[0]?.mine !== true) return "busy" as const
      const now = await partitionsOf(trx, db.schema, table)
      if (now.some((p) => p.name === name)) return "exists" as const
      const from = idBound(range.fromMs)
      const to = idBound(range.toMs)
      const fallback = now.find((p) => p.isDefault)
      if (fallback !== undefined) {
        const defaultTable = qualified(db.schema, fallback.name)
        await sql.raw(`LOCK TABLE ${defaultTable} IN ACCESS EXCLUSIVE MODE`).execute(trx)
        const key = KEY_COLUMN[table]
        const type = KEY_TYPE[table]
        // sql: ONLY and a partition's name are outside Kysely's typed tables. The key's index answers.
        const taken = await sql`SELECT 1 FROM ONLY ${sql.raw(defaultTable)}
          WHERE ${sql.ref(key)} >= ${from}::${sql.raw(type)} AND ${sql.ref(key)} < ${to}::${sql.raw(type)}
          LIMIT 1`.execute(trx)
        if (taken.rows.length > 0) return "taken" as const
      }
      // sql: DDL. LIKE then ATTACH, not PARTITION OF, which would lock the parent ACCESS EXCLUSIVE.
      await sql
        .raw(
          `CREATE TABLE ${qualified(db.schema, name)} ` +
            `(LIKE ${qualified(db.schema, table)} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) ` +
            `WITH (${withSettings})`,
        )
        .execute(trx)
      await sql
        .raw(
          `ALTER TABLE ${qualified(db.schema, table)} ATTACH PARTITION ${qualified(db.schema, name)} ` +
            `FOR VALUES FROM ('${from}') TO ('${to}')`,
        )
        .execute(trx)
      return "created" as const
    }),
  )

/**
 * Creates the partitions that cover the database's `now()` to `now() + ahead`,
 * each `every` long (aligned to it, in UTC), that do not exist yet and begin
 * more than LEAD_MS from now (unless `includeCurrent`): rows of the current
 * day stay where they go today, the default partition when its partition is
 * missing. A range
 * some of whose rows already sit in the default partition (no partition
 * existed when they were written) is skipped: those rows stay where they
 * are, and so does the rest of that range, so that every copy of a message
 * keeps landing in one partition. Several processes may run it at once.
 * Each statement is a step of its own: interrupted (a relay shutting down),
 * it starts nothing more on the pool.
 */
export const ensurePartitions = (
  db: Tables,
  options: {
    readonly aheadMs: number
    readonly everyMs: number
    readonly tables?: ReadonlyArray<QueueTable>
    /**
     * Also the partition that holds now, when it is missing: only while nothing writes to the
     * table (a new install, a test). @default false: from the next one on
     */
    readonly includeCurrent?: boolean
  },
): Effect.Effect<EnsureResult, StoreError> =>
  Effect.gen(function* () {
    const created: Array<{ table: QueueTable; name: string }> = []
    const skipped: Array<{ table: QueueTable; name: string; reason: string }> = []
    const notPartitioned: QueueTable[] = []
    const base = db.db as AnyDb
    for (const table of options.tables ?? QUEUE_TABLES) {
      if (!(yield* query("partitions.ensure", () => isPartitioned(base, db.schema, table)))) {
        notPartitioned.push(table)
        continue
      }
      const nowMs = yield* query("partitions.ensure", () => dbNowMs(base))
      const existing = yield* query("partitions.ensure", () => partitionsOf(base, db.schema, table))
      const ranges = missingRanges(nowMs, options.aheadMs, options.everyMs, spansOf(existing)).filter(
        // A range that has begun (or begins before the ATTACH is surely done) may be written to now: an
        // INSERT routed to the default partition before the ATTACH and run after it would fail.
        (r) => options.includeCurrent === true || r.fromMs > nowMs + LEAD_MS,
      )
      for (const range of ranges) {
        const name = partitionName(table, range.fromMs, options.everyMs)
        let outcome = yield* createPartition(db, table, name, range)
        // Another creator (the relay's pass beside an inbox's) holds the lock for a few statements:
        // wait for it rather than leave the range to the next hourly pass.
        for (let tries = 1; outcome === "busy" && tries < BUSY_TRIES; tries++) {
          yield* Effect.sleep(BUSY_WAIT_MS)
          outcome = yield* createPartition(db, table, name, range)
        }
        if (outcome === "created") created.push({ table, name })
        else if (outcome === "taken")
          skipped.push({ table, name, reason: "rows of this range are already in the default partition" })
      }
    }
    return { created, skipped, notPartitioned }
  })

/** What `dropPartitions` decided for one partition old enough to be considered. */
export interface DropDecision {
  readonly table: QueueTable
  readonly name: string
  readonly to: Date
  /** Dropped now (or, with `dryRun`, would be). */
  readonly dropped: boolean
  /** Dead rows moved to `<table>_archive` before the drop (or, with `dryRun`, that would be). */
  readonly archived: number
  /** Why it stays, when it stays. */
  readonly reason?: string
}

/** How old a partition must be to go. */
export interface DropOptions {
  /** A partition goes once its range ended this long ago (and it holds nothing still to do). */
  readonly olderThanMs: number
  /**
   * The inbox's dedupe window: an inbox partition goes only once its range
   * ended at least this long ago, and its last processed row was processed
   * at least this long ago (a message whose id is not a UUIDv7 can land in a
   * day's range whatever its time). Must cover the broker's longest
   * redelivery: a copy that arrives after its partition went is applied again.
   */
  readonly dedupeWindowMs: number
  readonly tables?: ReadonlyArray<QueueTable>
  /** Decide, drop nothing. */
  readonly dryRun?: boolean
}

/**
 * Drops the partitions whose range ended more than `olderThan` ago (the inbox's:
 * more than the larger of it and the dedupe window) and that hold no pending
 * row, after moving their dead rows to `<table>_archive` (migration 0016);
 * reports the others that are old enough and why they stay. The default
 * partition is never dropped. Each drop takes the parent's lock (ACCESS
 * EXCLUSIVE, waiting at most LOCK_WAIT for it), checks again under it, archives and
 * drops in one transaction, so a row that arrived meanwhile is never lost.
 */
export const dropPartitions = (
  db: Tables,
  options: DropOptions,
): Effect.Effect<ReadonlyArray<DropDecision>, StoreError> =>
  Effect.gen(function* () {
    const base = db.db as AnyDb
    const decisions: DropDecision[] = []
    for (const table of options.tables ?? QUEUE_TABLES) {
      if (!(yield* query("partitions.drop", () => isPartitioned(base, db.schema, table)))) continue
      const nowMs = yield* query("partitions.drop", () => dbNowMs(base))
      const keepMs =
        table === "inbox" ? Math.max(options.olderThanMs, options.dedupeWindowMs) : options.olderThanMs
      for (const p of yield* query("partitions.drop", () => partitionsOf(base, db.schema, table))) {
        const toMs = p.to?.at?.getTime()
        if (p.isDefault || toMs === undefined || toMs > nowMs - keepMs) continue
        const outcome = yield* query("partitions.drop", () =>
          dropOne(base, db.schema, table, p.name, options),
        )
        decisions.push({
          table,
          name: p.name,
          to: new Date(toMs),
          dropped: outcome.why === undefined,
          archived: outcome.archived,
          ...(outcome.why === undefined ? {} : { reason: outcome.why }),
        })
      }
    }
    return decisions
  })

/** One partition's drop, in one transaction: the parent locked, checked again, dead rows archived, dropped. */
const dropOne = (base: AnyDb, schema: string, table: QueueTable, name: string, options: DropOptions) =>
  base.transaction().execute(async (trx) => {
    await sql.raw(`SET LOCAL lock_timeout = '${LOCK_WAIT}'`).execute(trx)
    if (!options.dryRun)
      await sql.raw(`LOCK TABLE ${qualified(schema, table)} IN ACCESS EXCLUSIVE MODE`).execute(trx)
    const why = await whyKept(trx, schema, table, name, options.dedupeWindowMs)
    if (why !== undefined) return { why, archived: 0 }
    const archived = await archiveDead(trx, schema, table, name, options.dryRun === true)
    if (!options.dryRun) await sql.raw(`DROP TABLE ${qualified(schema, name)}`).execute(trx)
    return { why, archived }
  })

/** Why partition `name` must stay; undefined when it may go. Each probe is answered by a partial index. */
const whyKept = async (
  db: AnyDb,
  schema: string,
  table: QueueTable,
  name: string,
  dedupeWindowMs: number,
): Promise<string | undefined> => {
  const partition = sql.raw(`ONLY ${qualified(schema, name)}`)
  // sql: a partition by name (ONLY), outside Kysely's typed tables.
  const pending = await sql`SELECT 1 FROM ${partition} WHERE status = 'pending' LIMIT 1`.execute(db)
  if (pending.rows.length > 0) return "holds pending rows"
  if (table === "inbox") {
    // The key of a dead ordered message waits on it (a redrive or a skip, which need the row here).
    const ordered = await sql`SELECT 1 FROM ${partition}
      WHERE status = 'dead' AND partition_seq IS NOT NULL LIMIT 1`.execute(db)
    if (ordered.rows.length > 0) return "holds dead ordered messages (redrive or skip them first: txbox dead)"
    const recent = await sql`SELECT 1 FROM ${partition} WHERE status = 'processed'
      AND processed_at > now() - ${dedupeWindowMs}::float8 * interval '1 millisecond' LIMIT 1`.execute(db)
    if (recent.rows.length > 0) return "holds rows processed inside the dedupe window"
  }
  return undefined
}

/** The columns of txbox's `table`, quoted, in order: what an archive row copies. */
export const columnsOf = async (db: AnyDb, schema: string, table: string): Promise<ReadonlyArray<string>> => {
  // sql: the catalog.
  const result = await sql<{ name: string }>`
    SELECT quote_ident(column_name) AS name FROM information_schema.columns
    WHERE table_schema = ${schema} AND table_name = ${table} ORDER BY ordinal_position`.execute(db)
  return result.rows.map((r) => r.name)
}

/** Moves partition `name`'s dead rows to `<table>_archive`, ids and columns unchanged; returns how many (counts only when `dryRun`). */
const archiveDead = async (
  db: AnyDb,
  schema: string,
  table: QueueTable,
  name: string,
  dryRun: boolean,
): Promise<number> => {
  const partition = `ONLY ${qualified(schema, name)}`
  if (dryRun) {
    const n = await sql<{
      n: string
    }>`SELECT count(*)::text AS n FROM ${sql.raw(partition)} WHERE status = 'dead'`.execute(db)
    return Number(n.rows[0]!.n)
  }
  const columns = (await columnsOf(db, schema, table)).join(", ")
  // sql: INSERT … SELECT between a partition and the archive, by name.
  const moved = await sql
    .raw(
      `INSERT INTO ${qualified(schema, `${table}_archive`)} (${columns}) ` +
        `SELECT ${columns} FROM ${partition} WHERE status = 'dead'`,
    )
    .execute(db)
  return Number(moved.numAffectedRows ?? 0)
}

/** What the keepers below take: partitions made `aheadMs` ahead, `everyMs` each; given `dropOlderThanMs`, old ones dropped. */
interface KeepOptions {
  readonly aheadMs: number
  readonly everyMs: number
  readonly dropOlderThanMs?: number
}

/** What they did: the partitions created and dropped, by name. */
interface Kept {
  readonly created: ReadonlyArray<string>
  readonly dropped: ReadonlyArray<string>
}

const keepPartitionsOf = (
  db: Tables,
  table: QueueTable,
  options: KeepOptions,
  dedupeWindowMs: number,
): Effect.Effect<Kept, StoreError> =>
  Effect.gen(function* () {
    const made = yield* ensurePartitions(db, { ...options, tables: [table] })
    const gone =
      options.dropOlderThanMs === undefined
        ? []
        : yield* dropPartitions(db, { olderThanMs: options.dropOlderThanMs, dedupeWindowMs, tables: [table] })
    return {
      created: made.created.map((c) => c.name),
      dropped: gone.filter((d) => d.dropped).map((d) => d.name),
    }
  })

/** `OutboxStore.keepPartitions`. */
export const keepOutboxPartitions = (db: Tables, options: KeepOptions): Effect.Effect<Kept, StoreError> =>
  keepPartitionsOf(db, "outbox", options, 0)

/** `InboxStore.keepPartitions`: `dropOlderThanMs` is also the dedupe window. */
export const keepInboxPartitions = (db: Tables, options: KeepOptions): Effect.Effect<Kept, StoreError> =>
  keepPartitionsOf(db, "inbox", options, options.dropOlderThanMs ?? 0)
