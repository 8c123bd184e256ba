/**
 * The `InboxStore` port over SQL (PostgreSQL or PGlite, any Kysely driver).
 * Every write is keyed on (message_id, consumer) with ON CONFLICT DO NOTHING:
 * the primary key is the dedupe, so two consumers racing on one redelivered
 * message cannot both win. The port's `key` is the `message_id` column.
 *
 * Typed builder over `TxboxDatabase`, `sql` only where Kysely has no words,
 * and the same rules as SqlOutboxStore.ts: `status = 'pending'` is a literal
 * (the partial `inbox_due` index), JSON goes in as text cast in SQL, and each
 * statement is compiled once per store (`prepare`).
 */
import { Effect, Layer } from "effect"
import {
  type CompiledQuery,
  type ExpressionBuilder,
  type Kysely,
  type QueryCreator,
  sql,
  type Transaction,
} from "kysely"
import { standInsFor } from "../../core/standIn.ts"
import { uuidv7 } from "../../core/uuid.ts"
import { Database } from "../../ports/Database.ts"
import {
  type InboxMark,
  type InboxRow,
  InboxStore,
  type InboxStoreShape,
  type InboxTransaction,
  type InboxTransactionOptions,
  type OrderedDeadPolicy,
  type RouteBinding,
} from "../../ports/InboxStore.ts"
import type { Claim } from "../../ports/lease.ts"
import type { TxboxDatabase } from "../../ports/tables.ts"
import { type ClaimWindow, makeClaimWindow, startClaim } from "./claimWindow.ts"
import { tryStore, tryStoreUndoable } from "./errors.ts"
import {
  affected,
  now,
  nowMinusMs,
  nowPlusMs,
  pending,
  pendingOfKey,
  upsertCursors,
  verdictsJson,
  waitsForOf,
} from "./fragments.ts"
import { CHAINED_PER_CLAIM, chainOrder } from "./partitionGate.ts"
import * as partitions from "./partitions.ts"
import { prepare } from "./prepared.ts"
import { withTransaction } from "./transaction.ts"

/** An inbox row as the database returns it, and as rows travel in the batch inserts' JSON parameter. */
export interface StoredRow {
  readonly message_id: string
  readonly consumer: string
  readonly type: string | null
  readonly version: number | null
  readonly payload: string | null
  readonly raw: string | null
  readonly headers: Record<string, string>
  readonly partition_key: string | null
  readonly partition_epoch: number | null
  readonly partition_seq: number | null
  readonly partition_after?: number | null
  readonly partition_after_at?: number | null
  readonly tenant_id: string | null
  readonly attempts: number
  readonly last_error: string | null
  readonly stands_in_for?: string | null
}

/** A claimed row, with its depth in its key's chain (`claimQuery`). */
export type ClaimedRow = StoredRow & { readonly chain_depth: number }

/** One failure as it travels in `mark`'s JSON parameter. */
interface MarkRecord {
  readonly id: string
  readonly status: "pending" | "dead"
  readonly delay_ms: number
  readonly inc: number
  readonly error: string
}

const toStored = (row: InboxRow): StoredRow => ({
  message_id: row.key,
  consumer: row.consumer,
  type: row.type,
  version: row.version,
  payload: row.payload,
  raw: row.raw,
  headers: row.headers,
  partition_key: row.partitionKey,
  partition_epoch: row.position?.epoch ?? null,
  partition_seq: row.position?.seq ?? null,
  partition_after: row.position?.after ?? null,
  partition_after_at: row.position?.afterAtMs ?? null,
  tenant_id: row.tenantId,
  attempts: row.attempts,
  last_error: row.lastError,
  stands_in_for: row.standsInFor ?? null,
})

const toRow = (row: StoredRow): InboxRow => ({
  key: row.message_id,
  consumer: row.consumer,
  type: row.type,
  version: row.version,
  payload: row.payload,
  raw: row.raw,
  headers: row.headers ?? {},
  partitionKey: row.partition_key,
  position:
    row.partition_epoch === null || row.partition_seq === null
      ? null
      : row.partition_after == null
        ? { epoch: row.partition_epoch, seq: row.partition_seq }
        : { epoch: row.partition_epoch, seq: row.partition_seq, after: row.partition_after },
  tenantId: row.tenant_id,
  attempts: row.attempts,
  lastError: row.last_error,
  standsInFor: row.stands_in_for ?? null,
})

// Each statement as a function of its parameters, compiled once per store by `statements`.

/**
 * `statement_timeout` for the rest of the transaction (`InboxTransactionOptions`),
 * set as a side effect of the row it is returned with: no round trip of its own,
 * and only when a row was inserted or marked, that is, when a handler will run.
 * `bound` is milliseconds as text; null keeps the session's own setting.
 */
const boundStatements = (bound: string | null) =>
  sql<string>`set_config('statement_timeout', coalesce(${bound}::text, current_setting('statement_timeout')), true)`

/** `insertProcessed`'s parameters. (A type, not an interface: `prepare` wants a record.) */
export type ProcessedValues = {
  /** `boundStatements`'s milliseconds, as text. */
  readonly bound: string | null
  readonly key: string
  readonly consumer: string
  readonly type: string | null
  readonly version: number | null
  readonly partitionKey: string | null
  readonly tenantId: string | null
  readonly attempts: number
}

/**
 * Inserts one row as processed, in the handler's transaction. A plain
 * single-row VALUES, not the batch form: this runs once per delivery, and the
 * recordset form spends about as long in parse and plan as in execution
 * (bench/README.md, "Design measurements: inbox insert"). A processed row is
 * the dedupe record: key, type, version, key and times, without the payload
 * and headers, which the handler's effects hold (sending them cost every
 * message ~600 bytes of jsonb to parse and write to the WAL: bench/cost.ts).
 */
export const insertProcessedQuery = (
  db: Kysely<TxboxDatabase>,
  row: ProcessedValues,
): CompiledQuery<{ message_id: string }> =>
  db
    .insertInto("inbox")
    .values({
      message_id: row.key,
      consumer: row.consumer,
      type: row.type,
      version: row.version,
      partition_key: row.partitionKey,
      tenant_id: row.tenantId,
      attempts: row.attempts,
      status: sql.lit("processed" as const),
      processed_at: now,
    })
    .onConflict((oc) => oc.columns(["message_id", "consumer"]).doNothing())
    .returning(["message_id", boundStatements(row.bound).as("bound")])
    .compile()

/** A row to be inserted processed: the dedupe record, without payload and headers (see `insertProcessedQuery`). */
const slim = (row: InboxRow): InboxRow => ({ ...row, payload: null, raw: null, headers: {} })

/** The batch inserts' one parameter: the rows as a JSON array of `StoredRow`. */
export const storedRows = (rows: ReadonlyArray<InboxRow>): string => JSON.stringify(rows.map(toStored))

/**
 * Persists a batch (`storedRows`) in one statement; duplicates are skipped.
 * Returns the keys that were new. `processed`: a batch of deliveries whose
 * handlers run in the same transaction (idempotent mode).
 */
export const insertRowsQuery = (
  db: Kysely<TxboxDatabase>,
  status: "pending" | "dead" | "processed",
  /** `bound`: with processed rows, `boundStatements`'s milliseconds as text. */
  { rows, bound }: { readonly rows: string; readonly bound?: string | null },
  /** Stand-ins (core/standIn.ts): none where the key they repeat holds their position. */
  standIns = false,
): CompiledQuery<{ message_id: string }> => {
  // The rows travel as one JSON text parameter (every driver binds a string
  // the same way). Kysely cannot say a function's column definition list.
  const records = sql<StoredRow>`jsonb_to_recordset(${rows}::text::jsonb)`.as<"r">(
    sql`r(message_id text, consumer text, type text, version int, payload text, raw text, headers jsonb, partition_key text, partition_epoch bigint, partition_seq bigint, partition_after bigint, partition_after_at bigint, tenant_id text, attempts int, last_error text, stands_in_for text)`,
  )
  return (
    db
      .insertInto("inbox")
      .columns([
        "message_id",
        "consumer",
        "type",
        "version",
        "payload",
        "raw",
        "headers",
        "partition_key",
        "partition_epoch",
        "partition_seq",
        "partition_after",
        "partition_after_at",
        "tenant_id",
        "attempts",
        "status",
        "last_error",
        "processed_at",
        "stands_in_for",
      ])
      // Positional, as INSERT … SELECT is: the same order as the columns above.
      .expression((eb) =>
        eb
          .selectFrom(records)
          .select((eb) => [
            "r.message_id",
            "r.consumer",
            "r.type",
            "r.version",
            eb.cast("r.payload", "jsonb").as("payload"),
            "r.raw",
            eb.fn.coalesce("r.headers", sql`'{}'::jsonb`).as("headers"),
            "r.partition_key",
            "r.partition_epoch",
            "r.partition_seq",
            "r.partition_after",
            "r.partition_after_at",
            "r.tenant_id",
            "r.attempts",
            sql.lit(status).as("status"),
            "r.last_error",
            (status === "processed" ? now : sql<Date | null>`NULL::timestamptz`).as("processed_at"),
            "r.stands_in_for",
          ])
          .$if(standIns, (qb) =>
            qb.where(({ not, exists, selectFrom }) =>
              not(
                exists(
                  selectFrom("inbox as i")
                    .select("i.message_id")
                    .whereRef("i.consumer", "=", "r.consumer")
                    .whereRef("i.message_id", "=", "r.stands_in_for")
                    .whereRef("i.partition_epoch", "=", "r.partition_epoch")
                    .whereRef("i.partition_seq", "=", "r.partition_seq"),
                ),
              ),
            ),
          ),
      )
      .onConflict((oc) => oc.columns(["message_id", "consumer"]).doNothing())
      .returning(bound === undefined ? ["message_id"] : ["message_id", boundStatements(bound).as("bound")])
      .compile()
  )
}

/**
 * The per-key gate of the claim: an ordered row (`w`) waits while it is early —
 * what it waits for (`partition_after`, or for a row that does not say, the
 * number before it; `partitionGate.ts`) is not yet handled. Claimable:
 * unordered rows; a row whose predecessor for this consumer is handled (or
 * one already passed: a redriven row); one that waits for nothing, in a newer
 * epoch or a key the consumer has not seen (or whose cursor was purged after
 * what it waits for was handled: migration 0010). An older epoch's row is
 * late, not early. Never guesses past a missing number.
 */
type InboxScope = TxboxDatabase & { readonly w: TxboxDatabase["inbox"] }
const notEarly = (eb: ExpressionBuilder<InboxScope, "w">) => {
  const cursor = eb
    .selectFrom("inbox_cursors as c")
    .select(sql.lit(1).as("one"))
    .whereRef("c.consumer", "=", "w.consumer")
    .whereRef("c.partition_key", "=", "w.partition_key")
  const after = waitsForOf("w")
  return eb.or([
    eb("w.partition_seq", "is", null),
    eb.exists(
      cursor.where((c) =>
        c.or([
          c.and([c("c.epoch", "=", c.ref("w.partition_epoch")), c(after, "<=", c.ref("c.last_seq"))]),
          c("c.epoch", ">", c.ref("w.partition_epoch")),
          c.and([c("c.epoch", "<", c.ref("w.partition_epoch")), c(after, "=", sql<string>`0`)]),
        ]),
      ),
    ),
    eb.and([
      eb.not(eb.exists(cursor)),
      eb.or([
        eb(after, "=", sql<string>`0`),
        eb.exists(
          eb
            .selectFrom("inbox_consumers as h")
            .select(sql.lit(1).as("one"))
            .whereRef("h.consumer", "=", "w.consumer")
            .whereRef("h.cursors_purged_before", ">", "w.partition_after_at"),
        ),
      ]),
    ]),
  ])
}
/** Under onOrderedDead "skip": what the row waits for is dead (see `onlyDeadBefore` in partitionGate.ts). */
const onlyDeadBefore = (eb: ExpressionBuilder<InboxScope, "w">) =>
  eb.exists(
    eb
      .selectFrom("inbox as d")
      .select(sql.lit(1).as("one"))
      .whereRef("d.consumer", "=", "w.consumer")
      .whereRef("d.partition_key", "=", "w.partition_key")
      .whereRef("d.partition_epoch", "=", "w.partition_epoch")
      .where("d.partition_seq", "=", waitsForOf("w"))
      // Spelled as the partial index's predicate too, so the planner uses it.
      .where("d.status", "<>", sql.lit("processed"))
      .where("d.status", "=", sql.lit("dead")),
  )

/** The gate the claim, the set-aside and the bring-back share: a row may go now (under "skip", past a dead predecessor too). */
const goesNow = (passDead: boolean) => (eb: ExpressionBuilder<InboxScope, "w">) =>
  passDead ? eb.or([notEarly(eb), onlyDeadBefore(eb)]) : notEarly(eb)

// A type, not an interface: `prepare` takes it as a record of parameters.
type ClaimParams = {
  readonly consumer: string
  readonly limit: number
  readonly token: string
  readonly leaseMs: number
  /** How far back the heads are looked for (claimWindow.ts). */
  readonly sinceMs: number
}

/**
 * Claims up to `limit` rows that may go now and, with `chains`, behind each
 * ordered one the rows of its key that wait for it in turn (its chain: a key
 * with a backlog drains a batch at a time, not a row per claim), up to
 * CHAINED_PER_CLAIM × `limit` rows in all. `chain_depth` is 1 for a row
 * that may go now, n + 1 for one that waits for a claimed row at depth n; the
 * rows are taken by depth, so a row is only ever claimed with the rows it waits
 * for — except when SKIP LOCKED passed one of those, which `claim` hands back.
 */
export const claimQuery = (
  db: Kysely<TxboxDatabase>,
  { consumer, limit, token, leaseMs, sinceMs }: ClaimParams,
  passDead = false,
  chains = false,
): CompiledQuery<ClaimedRow> => {
  const goes = goesNow(passDead)
  // Without chains the recursive step finds nothing: one statement for both. With them, no deeper
  // than the limit shared out among the heads: the claim takes `limit` rows, shallowest first.
  const total = chains ? sql<number>`${limit} * ${sql.lit(CHAINED_PER_CLAIM)}` : sql<number>`${limit}`
  const maxDepth = chains ? sql<number>`CEIL(${total}::numeric / c.heads)` : sql.lit(1)
  return db
    .withRecursive("chain(message_id, partition_key, partition_epoch, partition_seq, depth, heads)", (qb) =>
      qb
        .selectFrom((heads) =>
          heads
            .selectFrom("inbox as w")
            .select(["w.message_id", "w.partition_key", "w.partition_epoch", "w.partition_seq"])
            .where("w.consumer", "=", consumer)
            .where("w.status", "=", pending)
            .where("w.visible_at", "<=", now)
            .where("w.visible_at", ">=", nowMinusMs(sinceMs))
            .where(goes)
            .orderBy("w.visible_at")
            .limit(limit)
            .as("heads"),
        )
        .select([
          "heads.message_id",
          "heads.partition_key",
          "heads.partition_epoch",
          "heads.partition_seq",
          sql.lit(1).as("depth"),
          sql<number>`count(*) OVER ()`.as("heads"),
        ])
        .unionAll((next) =>
          next
            .selectFrom("chain as c")
            // The key's next row after c (one index probe: inbox_ordered), if it waits for c.
            .innerJoinLateral(
              (eb) =>
                eb
                  .selectFrom("inbox as n")
                  .select([
                    "n.message_id",
                    "n.partition_key",
                    "n.partition_epoch",
                    "n.partition_seq",
                    "n.partition_after",
                    "n.visible_at",
                    "n.status",
                  ])
                  .where("n.consumer", "=", consumer)
                  .whereRef("n.partition_key", "=", "c.partition_key")
                  .whereRef("n.partition_epoch", "=", "c.partition_epoch")
                  .whereRef("n.partition_seq", ">", "c.partition_seq")
                  // Spelled as the partial index's predicate (inbox_ordered), so the planner uses it.
                  .where("n.status", "<>", sql.lit("processed"))
                  .orderBy("n.partition_seq")
                  .limit(sql.lit(1))
                  .as("n"),
              (join) => join.onTrue(),
            )
            .select([
              "n.message_id",
              "n.partition_key",
              "n.partition_epoch",
              "n.partition_seq",
              sql<number>`c.depth + 1`.as("depth"),
              "c.heads",
            ])
            .where(sql<boolean>`${waitsForOf("n")} = c.partition_seq`)
            .where("n.status", "=", pending)
            .where("n.visible_at", "<=", now)
            .where("c.depth", "<", maxDepth),
        ),
    )
    .with("due", (qb) =>
      qb
        .selectFrom("inbox as w")
        .innerJoin(
          (first) =>
            first
              .selectFrom("chain")
              .select(["chain.message_id", (eb) => eb.fn.min("chain.depth").as("depth")])
              .groupBy("chain.message_id")
              .as("c"),
          (join) => join.onRef("c.message_id", "=", "w.message_id"),
        )
        .select(["w.message_id", "c.depth"])
        .where("w.consumer", "=", consumer)
        // Checked again on the row as it is once locked: a row another claim took and committed
        // meanwhile (its lease moved visible_at) is not taken twice.
        .where("w.status", "=", pending)
        .where("w.visible_at", "<=", now)
        .orderBy("c.depth")
        .orderBy("w.visible_at")
        .limit(total)
        .forUpdate(["w"])
        .skipLocked(),
    )
    .updateTable("inbox as i")
    .set({ lock_token: token, visible_at: nowPlusMs(leaseMs) })
    .from("due")
    .where("i.consumer", "=", consumer)
    .whereRef("i.message_id", "=", "due.message_id")
    .returning((eb) => [
      "i.message_id",
      "i.consumer",
      "i.type",
      "i.version",
      // JSON text, handed to the contract's decoder as received.
      eb.cast<string | null>("i.payload", "text").as("payload"),
      "i.raw",
      "i.headers",
      "i.partition_key",
      eb.cast<number | null>("i.partition_epoch", "double precision").as("partition_epoch"),
      eb.cast<number | null>("i.partition_seq", "double precision").as("partition_seq"),
      eb.cast<number | null>("i.partition_after", "double precision").as("partition_after"),
      "i.tenant_id",
      "i.attempts",
      "i.last_error",
      "i.stands_in_for",
      eb.cast<number>("due.depth", "integer").as("chain_depth"),
    ])
    .compile()
}

/**
 * Records when `consumer`'s queue was first bound to each pattern (a pattern
 * already there keeps its time) and answers every pattern's time. The rows
 * the INSERT writes are not visible to the SELECT of the same statement, so
 * each pattern comes from one side of the UNION.
 */
export const bindingsQuery = (
  db: Kysely<TxboxDatabase>,
  { consumer, patterns }: { readonly consumer: string; readonly patterns: string },
): CompiledQuery<{ pattern: string; bound_at_ms: number }> => {
  const wanted = sql<{ value: string }>`jsonb_array_elements_text(${patterns}::text::jsonb)`.as<"p">(
    sql`p(value)`,
  )
  const ms = sql<number>`(extract(epoch FROM bound_at) * 1000)::double precision`
  return db
    .with("ins", (qb) =>
      qb
        .insertInto("inbox_bindings")
        .columns(["consumer", "pattern"])
        .expression((eb) => eb.selectFrom(wanted).select([sql.val(consumer).as("consumer"), "p.value"]))
        .onConflict((oc) => oc.columns(["consumer", "pattern"]).doNothing())
        .returning(["pattern", ms.as("bound_at_ms")]),
    )
    .selectFrom("ins")
    .select(["ins.pattern", "ins.bound_at_ms"])
    .unionAll((eb) =>
      eb
        .selectFrom("inbox_bindings as b")
        .select([
          "b.pattern",
          sql<number>`(extract(epoch FROM b.bound_at) * 1000)::double precision`.as("bound_at_ms"),
        ])
        .where("b.consumer", "=", consumer)
        .where(
          sql<boolean>`b.pattern IN (SELECT value FROM jsonb_array_elements_text(${patterns}::text::jsonb))`,
        ),
    )
    .compile()
}

/** The due time of a parked row: after every real one, so `inbox_due`'s front holds none. */
const PARKED = sql<Date>`'infinity'::timestamptz`
/** Rows one sweep sets aside at most: a bounded statement; the next sweep takes the rest. */
const PARK_AT_ONCE = 10_000

/**
 * Sets aside the ordered rows of `consumer` that have waited a while in keys
 * that cannot move (no row of the key may go now: its head is missing, or
 * dead under "block"): their due time becomes `infinity`, off the front of
 * `inbox_due`, which every claim reads (10,000 of them made each claim 4 ×
 * slower, bench/README.md "blocked.ts"). A key whose head runs keeps its
 * backlog where it is: it goes on in a moment. The mark that handles a predecessor brings its
 * successors back (`unparkAfter`); `unparkQuery` the rest.
 *
 * Each key is judged once (`stuck`), not once per waiting row: asked per row,
 * a backlog of 100 rows in each of 200 keys that do move cost PostgreSQL 1.3 s
 * a sweep (8.6 s under load, the processor's own claims starved meanwhile).
 */
export const parkQuery = (
  db: Kysely<TxboxDatabase>,
  { consumer, waitedMs }: { readonly consumer: string; readonly waitedMs: number },
  passDead = false,
): CompiledQuery => {
  const goes = goesNow(passDead)
  return (
    db
      // The consumer's ordered keys with rows still to handle (inbox_ordered), each once.
      .with("keys", (qb) =>
        qb
          .selectFrom("inbox as o")
          .select(["o.consumer", "o.partition_key", "o.partition_epoch"])
          .distinct()
          .where("o.consumer", "=", consumer)
          .where("o.partition_seq", "is not", null)
          .where("o.status", "<>", sql.lit("processed"))
          .where("o.status", "=", pending),
      )
      // Materialized: else the planner joins it to every waiting row and asks once per row again.
      .with(
        (cte) => cte("stuck").materialized(),
        (qb) =>
          qb
            .selectFrom("keys as k")
            // How far the consumer got in the key: what a row that may go waits for at most.
            .leftJoin("inbox_cursors as c", (join) =>
              join
                .on("c.consumer", "=", consumer)
                .onRef("c.partition_key", "=", "k.partition_key")
                .onRef("c.epoch", "=", "k.partition_epoch"),
            )
            .select(["k.consumer", "k.partition_key", "k.partition_epoch"])
            // Only keys that cannot move: none of their rows may go now (the head is missing, or dead
            // under "block"). A key with a head that runs has its backlog go on in a moment.
            .where(({ not, exists, selectFrom }) =>
              not(
                exists(
                  selectFrom("inbox as h")
                    .select(sql.lit(1).as("one"))
                    .where(pendingOfKey("h", "k"))
                    .where("h.visible_at", "<>", PARKED)
                    .where((eb) => eb(waitsForOf("h"), "<=", eb.fn.coalesce("c.last_seq", sql<string>`0`))),
                ),
              ),
            ),
      )
      .updateTable("inbox as p")
      .set({ visible_at: PARKED })
      .from((sq) =>
        sq
          // The stuck keys' rows through inbox_ordered: no scan at all when no key is stuck.
          .selectFrom("stuck")
          .innerJoin("inbox as w", (join) => join.on(pendingOfKey("w", "stuck")))
          .select("w.message_id")
          .where("w.visible_at", "<=", now)
          .where("w.received_at", "<", sql<Date>`now() - ${waitedMs}::int * interval '1 millisecond'`)
          .where((eb) => eb.not(goes(eb)))
          .limit(sql.lit(PARK_AT_ONCE))
          .forUpdate(["w"])
          .skipLocked()
          .as("e"),
      )
      .where("p.consumer", "=", consumer)
      .whereRef("p.message_id", "=", "e.message_id")
      .compile()
  )
}

/**
 * Brings back every parked row of `consumer` that may go now: what the
 * handler's mark did not wake (a predecessor handled while the claim that
 * parked it had not committed, a dead one passed under "skip", a `dead
 * skip`). The inbox runs it every few seconds.
 */
export const unparkQuery = (
  db: Kysely<TxboxDatabase>,
  { consumer }: { readonly consumer: string },
  passDead = false,
): CompiledQuery =>
  db
    .updateTable("inbox as w")
    .set({ visible_at: now })
    .where("w.consumer", "=", consumer)
    .where("w.status", "=", pending)
    .where("w.visible_at", "=", PARKED)
    .where("w.partition_seq", "is not", null)
    .where(goesNow(passDead))
    .compile()

/**
 * The rows of `keys` (a JSON array of message ids): an index condition on the primary key. By the
 * token alone no index helps (`lock_token` has none), and as `IN (subquery)` the planner, sure the
 * token matches one row, scans the consumer's pending rows and joins.
 */
const claimedKeys = (keys: string) =>
  sql<boolean>`message_id = ANY (ARRAY(SELECT jsonb_array_elements_text(${keys}::text::jsonb)))`

/** The rows of `consumer` that `token` holds, handed back due now. */
const handBack = (db: Kysely<TxboxDatabase>, consumer: string, token: string) =>
  db
    .updateTable("inbox")
    .set({ lock_token: sql.lit(null), visible_at: now })
    .where("consumer", "=", consumer)
    .where("lock_token", "=", token)
    .where("status", "=", pending)

/** Hands every row of `consumer` that `token` holds back, due now (a claim given up on). */
export const releaseQuery = (
  db: Kysely<TxboxDatabase>,
  { consumer, token }: { readonly consumer: string; readonly token: string },
): CompiledQuery => handBack(db, consumer, token).compile()

/** Hands back the rows `keys` (a JSON array text) of `consumer` that `token` holds, due now: a claim's rows whose predecessor another claim holds. */
export const releaseSomeQuery = (
  db: Kysely<TxboxDatabase>,
  { consumer, token, keys }: { readonly consumer: string; readonly token: string; readonly keys: string },
): CompiledQuery => handBack(db, consumer, token).where(claimedKeys(keys)).compile()

/**
 * The NOTIFY channel of `consumer`'s pending rows, as migration 0011's trigger names it: computed by
 * the database, whose md5 the trigger takes (no md5 in every runtime the store runs on).
 */
export const wakeupChannelQuery = (
  db: Kysely<TxboxDatabase>,
  { schema, consumer }: { readonly schema: string; readonly consumer: string },
): CompiledQuery<{ channel: string }> =>
  db
    .selectNoFrom(
      sql<string>`'txbox_inbox_' || left(md5(${schema}::text || '.' || ${consumer}::text), 24)`.as("channel"),
    )
    .compile()

/**
 * Pushes the lease of every row of `consumer` that `token` still holds out to
 * now + `leaseMs`. SKIP LOCKED: a row whose handler's transaction holds it is
 * about to be settled anyway, and waiting for it would make the next
 * handlers wait on this statement in turn.
 */
export const extendQuery = (
  db: Kysely<TxboxDatabase>,
  {
    consumer,
    token,
    leaseMs,
    keys,
  }: {
    readonly consumer: string
    readonly token: string
    readonly leaseMs: number
    readonly keys: string | null
  },
): CompiledQuery =>
  db
    .with("held", (qb) =>
      qb
        .selectFrom("inbox")
        .select("message_id")
        .where(keys === null ? sql<boolean>`true` : claimedKeys(keys))
        .where("consumer", "=", consumer)
        .where("lock_token", "=", token)
        .where("status", "=", pending)
        .forUpdate()
        .skipLocked(),
    )
    .updateTable("inbox as i")
    .set({ visible_at: nowPlusMs(leaseMs) })
    .from("held")
    .where("i.consumer", "=", consumer)
    .whereRef("i.message_id", "=", "held.message_id")
    .compile()

/**
 * In a mark's statement: the parked rows of each key marked (`m`) that the
 * mark lets go, due now, so the processor's next claim finds them.
 */
// biome-ignore lint/suspicious/noExplicitAny: a query creator whose `with` list holds `m`
const unparkAfter = (qb: QueryCreator<any>) =>
  qb
    .updateTable("inbox as u")
    .set({ visible_at: now })
    .from("m")
    .where(pendingOfKey("u", "m"))
    .where("u.visible_at", "=", PARKED)
    .where(sql<boolean>`${waitsForOf("u")} <= m.partition_seq`)

/** Marks a claimed row processed inside the handler's transaction, so the effect and the mark commit together. */
export const markProcessedQuery = (
  db: Kysely<TxboxDatabase>,
  {
    consumer,
    key,
    token,
    attempts,
    bound,
  }: {
    readonly consumer: string
    readonly key: string
    readonly token: string
    readonly attempts: number
    readonly bound: string | null
  },
): CompiledQuery<{ marked: string | number | bigint }> =>
  db
    .with("m", (qb) =>
      qb
        .updateTable("inbox")
        .set({
          status: sql.lit("processed" as const),
          processed_at: now,
          attempts,
          lock_token: sql.lit(null),
        })
        .where("consumer", "=", consumer)
        .where("message_id", "=", key)
        // The token alone says the row is still claimed and pending: every way out of pending
        // clears it. No `status = 'pending'` here on purpose: with it the WHERE matches the partial
        // `inbox_due` index's predicate, and while the table's statistics do not yet know about a
        // backlog the planner walks that index — every pending row of the consumer, per row marked
        // (4.4 ms instead of 0.12 ms in the ordered bench; bench/README.md "ordered.ts").
        .where("lock_token", "=", token)
        .returning(["consumer", "partition_key", "partition_epoch", "partition_seq"]),
    )
    // An ordered row moves its key's cursor in the same statement (no extra round trip): the
    // key's next row becomes claimable when the handler's transaction commits. Never backwards
    // within an epoch (a redriven row that was already passed); a newer epoch replaces it.
    .with("c", (qb) => upsertCursors(qb, { marked: "every" }))
    .with("woken", (qb) => unparkAfter(qb))
    .selectFrom("m")
    .select((eb) => [eb.fn.countAll().as("marked"), eb.fn.max(boundStatements(bound)).as("bound")])
    .compile()

/** `markProcessedAll`'s rows parameter: a JSON array of `{ key, attempts }`. */
export const markedRows = (
  rows: ReadonlyArray<{ readonly key: string; readonly attempts: number }>,
): string => JSON.stringify(rows.map(({ key, attempts }) => ({ key, attempts })))

/**
 * `markProcessedQuery` for several rows of one claim: the rows marked, and
 * each ordered key's cursor moved to the furthest of its rows, in one
 * statement inside the handlers' transaction.
 */
export const markProcessedAllQuery = (
  db: Kysely<TxboxDatabase>,
  {
    consumer,
    token,
    rows,
    bound,
  }: {
    readonly consumer: string
    readonly token: string
    readonly rows: string
    readonly bound: string | null
  },
): CompiledQuery<{ message_id: string }> => {
  const u = sql<{ key: string; attempts: number }>`jsonb_to_recordset(${rows}::text::jsonb)`.as<"u">(
    sql`u(key text, attempts int)`,
  )
  return (
    db
      .with("m", (qb) =>
        qb
          .updateTable("inbox as i")
          .from(u)
          .set((eb) => ({
            status: sql.lit("processed" as const),
            processed_at: now,
            attempts: eb.ref("u.attempts"),
            lock_token: sql.lit(null),
          }))
          .where("i.consumer", "=", consumer)
          .whereRef("i.message_id", "=", "u.key")
          // As in markProcessedQuery: the token alone, no status (the partial index trap).
          .where("i.lock_token", "=", token)
          .returning([
            "i.message_id",
            "i.consumer",
            "i.partition_key",
            "i.partition_epoch",
            "i.partition_seq",
          ]),
      )
      // One row per key (a redriven row may share a claim with its key's next): the furthest.
      .with("c", (qb) => upsertCursors(qb, { marked: "furthestPerKey" }))
      .with("woken", (qb) => unparkAfter(qb))
      .selectFrom("m")
      .select(["m.message_id", boundStatements(bound).as("bound")])
      .compile()
  )
}

/** `mark`'s one parameter: the failures as a JSON array of `MarkRecord`. */
export const markFailures = (marks: ReadonlyArray<InboxMark>): string =>
  // Failures only: a processed row is marked inside its handler's transaction.
  verdictsJson(
    marks.map(({ key, verdict }) => ({ id: key, verdict })),
    "processed",
  )

/** Records a claim's failures (`markFailures`) in one statement: retry later or dead. Only rows `token` still holds change. */
export const markQuery = (
  db: Kysely<TxboxDatabase>,
  {
    consumer,
    token,
    failures,
  }: { readonly consumer: string; readonly token: string; readonly failures: string },
): CompiledQuery<{ marked: string }> => {
  // One JSON text parameter, as in the outbox's mark; a column definition list Kysely cannot say.
  const u = sql<MarkRecord>`json_to_recordset(${failures}::text::json)`.as<"u">(
    sql`u(id text, status text, delay_ms bigint, inc int, error text)`,
  )
  return (
    db
      .with("d", (qb) =>
        qb
          .updateTable("inbox as i")
          .from(u)
          .set((eb) => ({
            status: eb.ref("u.status"),
            attempts: eb("i.attempts", "+", eb.ref("u.inc")),
            // A dead row's delay is 0: due now, which nothing claims (it is not pending).
            visible_at: nowPlusMs(eb.ref("u.delay_ms")),
            last_error: eb.ref("u.error"),
            lock_token: sql.lit(null),
          }))
          .where("i.consumer", "=", consumer)
          .whereRef("i.message_id", "=", "u.id")
          .where("i.lock_token", "=", token)
          .where("i.status", "=", pending)
          .returning(["i.consumer", "i.partition_key", "i.partition_epoch", "i.partition_seq", "i.status"]),
      )
      // A key's row gone dead may let its parked successors go (under onOrderedDead "skip"); under
      // "block" the next claim parks them again. Retried rows wake nobody.
      .with("m", (qb) =>
        qb
          .selectFrom("d")
          .selectAll()
          .where("d.status", "=", sql.lit("dead"))
          .where("d.partition_seq", "is not", null),
      )
      .with("woken", (qb) => unparkAfter(qb))
      .selectFrom("d")
      .select((eb) => eb.fn.countAll<string>().as("marked"))
      .compile()
  )
}

/**
 * Whether `consumer` has a pending row due now within the look-back: one probe of `inbox_due`.
 * The claim is a recursive statement of 3.5 KB that PostgreSQL plans anew on every call (1.6 ms a
 * plan in bench/cost.ts's pg_stat_statements); an idempotent inbox's processor rarely has rows (only
 * ordered messages and stored ones), yet its fallback poll claimed every second in every process.
 */
export const dueQuery = (
  db: Kysely<TxboxDatabase>,
  { consumer, sinceMs }: { readonly consumer: string; readonly sinceMs: number },
): CompiledQuery<{ due: boolean }> =>
  db
    .selectNoFrom((eb) =>
      eb
        .exists(
          eb
            .selectFrom("inbox as w")
            .select(sql.lit(1).as("one"))
            .where("w.consumer", "=", consumer)
            .where("w.status", "=", pending)
            .where("w.visible_at", "<=", now)
            .where("w.visible_at", ">=", nowMinusMs(sinceMs)),
        )
        .as("due"),
    )
    .compile()

/**
 * Seconds until `consumer`'s earliest pending row comes due (negative: one is due; null: none is
 * pending): the first entry of `inbox_due` for the consumer, like the outbox's `nextDueQuery`.
 */
export const nextDueQuery = (
  db: Kysely<TxboxDatabase>,
  { consumer }: { readonly consumer: string },
): CompiledQuery<{ due: number | string | null }> =>
  db
    .selectFrom("inbox as w")
    // extract(epoch FROM …) is no function call Kysely can build.
    .select((eb) =>
      sql<number | string | null>`extract(epoch FROM ${eb.fn.min("w.visible_at")} - now())`.as("due"),
    )
    .where("w.consumer", "=", consumer)
    .where("w.status", "=", pending)
    .compile()

/** Per consumer, how far back its claims look (claimWindow.ts, as the relay's). */
const claimWindows = () => {
  const windows = new Map<string, ClaimWindow>()
  return (consumer: string): ClaimWindow => {
    const known = windows.get(consumer)
    if (known !== undefined) return known
    const window = makeClaimWindow()
    windows.set(consumer, window)
    return window
  }
}

const claimStatements = (db: Kysely<TxboxDatabase>): InboxStatements["claim"] => {
  const one = (passDead: boolean, chains: boolean) =>
    prepare(db, (db, p: Parameters<typeof claimQuery>[1]) => claimQuery(db, p, passDead, chains), {
      consumer: "\0consumer",
      limit: -1,
      token: "\0token",
      leaseMs: -2,
      sinceMs: -3,
    })
  return {
    block: { heads: one(false, false), chains: one(false, true) },
    skip: { heads: one(true, false), chains: one(true, true) },
  }
}

/** The statements of one store, each compiled once for its schema. */
export interface InboxStatements {
  readonly insertProcessed: (params: ProcessedValues) => CompiledQuery<{ message_id: string }>
  readonly insertPending: (params: { readonly rows: string }) => CompiledQuery<{ message_id: string }>
  readonly insertStandIns: (params: { readonly rows: string }) => CompiledQuery<{ message_id: string }>
  readonly insertDead: (params: { readonly rows: string }) => CompiledQuery<{ message_id: string }>
  /** Per `onOrderedDead` (under "skip" dead rows do not hold their key), heads only or with their chains. */
  readonly claim: Record<
    OrderedDeadPolicy,
    Record<"heads" | "chains", (params: Parameters<typeof claimQuery>[1]) => CompiledQuery<ClaimedRow>>
  >
  /** Before a claim that follows an empty one: whether there is anything to claim at all. */
  readonly due: (params: Parameters<typeof dueQuery>[1]) => CompiledQuery<{ due: boolean }>
  /** Before an idle processor's long wait: when the next pending row comes due. */
  readonly nextDue: (
    params: Parameters<typeof nextDueQuery>[1],
  ) => CompiledQuery<{ due: number | string | null }>
  readonly release: (params: Parameters<typeof releaseQuery>[1]) => CompiledQuery
  readonly releaseSome: (params: Parameters<typeof releaseSomeQuery>[1]) => CompiledQuery
  readonly park: (params: Parameters<typeof parkQuery>[1]) => CompiledQuery
  readonly parkPassingDead: (params: Parameters<typeof parkQuery>[1]) => CompiledQuery
  readonly unpark: (params: Parameters<typeof unparkQuery>[1]) => CompiledQuery
  readonly unparkPassingDead: (params: Parameters<typeof unparkQuery>[1]) => CompiledQuery
  readonly extend: (params: {
    readonly consumer: string
    readonly token: string
    readonly leaseMs: number
    readonly keys: string
  }) => CompiledQuery
  /** By the token alone: for a claim whose keys the store no longer knows. */
  readonly extendByToken: (params: {
    readonly consumer: string
    readonly token: string
    readonly leaseMs: number
  }) => CompiledQuery
  readonly wakeupChannel: (
    params: Parameters<typeof wakeupChannelQuery>[1],
  ) => CompiledQuery<{ channel: string }>
  readonly markProcessed: (
    params: Parameters<typeof markProcessedQuery>[1],
  ) => CompiledQuery<{ marked: string | number | bigint }>
  readonly insertProcessedAll: (params: {
    readonly rows: string
    readonly bound: string | null
  }) => CompiledQuery<{ message_id: string }>
  readonly markProcessedAll: (
    params: Parameters<typeof markProcessedAllQuery>[1],
  ) => CompiledQuery<{ message_id: string }>
  readonly mark: (params: Parameters<typeof markQuery>[1]) => CompiledQuery<{ marked: string }>
}

/** Compiles every statement once for `db` (bound to txbox's schema). */
export const statements = (db: Kysely<TxboxDatabase>): InboxStatements => ({
  insertProcessed: prepare(db, insertProcessedQuery, {
    key: "\0key",
    consumer: "\0consumer",
    type: "\0type",
    version: -1,
    partitionKey: "\0partitionKey",
    tenantId: "\0tenantId",
    attempts: -2,
    bound: "\0bound",
  }),
  insertPending: prepare(db, (db, p: { readonly rows: string }) => insertRowsQuery(db, "pending", p), {
    rows: "\0rows",
  }),
  insertStandIns: prepare(db, (db, p: { readonly rows: string }) => insertRowsQuery(db, "pending", p, true), {
    rows: "\0rows",
  }),
  insertDead: prepare(db, (db, p: { readonly rows: string }) => insertRowsQuery(db, "dead", p), {
    rows: "\0rows",
  }),
  claim: claimStatements(db),
  due: prepare(db, dueQuery, { consumer: "\0consumer", sinceMs: -1 }),
  nextDue: prepare(db, nextDueQuery, { consumer: "\0consumer" }),
  release: prepare(db, releaseQuery, { consumer: "\0consumer", token: "\0token" }),
  releaseSome: prepare(db, releaseSomeQuery, { consumer: "\0consumer", token: "\0token", keys: "\0keys" }),
  park: prepare(db, parkQuery, { consumer: "\0consumer", waitedMs: -1 }),
  parkPassingDead: prepare(db, (db, p: Parameters<typeof parkQuery>[1]) => parkQuery(db, p, true), {
    consumer: "\0consumer",
    waitedMs: -1,
  }),
  unpark: prepare(db, unparkQuery, { consumer: "\0consumer" }),
  unparkPassingDead: prepare(db, (db, p: Parameters<typeof unparkQuery>[1]) => unparkQuery(db, p, true), {
    consumer: "\0consumer",
  }),
  extend: prepare(db, extendQuery, { consumer: "\0consumer", token: "\0token", leaseMs: -1, keys: "\0keys" }),
  extendByToken: prepare(
    db,
    (db, p: { readonly consumer: string; readonly token: string; readonly leaseMs: number }) =>
      extendQuery(db, { ...p, keys: null }),
    { consumer: "\0consumer", token: "\0token", leaseMs: -1 },
  ),
  wakeupChannel: prepare(db, wakeupChannelQuery, { schema: "\0schema", consumer: "\0consumer" }),
  markProcessed: prepare(db, markProcessedQuery, {
    consumer: "\0consumer",
    key: "\0key",
    token: "\0token",
    attempts: -1,
    bound: "\0bound",
  }),
  insertProcessedAll: prepare(
    db,
    (db, p: { readonly rows: string; readonly bound: string | null }) => insertRowsQuery(db, "processed", p),
    { rows: "\0rows", bound: "\0bound" },
  ),
  markProcessedAll: prepare(db, markProcessedAllQuery, {
    consumer: "\0consumer",
    token: "\0token",
    rows: "\0rows",
    bound: "\0bound",
  }),
  mark: prepare(db, markQuery, { consumer: "\0consumer", token: "\0token", failures: "\0failures" }),
})

/** The port's statements inside a handler's transaction, each bounded by the handler's time when given. */
const inTransaction = (
  q: InboxStatements,
  // biome-ignore lint/suspicious/noExplicitAny: the service's own database type, as the port hands it out
  trx: Transaction<any>,
  options: InboxTransactionOptions = {},
): InboxTransaction => {
  const ms = options.statementTimeoutMs
  const bound = ms === undefined ? null : String(Math.ceil(ms))
  return {
    trx,
    insertProcessed: (row) =>
      tryStore("InboxStore.insertProcessed", () =>
        trx.executeQuery(q.insertProcessed({ ...row, bound })).then((r) => r.rows.length === 1),
      ),
    insertProcessedAll: (rows) => {
      // The first of each key goes in; a later one of the same key is a duplicate of it.
      const firsts = new Map<string, InboxRow>()
      for (const row of rows) if (!firsts.has(row.key)) firsts.set(row.key, row)
      return tryStore("InboxStore.insertProcessedAll", () =>
        trx
          .executeQuery(q.insertProcessedAll({ rows: storedRows([...firsts.values()].map(slim)), bound }))
          .then((r) => {
            const fresh = new Set(r.rows.map((x) => x.message_id))
            return rows.map((row) => firsts.get(row.key) === row && fresh.has(row.key))
          }),
      )
    },
    markProcessedAll: (consumer, token, rows) =>
      tryStore("InboxStore.markProcessedAll", () =>
        trx.executeQuery(q.markProcessedAll({ consumer, token, rows: markedRows(rows), bound })).then((r) => {
          const marked = new Set(r.rows.map((x) => x.message_id))
          return rows.map((row) => marked.has(row.key))
        }),
      ),
    markProcessed: (consumer, key, token, attempts) =>
      tryStore("InboxStore.markProcessed", () =>
        trx
          .executeQuery(q.markProcessed({ consumer, key, token, attempts, bound }))
          .then((r) => Number(r.rows[0]?.marked ?? 0) === 1),
      ),
  }
}

/** Records the consumer's policy and its queue's binding patterns; answers every pattern's bind time. */
const recordBindings = async (
  db: Kysely<TxboxDatabase>,
  consumer: string,
  patterns: ReadonlyArray<string>,
  onOrderedDead: OrderedDeadPolicy,
): Promise<ReadonlyArray<RouteBinding>> => {
  await db
    .insertInto("inbox_consumers")
    .values({ consumer, on_ordered_dead: onOrderedDead })
    .onConflict((oc) =>
      oc.column("consumer").doUpdateSet({ on_ordered_dead: onOrderedDead, updated_at: sql<Date>`now()` }),
    )
    .execute()
  const query = bindingsQuery(db, { consumer, patterns: JSON.stringify(patterns) })
  // Another process recording the same pattern at the same moment makes this INSERT wait for
  // it and then skip the row, which this statement's snapshot does not show yet: the next does.
  for (let tries = 0; ; tries++) {
    const rows = (await db.executeQuery(query)).rows
    const found = new Set(rows.map((b) => b.pattern))
    if (patterns.every((p) => found.has(p)) || tries === 2)
      return rows.map((b) => ({ pattern: b.pattern, boundAtMs: Number(b.bound_at_ms) }))
  }
}

/** Claims remembered at most; a processor has a claim or two in flight. */
const MAX_CLAIMS = 1024

/**
 * The store's `claim`: per consumer, its look-back window and whether its last claim found nothing;
 * `claimed` keeps each claim's ordered rows for its heartbeat.
 */
const makeClaim = (
  db: Kysely<TxboxDatabase>,
  q: InboxStatements,
  claimed: Map<string, ReadonlyArray<InboxRow>>,
) => {
  const windowOf = claimWindows()
  // Consumers whose last claim found nothing: their next claim asks `due` first.
  const foundNothing = new Set<string>()
  return Effect.fnUntraced(function* (
    consumer: string,
    limit: number,
    leaseMs: number,
    onDead: OrderedDeadPolicy = "block",
    chains = false,
  ) {
    const token = uuidv7()
    const statement = q.claim[onDead][chains ? "chains" : "heads"]
    const { sinceMs, took } = startClaim(windowOf(consumer), limit)
    // After a claim that found nothing (idle, the fallback poll), a probe first: the claim itself
    // is planned anew on every call. Rows are then rare; a claim that finds some skips the probe next.
    if (foundNothing.has(consumer)) {
      const due = yield* tryStore("InboxStore.claim", () =>
        db.executeQuery(q.due({ consumer, sinceMs })).then((r) => r.rows[0]?.due === true),
      )
      if (!due) {
        took(0)
        return { token, rows: [] } satisfies Claim<InboxRow>
      }
    }
    const rows = yield* tryStoreUndoable(
      "InboxStore.claim",
      () =>
        db.executeQuery(statement({ consumer, limit, token, leaseMs, sinceMs })).then((r) => {
          took(r.rows.length)
          return r.rows
        }),
      // Given up on (interrupted, e.g. timed out), the statement may still run
      // later: hand whatever it claims straight back rather than leave it to the lease.
      (pending) => {
        pending
          .then((rows) => (rows.length > 0 ? db.executeQuery(q.release({ consumer, token })) : undefined))
          .catch(() => undefined)
      },
    )
    // A chained row whose predecessor SKIP LOCKED passed (another claim holds it) must not run
    // before it: hand it back now.
    if (rows.length === 0) foundNothing.add(consumer)
    else foundNothing.delete(consumer)
    const { ordered, unchained } = chainOrder(
      rows.map((r) => ({ ...toRow(r), depth: r.chain_depth })),
      (r) => r.depth === 1,
    )
    if (unchained.length > 0) {
      const keys = JSON.stringify(unchained.map((r) => r.key))
      yield* tryStore("InboxStore.claim", () => db.executeQuery(q.releaseSome({ consumer, token, keys })))
    }
    if (ordered.length > 0) {
      // Claims that never reach a mark (a failed cycle) must not pile up.
      if (claimed.size >= MAX_CLAIMS) claimed.clear()
      claimed.set(token, ordered)
    }
    return { token, rows: ordered.map(({ depth: _, ...row }) => row) } satisfies Claim<InboxRow>
  })
}

export const make: Effect.Effect<InboxStoreShape, never, Database> = Effect.gen(function* () {
  const database = yield* Database
  // Bound to txbox's schema once. Statements are compiled here and run on
  // whichever executor they belong to (the pool, or a handler's transaction).
  const db = (database.db as Kysely<TxboxDatabase>).withSchema(database.schema)
  const q = statements(db)

  const insertRows = (
    operation: string,
    statement: InboxStatements["insertPending"],
    rows: ReadonlyArray<InboxRow>,
  ) =>
    rows.length === 0
      ? Effect.succeed(0)
      : tryStore(operation, () =>
          db.executeQuery(statement({ rows: storedRows(rows) })).then((r) => r.rows.length),
        )

  // Per claim in flight: its rows, so a heartbeat finds them on the primary key (their keys are
  // written out only then, never on the hot path).
  const claimed = new Map<string, ReadonlyArray<InboxRow>>()
  const extendStatement = (consumer: string, token: string, leaseMs: number) => {
    const rows = claimed.get(token)
    return rows === undefined
      ? q.extendByToken({ consumer, token, leaseMs })
      : q.extend({ consumer, token, leaseMs, keys: JSON.stringify(rows.map((row) => row.key)) })
  }

  const claim = makeClaim(db, q, claimed)

  return {
    transaction: (use, options) =>
      withTransaction(database.db, (trx) => use(inTransaction(q, trx, options)), {
        commitRefusesAborted: database.commitRefusesAborted === true,
      }),
    insertPending: (rows) =>
      rows.length === 0
        ? Effect.succeed(0)
        : tryStore("InboxStore.insertPending", async () => {
            const stored = await db.executeQuery(q.insertPending({ rows: storedRows(rows) }))
            const inserted = new Set(stored.rows.map((r) => r.message_id))
            const standIns = standInsFor(rows, inserted)
            if (standIns.length === 0) return stored.rows.length
            // Rare (a resend of a keyed event under a dedupeKey): a second statement, not a second path in the first.
            const more = await db.executeQuery(q.insertStandIns({ rows: storedRows(standIns) }))
            return stored.rows.length + more.rows.length
          }),
    insertDead: (rows) => insertRows("InboxStore.insertDead", q.insertDead, rows),
    claim,
    extend: (consumer, token, leaseMs) =>
      tryStore("InboxStore.extend", () =>
        db.executeQuery(extendStatement(consumer, token, leaseMs)).then(affected),
      ),
    mark: (consumer, token, marks) => {
      // The claim's cycle is settling (after its heartbeat): its keys are no longer needed.
      claimed.delete(token)
      return marks.length === 0
        ? Effect.succeed(0)
        : tryStore("InboxStore.mark", () =>
            db
              .executeQuery(q.mark({ consumer, token, failures: markFailures(marks) }))
              .then((r) => Number(r.rows[0]?.marked ?? 0)),
          )
    },
    sweep: (consumer, { onDead = "block", waitedMs = 2_000 } = {}) =>
      tryStore("InboxStore.sweep", async () => {
        const skip = onDead === "skip"
        const back = affected(
          await db.executeQuery(skip ? q.unparkPassingDead({ consumer }) : q.unpark({ consumer })),
        )
        await db.executeQuery(
          skip ? q.parkPassingDead({ consumer, waitedMs }) : q.park({ consumer, waitedMs }),
        )
        return back
      }),
    bindings: (consumer, patterns, onOrderedDead = "block") =>
      tryStore("InboxStore.bindings", () => recordBindings(db, consumer, patterns, onOrderedDead)),
    keepPartitions: (options) => partitions.keepInboxPartitions(database, options),
    nextDueMs: (consumer) =>
      tryStore("InboxStore.nextDue", async () => {
        // numeric comes back as a string from some drivers.
        const due = (await db.executeQuery(q.nextDue({ consumer }))).rows[0]?.due
        return due === null || due === undefined ? undefined : Number(due) * 1000
      }),
    // The trigger's channel (migration 0011), named by the database: its md5 is the one the trigger takes.
    wakeups: (consumer, onWake, onHearing) =>
      Effect.flatMap(
        tryStore("InboxStore.wakeups", async () => {
          const result = await db.executeQuery(q.wakeupChannel({ schema: database.schema, consumer }))
          return result.rows[0]!.channel
        }),
        (channel) => database.listen(channel, onWake, onHearing),
      ),
  } satisfies InboxStoreShape
})

export const layer: Layer.Layer<InboxStore, never, Database> = Layer.effect(InboxStore, make)
