/**
 * The statements behind the `txbox` command: status, dead-letter list and
 * redrive, retention. None of them is on the hot path, but they run against
 * the same tables as the relay and the consumers, so every write takes its
 * rows with SKIP LOCKED in bounded batches: an operator's command never makes
 * a relay wait, and never holds thousands of row locks for long.
 *
 * They are written with Kysely's builder over `TxboxDatabase`, so a renamed
 * column or a misspelt status fails the type check; `sql` fragments are left
 * only where the builder has no words for the SQL, each saying why.
 */
import { Effect } from "effect"
import {
  CompiledQuery,
  type Expression,
  type ExpressionBuilder,
  expressionBuilder,
  type Kysely,
  type QueryCreator,
  type RawBuilder,
  type SelectQueryBuilder,
  type SqlBool,
  sql,
} from "kysely"
import { quoteIdent } from "../../core/identifier.ts"
import type { StoreError } from "../../Errors.ts"
import type { DatabaseShape } from "../../ports/Database.ts"
import type { InboxStatus, OutboxStatus as OutboxRowStatus, TxboxDatabase } from "../../ports/tables.ts"
import { classifyDbError } from "./errors.ts"
import { upsertCursors, waitsForOf } from "./fragments.ts"
import { afterOf, isEarly, isNext } from "./partitionGate.ts"
import { columnsOf } from "./partitions.ts"

/** One statement (or a few) of an operator's command, its failure classified, in a span of its own. */
export const query = <A>(operation: string, f: () => Promise<A>): Effect.Effect<A, StoreError> =>
  Effect.tryPromise({ try: f, catch: (cause) => classifyDbError(operation, cause) }).pipe(
    Effect.withSpan(`txbox.${operation}`),
  )

/** Statements given as text (`storage/wal/slots.ts`'s), run on the database's Kysely. */
export const runOn =
  (db: DatabaseShape) =>
  <R>(text: string, params: ReadonlyArray<unknown> = []): Promise<ReadonlyArray<R>> =>
    db.db.executeQuery(CompiledQuery.raw(text, [...params])).then((r) => r.rows as ReadonlyArray<R>)

/** txbox's tables in the configured schema (CTE names are left unqualified by `withSchema`). */
export const tables = (db: DatabaseShape) => (db.db as Kysely<TxboxDatabase>).withSchema(db.schema)

// Builds the typed expressions that need no table in scope (casts of parameters).
const eb0 = expressionBuilder<TxboxDatabase>()

// Statuses are inlined as literals (`status = 'sent'`), never bound as
// parameters: a generic plan of `status = $1` could not prove the partial
// indexes' predicates (`WHERE status = 'sent'`, ...) and would lose them.
// (Typed as the literal, so comparing an outbox status with 'processed' fails to compile.)
const status = <S extends OutboxRowStatus | InboxStatus>(value: S): RawBuilder<S> => sql.lit(value)
const PENDING = status("pending")
const SENT = status("sent")
const DEAD = status("dead")
const PROCESSED = status("processed")

// Parameters keep the casts they have always had (`$1::int` is spelt `cast($1 as
// integer)`), so the statement fixes their types whichever driver binds them.
const int4 = (n: number): Expression<number> => eb0.cast<number>(eb0.val(n), "integer")
const timestamptz = (at: Date): Expression<Date> => eb0.cast<Date>(eb0.val(at.toISOString()), "timestamptz")
// sql: Kysely has no interval arithmetic. The database's clock, so the client's never matters.
const ago = (seconds: number): RawBuilder<Date> => sql<Date>`now() - ${seconds}::float8 * interval '1 second'`
// sql: Kysely has no EXTRACT; the aggregate inside is still built (and checked) by Kysely.
const epochSince = (aggregate: Expression<Date | null>) =>
  sql<string | null>`EXTRACT(EPOCH FROM now() - ${aggregate})`

// count(*) is bigint, which drivers hand back as a string.
const int = (value: unknown): number => Number(value ?? 0)
const seconds = (value: unknown): number | null =>
  value === null || value === undefined ? null : Math.round(Number(value) * 1000) / 1000

/** Which of txbox's tables exist in `db.schema` (empty when the schema itself is missing). */
export interface SchemaState {
  readonly schemaExists: boolean
  readonly tables: ReadonlyArray<string>
}

/**
 * The first statement of every command: it proves the connection (so a bad
 * URL or password is reported as such, not as a failed query) and tells
 * whether `txbox migrate` has run, before anything names a table.
 */
export const schemaState = (db: DatabaseShape): Effect.Effect<SchemaState, StoreError> =>
  query("connect", async () => {
    // sql: information_schema is not in TxboxDatabase (it describes txbox's tables, not the catalog).
    const result = await sql<{ schema_exists: boolean; tables: string[] | null }>`
      SELECT EXISTS (SELECT 1 FROM information_schema.schemata WHERE schema_name = ${db.schema}) AS schema_exists,
             (SELECT array_agg(table_name::text ORDER BY table_name) FROM information_schema.tables
              WHERE table_schema = ${db.schema} AND table_name IN ('outbox', 'inbox')) AS tables`.execute(
      db.db,
    )
    const row = result.rows[0]
    return { schemaExists: row?.schema_exists === true, tables: row?.tables ?? [] }
  })

export interface OutboxCounts {
  readonly pending: number
  /** Pending and `visible_at <= now()`: what a relay would claim next (an expired lease included). */
  readonly due: number
  /** Pending, claimed (a lock token) and still inside its lease. */
  readonly in_flight: number
  readonly dead: number
  /** Exact, or estimated from the table's statistics (`OutboxStatus.estimated`): then the total only, null per type and tenant. */
  readonly sent: number | null
  /** Seconds the oldest due row has waited past its `visible_at`; null when nothing is due. */
  readonly lag_seconds: number | null
}

export interface OutboxStatus {
  /**
   * Whether the sent count is an estimate: a table past `exactUpTo` rows (by its statistics) is
   * counted from its partial indexes (pending and dead rows, exactly) instead of a full scan.
   */
  readonly estimated: boolean
  readonly total: OutboxCounts
  readonly by_type: ReadonlyArray<OutboxCounts & { readonly type: string }>
  readonly by_tenant: ReadonlyArray<OutboxCounts & { readonly tenant: string | null }>
}

export interface InboxConsumerStatus {
  readonly consumer: string
  readonly pending: number
  /** Exact; null when the inbox is past `exactUpTo` rows and only pending and dead rows are counted. */
  readonly processed: number | null
  readonly dead: number
  /** Seconds since the oldest pending row was received; null when none is pending. */
  readonly oldest_pending_age_seconds: number | null
}

/** Rows `status` counts exactly, by default: past this (by the table's statistics) it estimates. */
export const EXACT_UP_TO = 1_000_000

/**
 * The planner's row estimate of txbox's `table` (`pg_class.reltuples`, kept by
 * autovacuum and ANALYZE), summed over its partitions (migration 0015: the
 * partitioned parent has no estimate of its own); undefined before any of
 * them was ever analyzed.
 */
const estimatedRows = async (db: DatabaseShape, table: "outbox" | "inbox"): Promise<number | undefined> => {
  // sql: pg_partition_tree and pg_class are the catalog, not txbox's tables. A plain table is its own leaf.
  const result = await sql<{ rows: number | string | null }>`
    SELECT sum(c.reltuples) FILTER (WHERE c.reltuples >= 0) AS rows
    FROM pg_partition_tree(format('%I.%I', ${db.schema}::text, ${table}::text)::regclass) t
    JOIN pg_class c ON c.oid = t.relid
    WHERE t.isleaf`.execute(db.db)
  const rows = result.rows[0]?.rows
  return rows === null || rows === undefined ? undefined : Number(rows)
}

/**
 * Outbox counts in one scan: GROUPING SETS gives the total, the per-type and
 * the per-tenant rows together, where three GROUP BY queries would read the
 * table three times. Up to `exactUpTo` rows (by the table's statistics) it is
 * a full scan, sent rows included, about ten times a bare count(*)
 * (bench/README.md, "Design measurements: status"); past that it reads the
 * pending and dead rows through their partial indexes only, and the sent
 * count is the statistics' total less those (`estimated`).
 */
export const outboxStatus = (
  db: DatabaseShape,
  exactUpTo: number = EXACT_UP_TO,
): Effect.Effect<OutboxStatus, StoreError> =>
  query("status.outbox", async () => {
    const estimate = await estimatedRows(db, "outbox")
    const estimated = estimate !== undefined && estimate > exactUpTo
    const rows = await tables(db)
      .selectFrom("outbox")
      .select((eb) => {
        const pending = eb("status", "=", PENDING)
        const due = eb.and([pending, eb("visible_at", "<=", eb.fn<Date>("now"))])
        return [
          "type",
          "tenant_id",
          // GROUPING is grammar rather than a function in PostgreSQL, but it is
          // spelt like a call, so `fn` says it (and checks the column names).
          eb.fn<number>("grouping", ["type", "tenant_id"]).as("grouping"),
          eb.fn.countAll().filterWhere(pending).as("pending"),
          eb.fn.countAll().filterWhere(due).as("due"),
          eb.fn
            .countAll()
            .filterWhere(
              eb.and([pending, eb("lock_token", "is not", null), eb("visible_at", ">", eb.fn<Date>("now"))]),
            )
            .as("in_flight"),
          eb.fn.countAll().filterWhere("status", "=", DEAD).as("dead"),
          eb.fn.countAll().filterWhere("status", "=", SENT).as("sent"),
          epochSince(eb.fn.min("visible_at").filterWhere(due)).as("lag_seconds"),
        ]
      })
      // Estimating: pending and dead rows only, each status through its partial index.
      .$if(estimated, (qb) => qb.where((eb) => eb.or([eb("status", "=", PENDING), eb("status", "=", DEAD)])))
      // sql: Kysely's groupBy has no GROUPING SETS.
      .groupBy(sql`GROUPING SETS ((), (type), (tenant_id))`)
      .orderBy("grouping")
      .orderBy("type")
      .orderBy("tenant_id", (ob) => ob.nullsFirst())
      .execute()
    const counts = (r: (typeof rows)[number]): OutboxCounts => ({
      pending: int(r.pending),
      due: int(r.due),
      in_flight: int(r.in_flight),
      dead: int(r.dead),
      sent: estimated ? null : int(r.sent),
      lag_seconds: seconds(r.lag_seconds),
    })
    // GROUPING(type, tenant_id) is a bit mask of the columns *not* grouped on:
    // 3 = neither (the total), 1 = grouped by type, 2 = grouped by tenant.
    const found = rows.find((r) => Number(r.grouping) === 3)
    const total: OutboxCounts = found
      ? counts(found)
      : { pending: 0, due: 0, in_flight: 0, dead: 0, sent: estimated ? null : 0, lag_seconds: null }
    return {
      estimated,
      total: estimated
        ? { ...total, sent: Math.max(0, Math.round(estimate - total.pending - total.dead)) }
        : total,
      by_type: rows
        .filter((r) => Number(r.grouping) === 1)
        .map((r) => ({ type: r.type ?? "", ...counts(r) })),
      by_tenant: rows
        .filter((r) => Number(r.grouping) === 2)
        .map((r) => ({ tenant: r.tenant_id, ...counts(r) })),
    }
  })

/**
 * Per inbox consumer: pending, processed, dead and the oldest pending row's
 * age. Past `exactUpTo` rows (by the table's statistics) only pending and dead
 * rows are read, through their partial indexes, and `processed` is null.
 */
export const inboxStatus = (
  db: DatabaseShape,
  exactUpTo: number = EXACT_UP_TO,
): Effect.Effect<ReadonlyArray<InboxConsumerStatus>, StoreError> =>
  query("status.inbox", async () => {
    const estimate = await estimatedRows(db, "inbox")
    const estimated = estimate !== undefined && estimate > exactUpTo
    const rows = await tables(db)
      .selectFrom("inbox")
      .$if(estimated, (qb) => qb.where((eb) => eb.or([eb("status", "=", PENDING), eb("status", "=", DEAD)])))
      .select((eb) => [
        "consumer",
        eb.fn.countAll().filterWhere("status", "=", PENDING).as("pending"),
        eb.fn.countAll().filterWhere("status", "=", PROCESSED).as("processed"),
        eb.fn.countAll().filterWhere("status", "=", DEAD).as("dead"),
        epochSince(eb.fn.min("received_at").filterWhere("status", "=", PENDING)).as(
          "oldest_pending_age_seconds",
        ),
      ])
      .groupBy("consumer")
      .orderBy("consumer")
      .execute()
    return rows.map((r) => ({
      consumer: r.consumer,
      pending: int(r.pending),
      processed: estimated ? null : int(r.processed),
      dead: int(r.dead),
      oldest_pending_age_seconds: seconds(r.oldest_pending_age_seconds),
    }))
  })

/**
 * An ordered key of one consumer with messages still to handle, seen from its
 * head (the lowest number not processed): why the key is not moving.
 */
export interface WaitingKey {
  readonly consumer: string
  readonly partition_key: string
  /** Messages of the key not processed yet (pending or dead). */
  readonly waiting: number
  /** The number the key waits for: the head's, or when the head waits for one not received, that one's. */
  readonly next_seq: number
  readonly head_seq: number
  readonly head_message_id: string
  /** `dead`: blocked until redriven or skipped; `missing`: waiting for `next_seq` to arrive; `pending`: its turn (running or retrying). */
  readonly head: "dead" | "missing" | "pending"
  readonly head_last_error: string | null
  /** Seconds since the oldest waiting message of the key was received. */
  readonly oldest_age_seconds: number | null
}

/**
 * Keys with ordered messages still to handle, the longest waiting first. A key
 * whose head is `dead` or `missing` is blocked; `pending` is merely busy.
 */
export const waitingKeys = (
  db: DatabaseShape,
  limit: number,
): Effect.Effect<ReadonlyArray<WaitingKey>, StoreError> =>
  query("status.keys", async () => {
    const rows = await tables(db)
      .selectFrom("inbox as i")
      .leftJoin("inbox_cursors as c", (join) =>
        join.onRef("c.consumer", "=", "i.consumer").onRef("c.partition_key", "=", "i.partition_key"),
      )
      .distinctOn(["i.consumer", "i.partition_key"])
      .select((eb) => [
        "i.consumer",
        "i.partition_key",
        "i.message_id",
        "i.status",
        "i.last_error",
        eb.cast<number>("i.partition_seq", "double precision").as("head_seq"),
        eb.cast<number | null>("i.partition_after", "double precision").as("head_after"),
        eb.cast<number | null>("c.last_seq", "double precision").as("last_seq"),
        eb.cast<number | null>("c.epoch", "double precision").as("cursor_epoch"),
        eb.cast<number>("i.partition_epoch", "double precision").as("head_epoch"),
        // Under onOrderedDead "skip", a head whose predecessor is dead goes on: not missing.
        eb
          .and([
            eb.exists(
              eb
                .selectFrom("inbox_consumers as p")
                .select("p.consumer")
                .whereRef("p.consumer", "=", "i.consumer")
                .where("p.on_ordered_dead", "=", "skip"),
            ),
            eb.exists(
              eb
                .selectFrom("inbox as d")
                .select("d.message_id")
                .whereRef("d.consumer", "=", "i.consumer")
                .whereRef("d.partition_key", "=", "i.partition_key")
                .whereRef("d.partition_epoch", "=", "i.partition_epoch")
                .where("d.status", "=", "dead")
                .where("d.partition_seq", "=", waitsForOf("i")),
            ),
          ])
          .as("passes_dead_before"),
        // A key whose cursor was purged does not wait for what it handled before (migration 0010).
        eb
          .and([
            eb("c.epoch", "is", null),
            eb.exists(
              eb
                .selectFrom("inbox_consumers as h")
                .select("h.consumer")
                .whereRef("h.consumer", "=", "i.consumer")
                .whereRef("h.cursors_purged_before", ">", "i.partition_after_at"),
            ),
          ])
          .as("passes_purged"),
        eb.fn
          .countAll()
          .over((ob) => ob.partitionBy(["i.consumer", "i.partition_key"]))
          .as("waiting"),
        epochSince(
          eb.fn.min("i.received_at").over((ob) => ob.partitionBy(["i.consumer", "i.partition_key"])),
        ).as("oldest_age_seconds"),
      ])
      .where("i.partition_seq", "is not", null)
      .where("i.status", "<>", PROCESSED)
      // A dead message the key was moved past (`dead skip`) no longer holds it, nor one that its
      // consumer passes (onOrderedDead "skip", as its inbox last said at start).
      .where(
        sql<boolean>`NOT (i.status = 'dead' AND c.epoch IS NOT NULL AND (c.epoch > i.partition_epoch OR (c.epoch = i.partition_epoch AND i.partition_seq <= c.last_seq)))`,
      )
      .where(({ not, exists, selectFrom, and, eb }) =>
        not(
          and([
            eb("i.status", "=", "dead"),
            exists(
              selectFrom("inbox_consumers as p")
                .select("p.consumer")
                .whereRef("p.consumer", "=", "i.consumer")
                .where("p.on_ordered_dead", "=", "skip"),
            ),
          ]),
        ),
      )
      .orderBy("i.consumer")
      .orderBy("i.partition_key")
      .orderBy("i.partition_epoch")
      .orderBy("i.partition_seq")
      .execute()
    return rows
      .map((r): WaitingKey => {
        const at = {
          epoch: r.head_epoch,
          seq: r.head_seq,
          ...(r.head_after === null ? {} : { after: r.head_after }),
        }
        const cursor =
          r.last_seq === null || r.cursor_epoch === null
            ? undefined
            : { epoch: r.cursor_epoch, lastSeq: r.last_seq }
        const missing =
          r.status !== "dead" && isEarly(at, cursor) && !r.passes_dead_before && !r.passes_purged
        return {
          consumer: r.consumer,
          partition_key: r.partition_key ?? "",
          waiting: int(r.waiting),
          next_seq: missing ? afterOf(at) : r.head_seq,
          head_seq: r.head_seq,
          head_message_id: r.message_id,
          head: r.status === "dead" ? "dead" : missing ? "missing" : "pending",
          head_last_error: r.last_error,
          oldest_age_seconds: seconds(r.oldest_age_seconds),
        }
      })
      .sort((a, b) => (b.oldest_age_seconds ?? 0) - (a.oldest_age_seconds ?? 0))
      .slice(0, limit)
  })

/**
 * Lets an ordered key move past one of its dead messages: the consumer's
 * cursor for the key moves to it, so the next message runs; the dead row
 * stays, for the record (a later redrive runs it out of order). Only the dead
 * message at the head of its key can be skipped. Returns the key and number
 * skipped, or why not.
 */
export const skipDead = (
  db: DatabaseShape,
  consumer: string,
  messageId: string,
): Effect.Effect<
  | { readonly skipped: true; readonly partition_key: string; readonly seq: number }
  | { readonly skipped: false; readonly reason: string },
  StoreError
> =>
  query("dead.skip", () =>
    tables(db)
      .transaction()
      .execute(async (trx) => {
        const row = await trx
          .selectFrom("inbox")
          .select((eb) => [
            "partition_key",
            "status",
            eb.cast<number | null>("partition_epoch", "double precision").as("epoch"),
            eb.cast<number | null>("partition_seq", "double precision").as("seq"),
            eb.cast<number | null>("partition_after", "double precision").as("after"),
          ])
          .where("consumer", "=", consumer)
          .where("message_id", "=", messageId)
          .executeTakeFirst()
        if (row === undefined) return { skipped: false, reason: "no such inbox row" } as const
        if (row.status !== "dead")
          return { skipped: false, reason: `the row is ${row.status}, not dead` } as const
        if (row.partition_key === null || row.epoch === null || row.seq === null) {
          return {
            skipped: false,
            reason: "the row is not ordered (no partition key): nothing waits on it",
          } as const
        }
        const cursor = await trx
          .selectFrom("inbox_cursors")
          .select((eb) => [
            eb.cast<number>("epoch", "double precision").as("epoch"),
            eb.cast<number>("last_seq", "double precision").as("last_seq"),
          ])
          .where("consumer", "=", consumer)
          .where("partition_key", "=", row.partition_key)
          .forUpdate()
          .executeTakeFirst()
        const at = { epoch: row.epoch, seq: row.seq, ...(row.after === null ? {} : { after: row.after }) }
        if (!isNext(at, cursor && { epoch: cursor.epoch, lastSeq: cursor.last_seq })) {
          return {
            skipped: false,
            reason: `it is not the next message of key ${row.partition_key} (the consumer is at ${cursor === undefined ? 0 : cursor.last_seq})`,
          } as const
        }
        // Forward only: a processor may have moved the key past this row since it was read (under
        // onOrderedDead "skip", or committing the key's first cursor, which no lock above held).
        await upsertCursors(trx, {
          consumer,
          partition_key: row.partition_key,
          epoch: row.epoch,
          last_seq: row.seq,
        }).execute()
        return { skipped: true, partition_key: row.partition_key, seq: row.seq } as const
      }),
  )

/** A point in time, relative to the database's clock (so the client's clock never matters) or absolute. */
export type TimeBound = { readonly secondsAgo: number } | { readonly at: Date }

const timeOf = (bound: TimeBound): Expression<Date> =>
  "secondsAgo" in bound ? ago(bound.secondsAgo) : timestamptz(bound.at)

/** Selects dead rows. Outbox rows are timed by `occurred_at`, inbox rows by `received_at` (their indexed columns). */
export interface DeadFilter {
  readonly table: "outbox" | "inbox"
  /** Outbox: the event id (a uuid). Inbox: the message id. */
  readonly id?: string
  readonly type?: string
  readonly tenant?: string
  /** Inbox only. */
  readonly consumer?: string
  readonly since?: TimeBound
  readonly until?: TimeBound
}

// One per table: the two share most columns, but not the id, the consumer or the time.
const outboxDead =
  (f: DeadFilter) =>
  (eb: ExpressionBuilder<TxboxDatabase, "outbox">): Expression<SqlBool> => {
    const conditions: Expression<SqlBool>[] = [eb("status", "=", DEAD)]
    if (f.id !== undefined) conditions.push(eb("id", "=", eb.cast<string>(eb.val(f.id), "uuid")))
    if (f.type !== undefined) conditions.push(eb("type", "=", f.type))
    if (f.tenant !== undefined) conditions.push(eb("tenant_id", "=", f.tenant))
    if (f.since !== undefined) conditions.push(eb("occurred_at", ">=", timeOf(f.since)))
    if (f.until !== undefined) conditions.push(eb("occurred_at", "<", timeOf(f.until)))
    return eb.and(conditions)
  }

const inboxDead =
  (f: DeadFilter) =>
  (eb: ExpressionBuilder<TxboxDatabase, "inbox">): Expression<SqlBool> => {
    const conditions: Expression<SqlBool>[] = [eb("status", "=", DEAD)]
    if (f.id !== undefined) conditions.push(eb("message_id", "=", f.id))
    if (f.type !== undefined) conditions.push(eb("type", "=", f.type))
    if (f.tenant !== undefined) conditions.push(eb("tenant_id", "=", f.tenant))
    if (f.consumer !== undefined) conditions.push(eb("consumer", "=", f.consumer))
    if (f.since !== undefined) conditions.push(eb("received_at", ">=", timeOf(f.since)))
    if (f.until !== undefined) conditions.push(eb("received_at", "<", timeOf(f.until)))
    return eb.and(conditions)
  }

export interface DeadRow {
  readonly table: "outbox" | "inbox"
  readonly id: string
  /** Inbox rows only; null for the outbox. */
  readonly consumer: string | null
  /** Null for an inbox row whose body could not be decoded. */
  readonly type: string | null
  readonly tenant: string | null
  readonly attempts: number
  readonly last_error: string | null
  /** `occurred_at` (outbox) or `received_at` (inbox). */
  readonly time: Date
  /** In `<table>_archive`: its partition was dropped (migration 0016); a redrive brings it back. */
  readonly archived: boolean
}

// An archive (migration 0016) under its table's name: the same columns (and `archived_at`, never
// read here), so the same filters and selects apply; typed as the table for Kysely.
const outboxOrArchive = (archive: boolean) => (archive ? "outbox_archive as outbox" : "outbox") as "outbox"
const inboxOrArchive = (archive: boolean) => (archive ? "inbox_archive as inbox" : "inbox") as "inbox"

/** The newest `limit` dead rows of `from` (the table or its archive) matching `filter`. */
const deadRowsOf = async (
  db: DatabaseShape,
  filter: DeadFilter,
  limit: number,
  archive: boolean,
): Promise<ReadonlyArray<Omit<DeadRow, "table" | "archived">>> =>
  filter.table === "outbox"
    ? await tables(db)
        // The archive under the table's name: the same columns, so the same filter and select.
        .selectFrom(outboxOrArchive(archive))
        .select((eb) => [
          eb.cast<string>("id", "text").as("id"),
          eb.cast<string | null>(eb.lit(null), "text").as("consumer"),
          "type",
          "tenant_id as tenant",
          "attempts",
          "last_error",
          "occurred_at as time",
        ])
        .where(outboxDead(filter))
        // `id` here is the output column (the text cast), as it always was.
        .orderBy("occurred_at", "desc")
        .orderBy("id", "desc")
        .limit(int4(limit))
        .execute()
    : await tables(db)
        .selectFrom(inboxOrArchive(archive))
        .select([
          "message_id as id",
          "consumer",
          "type",
          "tenant_id as tenant",
          "attempts",
          "last_error",
          "received_at as time",
        ])
        .where(inboxDead(filter))
        .orderBy("received_at", "desc")
        .orderBy("message_id", "desc")
        .orderBy("consumer")
        .limit(int4(limit))
        .execute()

/** The newest `limit` dead rows matching `filter`, in the table and in its archive (migration 0016). */
export const listDead = (
  db: DatabaseShape,
  filter: DeadFilter,
  limit: number,
): Effect.Effect<ReadonlyArray<DeadRow>, StoreError> =>
  query("dead.list", async () => {
    const tagged = (archived: boolean) => (r: Omit<DeadRow, "table" | "archived">) => ({
      table: filter.table,
      ...r,
      attempts: int(r.attempts),
      time: new Date(r.time),
      archived,
    })
    const live = (await deadRowsOf(db, filter, limit, false)).map(tagged(false))
    const archived = (await deadRowsOf(db, filter, limit, true)).map(tagged(true))
    return [...live, ...archived]
      .sort((a, b) => b.time.getTime() - a.time.getTime() || (a.id < b.id ? 1 : a.id > b.id ? -1 : 0))
      .slice(0, limit)
  })

/** How many dead rows match (what `dead redrive --dry-run` reports), the archived ones included. */
export const countDead = (db: DatabaseShape, filter: DeadFilter): Effect.Effect<number, StoreError> =>
  query("dead.count", async () => {
    let n = 0
    for (const archive of [false, true]) {
      const row =
        filter.table === "outbox"
          ? await tables(db)
              .selectFrom(outboxOrArchive(archive))
              .select((eb) => eb.fn.countAll().as("n"))
              .where(outboxDead(filter))
              .executeTakeFirst()
          : await tables(db)
              .selectFrom(inboxOrArchive(archive))
              .select((eb) => eb.fn.countAll().as("n"))
              .where(inboxDead(filter))
              .executeTakeFirst()
      n += int(row?.n)
    }
    return n
  })

/**
 * Hands up to `limit` matching dead rows back to the relay (outbox) or the
 * store-then-process processor (inbox): pending, due now, a fresh attempt
 * budget and no lease. `last_error` stays, so the next failure can be compared
 * with the last one. Safe to repeat: a message that was in fact delivered is
 * absorbed by the consumers' inbox. Archived rows (migration 0016) come back
 * into the table the same way, once the live ones are done.
 */
export const redriveDead = (
  db: DatabaseShape,
  filter: DeadFilter,
  limit: number,
): Effect.Effect<number, StoreError> =>
  query("dead.redrive", async () => {
    const result =
      filter.table === "outbox"
        ? await tables(db)
            .with("picked", (qb) =>
              qb
                .selectFrom("outbox")
                .select("id")
                .where(outboxDead(filter))
                .limit(int4(limit))
                .forUpdate()
                .skipLocked(),
            )
            .updateTable("outbox as o")
            .from("picked")
            .set((eb) => ({
              status: PENDING,
              attempts: eb.lit(0),
              visible_at: eb.fn("now"),
              lock_token: eb.lit(null),
            }))
            .whereRef("o.id", "=", "picked.id")
            .where("o.status", "=", DEAD)
            .executeTakeFirst()
        : await tables(db)
            .with("picked", (qb) =>
              qb
                .selectFrom("inbox")
                .select(["message_id", "consumer"])
                .where(inboxDead(filter))
                .limit(int4(limit))
                .forUpdate()
                .skipLocked(),
            )
            .updateTable("inbox as i")
            .from("picked")
            .set((eb) => ({
              status: PENDING,
              attempts: eb.lit(0),
              visible_at: eb.fn("now"),
              lock_token: eb.lit(null),
            }))
            .whereRef("i.message_id", "=", "picked.message_id")
            .whereRef("i.consumer", "=", "picked.consumer")
            .where("i.status", "=", DEAD)
            .returning("i.consumer")
            .execute()
            .then(async (rows) => {
              await wakeConsumers(db, new Set(rows.map((r) => r.consumer)))
              return { numUpdatedRows: BigInt(rows.length) }
            })
    const live = int(result.numUpdatedRows)
    return live < limit ? live + (await restoreArchived(db, filter, limit - live)) : live
  })

/**
 * Wakes the processors of `consumers` now (migration 0011's channel, as the trigger names it), as
 * a stored row does: an idle processor whose NOTIFY is heard polls seldom. Restored archive rows
 * need none: they are inserted, and the trigger notifies.
 */
const wakeConsumers = async (db: DatabaseShape, consumers: ReadonlySet<string>): Promise<void> => {
  for (const consumer of consumers) {
    await sql`SELECT pg_notify('txbox_inbox_' || left(md5(${db.schema}::text || '.' || ${consumer}::text), 24), '')`.execute(
      db.db as Kysely<TxboxDatabase>,
    )
  }
}

/** Columns a restored archive row gets anew: pending, due now, a fresh budget, no lease. */
const RESTORED: Readonly<Record<string, string>> = {
  status: "'pending'",
  attempts: "0",
  visible_at: "now()",
  lock_token: "NULL",
}

/**
 * Moves up to `limit` matching archived dead rows back into their table,
 * pending (into the default partition when their day's partition is gone);
 * one transaction, so a row is in one place or the other, never both or
 * neither.
 */
const restoreArchived = (db: DatabaseShape, filter: DeadFilter, limit: number): Promise<number> =>
  (db.db as Kysely<TxboxDatabase>).transaction().execute(async (trx) => {
    const t = trx.withSchema(db.schema)
    const table = filter.table
    const picked =
      table === "outbox"
        ? (
            await t
              .selectFrom(outboxOrArchive(true))
              .select((eb) => eb.cast<string>("id", "text").as("key"))
              .where(outboxDead(filter))
              .limit(int4(limit))
              .forUpdate()
              .skipLocked()
              .execute()
          ).map((r) => [r.key, ""] as const)
        : (
            await t
              .selectFrom(inboxOrArchive(true))
              .select(["message_id", "consumer"])
              .where(inboxDead(filter))
              .limit(int4(limit))
              .forUpdate()
              .skipLocked()
              .execute()
          ).map((r) => [r.message_id, r.consumer] as const)
    if (picked.length === 0) return 0
    const columns = await columnsOf(trx, db.schema, table)
    const values = columns.map((c) => RESTORED[c] ?? `m.${c}`).join(", ")
    const archive = `${quoteIdent(db.schema)}.${quoteIdent(`${table}_archive`)}`
    const match =
      table === "outbox"
        ? sql`id::text = ANY(${picked.map(([id]) => id)}::text[])`
        : sql`(message_id, consumer) IN (SELECT * FROM unnest(${picked.map(([id]) => id)}::text[], ${picked.map(([, c]) => c)}::text[]))`
    // sql: a move between the archive and its table, their columns by name from the catalog.
    const moved = await sql`WITH m AS (DELETE FROM ${sql.raw(archive)} WHERE ${match} RETURNING *)
      INSERT INTO ${sql.raw(`${quoteIdent(db.schema)}.${quoteIdent(table)}`)} (${sql.raw(columns.join(", "))})
      SELECT ${sql.raw(values)} FROM m`.execute(trx)
    return Number(moved.numAffectedRows ?? 0)
  })

/**
 * The purge cutoff, read once from the database's clock: every batch then
 * deletes against the same instant, so rows that age past it while the purge
 * runs wait for the next one and the loop is sure to end.
 */
export const cutoff = (db: DatabaseShape, olderThanSeconds: number): Effect.Effect<Date, StoreError> =>
  query("purge.cutoff", async () => {
    const row = await tables(db).selectNoFrom(ago(olderThanSeconds).as("cutoff")).executeTakeFirstOrThrow()
    return new Date(row.cutoff)
  })

/** One purge: which rows of which table, and what else the statement does with the deleted ones. */
interface Purge {
  readonly operation: string
  readonly table:
    | "outbox"
    | "inbox"
    | "partition_counters"
    | "inbox_cursors"
    | "outbox_archive"
    | "inbox_archive"
  /** The columns that identify a row. */
  readonly key: ReadonlyArray<string>
  /** The rows due for deletion (aliased `p`), and the order to take them in: the pick's WHERE and ORDER BY. */
  // biome-ignore lint/suspicious/noExplicitAny: the table is chosen per purge
  readonly pick: (rows: SelectQueryBuilder<any, any, any>) => SelectQueryBuilder<any, any, any>
  /** A status the row must still have when deleted: a row redriven or claimed since the pick stays. */
  readonly stillStatus?: RawBuilder<OutboxRowStatus | InboxStatus>
  /** More CTEs after `gone` (the deleted rows' keys). */
  // biome-ignore lint/suspicious/noExplicitAny: a query creator whose `with` list holds `gone`
  readonly withGone?: (statement: QueryCreator<any>) => QueryCreator<any>
}

/**
 * The one shape of every purge batch: up to `limit` rows picked and locked,
 * skipping rows a relay, a consumer or a producer holds (`picked`); those
 * deleted (`gone`); the count of deleted rows returned.
 */
const purge = (db: DatabaseShape, spec: Purge, limit: number): Effect.Effect<number, StoreError> =>
  query(spec.operation, async () => {
    const { table, key } = spec
    // biome-ignore lint/suspicious/noExplicitAny: the table is chosen per purge
    const statement = (tables(db) as Kysely<any>)
      .with("picked", (qb) =>
        spec
          .pick(qb.selectFrom(`${table} as p`).select(key.map((column) => `p.${column}`)))
          .limit(int4(limit))
          .forUpdate()
          .skipLocked(),
      )
      .with("gone", (qb) => {
        let gone = qb.deleteFrom(`${table} as d`).using("picked")
        for (const column of key) gone = gone.whereRef(`d.${column}`, "=", `picked.${column}`)
        if (spec.stillStatus !== undefined) gone = gone.where("d.status", "=", spec.stillStatus)
        return gone.returning(key.map((column) => `d.${column}`))
      })
    const result = await (spec.withGone === undefined ? statement : spec.withGone(statement))
      .selectFrom("gone")
      .select((eb) => eb.fn.countAll<string>().as("n"))
      .executeTakeFirstOrThrow()
    return int(result.n)
  })

/**
 * Deletes up to `limit` sent outbox rows published before `before`. Only
 * `status = 'sent'` rows qualify, so pending and dead rows are out of reach
 * whatever the cutoff. ORDER BY makes the planner walk the partial
 * `outbox_sent` index from the oldest row: without it, when most rows
 * qualify it picks a sequential scan that restarts at the top of the heap on
 * every batch and wades through the tuples earlier batches deleted
 * (bench/README.md, "Design measurements: purge").
 */
export const purgeSent = (
  db: DatabaseShape,
  before: Date,
  limit: number,
): Effect.Effect<number, StoreError> =>
  purge(
    db,
    {
      operation: "purge.outbox",
      table: "outbox",
      key: ["id"],
      pick: (rows) =>
        rows
          .where("p.status", "=", SENT)
          .where("p.published_at", "<", timestamptz(before))
          .orderBy("p.published_at"),
      stillStatus: SENT,
    },
    limit,
  )

/** Deletes up to `limit` processed inbox rows processed before `before` (the partial `inbox_processed` index). */
export const purgeProcessed = (
  db: DatabaseShape,
  before: Date,
  limit: number,
): Effect.Effect<number, StoreError> =>
  purge(
    db,
    {
      operation: "purge.inbox",
      table: "inbox",
      key: ["message_id", "consumer"],
      pick: (rows) =>
        rows
          .where("p.status", "=", PROCESSED)
          .where("p.processed_at", "<", timestamptz(before))
          .orderBy("p.processed_at"),
      stillStatus: PROCESSED,
    },
    limit,
  )

/**
 * Deletes up to `limit` rows of `<table>_archive` (migration 0016: dead rows
 * whose partition was dropped) archived before `before`. The archives are the
 * only place those rows are kept: what goes here is gone for good.
 */
export const purgeArchived = (
  db: DatabaseShape,
  table: "outbox" | "inbox",
  before: Date,
  limit: number,
): Effect.Effect<number, StoreError> =>
  purge(
    db,
    {
      operation: `purge.${table}_archive`,
      table: `${table}_archive`,
      key: table === "outbox" ? ["id"] : ["message_id", "consumer"],
      pick: (rows) => rows.where("p.archived_at", "<", timestamptz(before)),
    },
    limit,
  )

/**
 * Deletes up to `limit` partition counters not used since `before`. The key's
 * next message starts a newer epoch at 1. Rows a producer holds are skipped.
 */
export const purgeIdleCounters = (
  db: DatabaseShape,
  before: Date,
  limit: number,
): Effect.Effect<number, StoreError> =>
  purge(
    db,
    {
      operation: "purge.counters",
      table: "partition_counters",
      key: ["partition_key"],
      pick: (rows) => rows.where("p.updated_at", "<", timestamptz(before)),
    },
    limit,
  )

/**
 * Deletes up to `limit` consumer cursors not moved since `before` whose key has
 * nothing left to handle for that consumer (no pending or dead row). In the
 * same statement it moves each such consumer's purge horizon to `before`
 * (migration 0010): the key's next message, still queued perhaps, does not
 * wait for a predecessor it handled before its cursor was forgotten.
 */
export const purgeIdleCursors = (
  db: DatabaseShape,
  before: Date,
  limit: number,
): Effect.Effect<number, StoreError> =>
  purge(
    db,
    {
      operation: "purge.cursors",
      table: "inbox_cursors",
      key: ["consumer", "partition_key"],
      pick: (rows) =>
        rows
          .where("p.updated_at", "<", timestamptz(before))
          .where((eb) =>
            eb.not(
              eb.exists(
                eb
                  .selectFrom("inbox as i")
                  .select("i.message_id")
                  .whereRef("i.consumer", "=", "p.consumer")
                  .whereRef("i.partition_key", "=", "p.partition_key")
                  .where("i.status", "<>", PROCESSED),
              ),
            ),
          ),
      withGone: (statement) =>
        statement.with("horizon", (qb) =>
          qb
            .insertInto("inbox_consumers")
            .columns(["consumer", "on_ordered_dead", "cursors_purged_before"])
            .expression((eb) =>
              eb
                .selectFrom("gone")
                .distinct()
                .select([
                  "gone.consumer",
                  // A consumer not yet recorded (it has not started since migration 0009) is "block"
                  // until its inbox next starts and says.
                  sql.lit("block").as("on_ordered_dead"),
                  sql<string>`${before.getTime()}::bigint`.as("cursors_purged_before"),
                ]),
            )
            .onConflict((oc) =>
              oc.column("consumer").doUpdateSet({
                cursors_purged_before: sql<number>`GREATEST(inbox_consumers.cursors_purged_before, excluded.cursors_purged_before)`,
              }),
            )
            .returning("consumer"),
        ),
    },
    limit,
  )
