/**
 * The `OutboxStore` port over SQL (PostgreSQL or PGlite, any Kysely driver):
 * one statement per claim, per batch of marks, per release. That is the whole
 * performance story of the relay's database side, so every statement below
 * keeps the shape of the hand-written SQL it replaced (bench/builder.ts keeps those texts).
 *
 * Written with Kysely's typed builder over `TxboxDatabase`, so a misspelt
 * column or status fails to compile; `sql` fragments only where the builder
 * has no words, each saying why. Three rules hold throughout:
 * - `status = 'pending'` is a literal (`sql.lit`), never a parameter: the
 *   claim's index is partial (`WHERE status = 'pending'`), and a generic plan
 *   (postgres.js prepares statements) cannot prove a parameter matches it.
 *   Bound, the claim's generic plan is a sequential scan and a sort.
 * - JSON goes in as text cast in SQL (`::text::json`): postgres.js and PGlite
 *   serialise a parameter by the type the server infers, so a string bound
 *   straight to a json parameter would be encoded a second time.
 * - Each statement is compiled once per store (`prepare`), not per call.
 */
import { Effect, Layer, type Scope } from "effect"
import {
  CompiledQuery,
  createQueryId,
  type ExpressionBuilder,
  type Kysely,
  type SelectQueryBuilder,
  sql,
} from "kysely"
import { quoteIdent } from "../../core/identifier.ts"
import { uuidv7 } from "../../core/uuid.ts"
import type { StoreError } from "../../Errors.ts"
import { Database, type DatabaseShape, notifyChannel } from "../../ports/Database.ts"
import {
  type OutboxClaim,
  type OutboxMark,
  type OutboxMessage,
  type OutboxShard,
  OutboxStore,
  type OutboxStoreShape,
} from "../../ports/OutboxStore.ts"
import type { TxboxDatabase } from "../../ports/tables.ts"
import { makeClaimWindow, startClaim } from "./claimWindow.ts"
import { tryStore, tryStoreUndoable } from "./errors.ts"
import { affected, markedAt, now, nowMinusMs, nowPlusMs, pending, verdictsJson } from "./fragments.ts"
import { makeHeldClaims } from "./heldClaims.ts"
import * as opsSql from "./operations.ts"
import * as partitions from "./partitions.ts"
import { prepare } from "./prepared.ts"
import { rawStatement } from "./rawStatement.ts"
import { inShard, type ShardParams, shardBinder } from "./shard.ts"

/** A claimed row as the database returns it. */
export interface ClaimedRow {
  readonly id: string
  readonly type: string
  readonly version: number
  readonly payload: string
  readonly headers: Record<string, string>
  readonly routing_key: string | null
  readonly partition_key: string | null
  readonly partition_epoch: number | null
  readonly partition_seq: number | null
  readonly tenant_id: string | null
  readonly occurred_at: Date
  readonly attempts: number
  /** The lease the claim stamped (`visible_at`), as text: a Date would drop the microseconds. */
  readonly lease_until: string
}

/** One verdict as it travels in `mark`'s JSON parameter. */
interface MarkRecord {
  readonly id: string
  readonly status: "sent" | "pending" | "dead"
  readonly delay_ms: number
  readonly inc: number
  readonly error: string | null
}

/** What a claim reads of each row (`ClaimedRow`), the outbox aliased `o`: a lease's and a held claim's. */
const claimedColumns = (eb: ExpressionBuilder<{ o: TxboxDatabase["outbox"] }, "o">) =>
  [
    "o.id",
    "o.type",
    "o.version",
    // The payload as JSON text, so the relay never parses and re-serialises it.
    eb.cast<string>("o.payload", "text").as("payload"),
    "o.headers",
    "o.routing_key",
    "o.partition_key",
    // bigint comes back as a string from every driver; float8 is exact up to 2^53.
    eb.cast<number | null>("o.partition_epoch", "double precision").as("partition_epoch"),
    eb.cast<number | null>("o.partition_seq", "double precision").as("partition_seq"),
    "o.tenant_id",
    eb.cast<string>("o.visible_at", "text").as("lease_until"),
    "o.occurred_at",
    "o.attempts",
  ] as const

/**
 * The last row any relay marked sent: the end of the `outbox_sent` index, one probe. Its
 * `lock_token` is the token it was claimed under, which names the relay process (its rank).
 */
const lastSent = (from: SelectQueryBuilder<TxboxDatabase, "outbox", object>) =>
  from
    .select(["published_at", "lock_token"])
    // A literal status, so the partial index's end answers.
    .where("status", "=", sql.lit("sent"))
    .orderBy("published_at", "desc")
    // A literal: a parameter would make `prepare` compile the statement on every call.
    .limit(sql.lit(1))

/** What a claim reports of `lastSent` (aliased `last`): how long before the statement, and its token. */
const lastPublishedColumns = [
  // The statement's time, not the transaction's: a held claim's probe may run in the last claim's
  // transaction, ahead of its mark (heldClaims.ts).
  sql<
    number | null
  >`(extract(epoch FROM statement_timestamp() - last.published_at) * 1000)::double precision`.as(
    "last_published_ago_ms",
  ),
  sql<string | null>`last.lock_token::text`.as("last_token"),
] as const

/**
 * A claim's answer: the rows it took, each with what it saw of the last row
 * any relay marked sent (how long before the claim, and that claim's token);
 * when it took none, one row of nulls but those.
 */
export type ClaimAnswer = (ClaimedRow & LastPublishedColumns) | ({ readonly id: null } & LastPublishedColumns)

export interface LastPublishedColumns {
  readonly last_published_ago_ms: number | null
  readonly last_token: string | null
}

/**
 * Claims up to `limit` due rows: locks them with SKIP LOCKED (other relays take
 * the next rows instead of waiting), stamps them with `token` and pushes
 * `visible_at` out by the lease. Autocommit, so no transaction stays open while
 * the batch is published; a relay that dies leaves rows that come due again
 * when the lease ends.
 *
 * It also reads the last row any relay marked sent (the end of the
 * `outbox_sent` index: one probe), joined so that a claim that takes nothing
 * still answers: when, and under which claim's token (`OutboxClaim.lastPublished`).
 */
export const claimQuery = (
  db: Kysely<TxboxDatabase>,
  {
    limit,
    token,
    leaseMs,
    sinceMs,
    shard,
  }: {
    readonly limit: number
    readonly token: string
    readonly leaseMs: number
    readonly sinceMs: number
    readonly shard?: ShardParams | undefined
  },
): CompiledQuery<ClaimAnswer> =>
  db
    .with("due", (qb) =>
      qb
        .selectFrom("outbox")
        .select("id")
        .where("status", "=", pending)
        .where("visible_at", "<=", now)
        // claimWindow.ts: how far back this claim looks.
        .where("visible_at", ">=", nowMinusMs(sinceMs))
        .$if(shard !== undefined, (qb) => qb.where(inShard(shard, "")))
        .orderBy("visible_at")
        .limit(limit)
        .forUpdate()
        .skipLocked(),
    )
    .with("claimed", (qb) =>
      qb
        .updateTable("outbox as o")
        .set({ lock_token: token, visible_at: nowPlusMs(leaseMs) })
        .from("due")
        .whereRef("o.id", "=", "due.id")
        .returning(claimedColumns),
    )
    // One row to hang the rest on: a claim that took nothing still answers the last publish.
    .selectFrom(sql<{ one: number }>`(SELECT 1 AS one)`.as("base"))
    .leftJoinLateral(
      (eb) => lastSent(eb.selectFrom("outbox")).as("last"),
      (join) => join.onTrue(),
    )
    .leftJoin("claimed", (join) => join.onTrue())
    .selectAll("claimed")
    .select(lastPublishedColumns)
    .compile() as CompiledQuery<ClaimAnswer>

/** `mark`'s one parameter: the verdicts as a JSON array of `MarkRecord`. */
export const markVerdicts = (marks: ReadonlyArray<OutboxMark>): string => verdictsJson(marks, "sent")

/**
 * Records a whole batch's verdicts (`markVerdicts`) in one statement. Rows are
 * matched on the claim's token as well as the id: if this relay's lease ran out
 * and another relay claimed the row, the mark changes nothing (the count tells).
 */
export const markQuery = (
  db: Kysely<TxboxDatabase>,
  { token, verdicts }: { readonly token: string | null; readonly verdicts: string },
): CompiledQuery => {
  // One JSON text parameter: every driver (postgres.js, node-postgres, PGlite)
  // binds a string the same way, which typed arrays for UNNEST do not
  // guarantee. Kysely cannot say a function's column definition list.
  const u = sql<MarkRecord>`json_to_recordset(${verdicts}::text::json)`.as<"u">(
    sql`u(id uuid, status text, delay_ms bigint, inc int, error text)`,
  )
  return (
    db
      .updateTable("outbox as o")
      .from(u)
      .set((eb) => ({
        status: eb.ref("u.status"),
        attempts: eb("o.attempts", "+", eb.ref("u.inc")),
        visible_at: eb
          .case()
          .when("u.status", "=", pending)
          .then(nowPlusMs(eb.ref("u.delay_ms")))
          .else(eb.ref("o.visible_at"))
          .end(),
        published_at: eb
          .case()
          .when("u.status", "=", sql.lit("sent" as const))
          .then(markedAt)
          .else(eb.ref("o.published_at"))
          .end(),
        // Done carries no error: the last one stays.
        last_error: eb.fn.coalesce("u.error", "o.last_error"),
        // A sent row keeps its claim's token: it names the relay process that published
        // (migration 0020's `outbox_last_published`). Any other is free again.
        lock_token: eb
          .case()
          .when("u.status", "=", sql.lit("sent" as const))
          .then(eb.ref("o.lock_token"))
          .else(sql.lit(null))
          .end(),
      }))
      .whereRef("o.id", "=", "u.id")
      // A held claim's rows carry no token: its transaction's row locks hold them.
      .$if(token !== null, (qb) => qb.where("o.lock_token", "=", token!))
      .where("o.status", "=", pending)
      .compile()
  )
}

/**
 * Claims up to `limit` due rows in the caller's transaction and holds them there: row locks
 * (SKIP LOCKED, so other relays take the next rows), no write. The transaction's
 * `idle_in_transaction_session_timeout` becomes `idleMs` (set in the same statement, no round
 * trip of its own): a relay stuck longer than that between two statements is cut off by the
 * server, which hands its rows back.
 */
export const claimHeldQuery = (
  db: Kysely<TxboxDatabase>,
  {
    limit,
    idleMs,
    sinceMs,
    shard,
  }: {
    readonly limit: number
    readonly idleMs: string
    readonly sinceMs: number
    readonly shard?: ShardParams | undefined
  },
): CompiledQuery<ClaimedRow> =>
  db
    .selectFrom([
      "outbox as o",
      // A one-row relation joined to every row: set_config runs once, before the scan.
      sql<{ set: string }>`(SELECT set_config('idle_in_transaction_session_timeout', ${idleMs}, true))`.as(
        "lease",
      ),
    ])
    .select(claimedColumns)
    .where("o.status", "=", pending)
    .where("o.visible_at", "<=", now)
    // claimWindow.ts: how far back this claim looks.
    .where("o.visible_at", ">=", nowMinusMs(sinceMs))
    .$if(shard !== undefined, (qb) => qb.where(inShard(shard, "o.")))
    .orderBy("o.visible_at")
    .limit(limit)
    .forUpdate("o")
    .skipLocked()
    .compile()

/**
 * Marks a whole batch sent when every row of it was: no per-row parameter,
 * and the rows are found on the `outbox_due` index by the one `visible_at` the
 * claim stamped on all of them (the sequel article's one UPDATE per message,
 * instead of a join with the verdicts). A row whose lease was extended since
 * has another `visible_at` and is left to the per-row mark.
 */
export const markAllSentQuery = (
  db: Kysely<TxboxDatabase>,
  { token, leaseUntil }: { readonly token: string; readonly leaseUntil: string },
): CompiledQuery =>
  db
    .updateTable("outbox")
    // The token stays: it names the relay process that published (migration 0020's `outbox_last_published`).
    .set({ status: sql.lit("sent"), published_at: markedAt })
    .where("status", "=", pending)
    // Bound as text: postgres.js would parse a timestamptz parameter into a Date, dropping microseconds.
    .where("visible_at", "=", sql<Date>`${leaseUntil}::text::timestamptz`)
    .where("lock_token", "=", token)
    .compile()

/**
 * The rows of `ids` (a JSON array of the claim's ids): found on the primary key. By the token alone
 * no index helps (`lock_token` has none), and every heartbeat would read the whole pending backlog.
 * `null`: the store no longer knows the claim's ids, so by the token alone.
 */
const claimedRows = (ids: string | null) =>
  ids === null
    ? sql<boolean>`true`
    : // An array, not IN (subquery): the planner, sure `lock_token = …` matches one row, would scan
      // the table and join; `id = ANY(array)` is an index condition on the primary key.
      sql<boolean>`id = ANY (ARRAY(SELECT value::uuid FROM json_array_elements_text(${ids}::text::json)))`

/** Hands every row `token` holds back, due now. */
export const releaseQuery = (
  db: Kysely<TxboxDatabase>,
  { token, ids }: { readonly token: string; readonly ids: string | null },
): CompiledQuery =>
  db
    .updateTable("outbox")
    .set({ lock_token: sql.lit(null), visible_at: now })
    .where(claimedRows(ids))
    .where("lock_token", "=", token)
    .where("status", "=", pending)
    .compile()

/** Pushes the lease of every row `token` still holds out to now + `leaseMs`. */
export const extendQuery = (
  db: Kysely<TxboxDatabase>,
  { token, leaseMs, ids }: { readonly token: string; readonly leaseMs: number; readonly ids: string | null },
): CompiledQuery =>
  db
    .updateTable("outbox")
    .set({ visible_at: nowPlusMs(leaseMs) })
    .where(claimedRows(ids))
    .where("lock_token", "=", token)
    .where("status", "=", pending)
    .compile()

/** The age of the oldest due pending row: an index-first-entry read on the partial index. */
export const lagQuery = (db: Kysely<TxboxDatabase>): CompiledQuery<{ lag: number | string | null }> =>
  db
    .selectFrom("outbox")
    // extract(epoch FROM …) is no function call Kysely can build.
    .select((eb) =>
      sql<number | string | null>`extract(epoch FROM now() - ${eb.fn.min("visible_at")})`.as("lag"),
    )
    .where("status", "=", pending)
    .where("visible_at", "<=", now)
    .compile()

/**
 * Seconds until the earliest pending row comes due (negative: one is due; null: none is
 * pending): like `lagQuery`, an index-first-entry read on the partial `outbox_due` index.
 */
export const nextDueQuery = (db: Kysely<TxboxDatabase>): CompiledQuery<{ due: number | string | null }> =>
  db
    .selectFrom("outbox")
    // extract(epoch FROM …) is no function call Kysely can build.
    .select((eb) =>
      sql<number | string | null>`extract(epoch FROM ${eb.fn.min("visible_at")} - now())`.as("due"),
    )
    .where("status", "=", pending)
    .compile()

/**
 * Takes or renews housekeeping task `task` for `holder` (migration 0012): the
 * row comes back only when `holder` holds it now, i.e. it was free, its lease
 * ran out, or `holder` held it already. Runs every few seconds at most, so it
 * is compiled per call.
 */
export const holdTaskQuery = (
  db: Kysely<TxboxDatabase>,
  { task, holder, ttlMs }: { readonly task: string; readonly holder: string; readonly ttlMs: number },
): CompiledQuery<{ holder: string }> =>
  db
    .insertInto("housekeeping_leases")
    .values({ task, holder, held_until: nowPlusMs(Math.ceil(ttlMs)) })
    .onConflict((oc) =>
      oc
        .column("task")
        .doUpdateSet((eb) => ({
          holder: eb.ref("excluded.holder"),
          held_until: eb.ref("excluded.held_until"),
        }))
        .where((eb) =>
          eb.or([
            eb("housekeeping_leases.holder", "=", eb.ref("excluded.holder")),
            eb("housekeeping_leases.held_until", "<", now),
          ]),
        ),
    )
    .returning("holder")
    .compile()

/** The statements of one store, each compiled once for its schema. */
export interface OutboxStatements {
  readonly claim: (params: Parameters<typeof claimQuery>[1]) => CompiledQuery<ClaimAnswer>
  readonly mark: (params: { readonly token: string; readonly verdicts: string }) => CompiledQuery
  readonly claimHeld: (params: Parameters<typeof claimHeldQuery>[1]) => CompiledQuery<ClaimedRow>
  readonly markHeld: (params: { readonly verdicts: string }) => CompiledQuery
  readonly markHeldSent: (params: { readonly ids: string; readonly token: string }) => CompiledQuery
  readonly markAllSent: (params: Parameters<typeof markAllSentQuery>[1]) => CompiledQuery
  readonly release: (params: { readonly token: string; readonly ids: string }) => CompiledQuery
  readonly extend: (params: {
    readonly token: string
    readonly leaseMs: number
    readonly ids: string
  }) => CompiledQuery
  /** By the token alone: for a claim whose ids the store no longer knows. */
  readonly releaseByToken: (params: { readonly token: string }) => CompiledQuery
  readonly extendByToken: (params: { readonly token: string; readonly leaseMs: number }) => CompiledQuery
  readonly lag: () => CompiledQuery<{ lag: number | string | null }>
  readonly nextDue: () => CompiledQuery<{ due: number | string | null }>
  readonly lastPublished: CompiledQuery<LastPublishedColumns>
}

/**
 * A claim compiled once per kind of shard (none, a tenant, tenants, a hash share): each is its own text, and
 * a call binds its parameters to the one it needs.
 */
const prepareSharded = <P extends Readonly<Record<string, unknown>>, R>(
  db: Kysely<TxboxDatabase>,
  compile: (
    db: Kysely<TxboxDatabase>,
    params: P & { readonly shard?: ShardParams | undefined },
  ) => CompiledQuery<R>,
  placeholders: P,
): ((params: P & { readonly shard?: ShardParams | undefined }) => CompiledQuery<R>) => {
  const all = prepare(db, compile, placeholders)
  const tenant = prepare(
    db,
    (db, p: P & { readonly tenant: string }) => compile(db, { ...p, shard: { tenant: p.tenant } }),
    { ...placeholders, tenant: "\0tenant" },
  )
  const tenants = prepare(
    db,
    (db, p: P & { readonly tenants: string }) => compile(db, { ...p, shard: { tenants: p.tenants } }),
    { ...placeholders, tenants: "\0tenants" },
  )
  const hash = prepare(
    db,
    (db, p: P & { readonly of: number; readonly index: number }) =>
      compile(db, { ...p, shard: { of: p.of, index: p.index } }),
    { ...placeholders, of: -101, index: -102 },
  )
  const sweep = prepare(
    db,
    (db, p: P & { readonly sweepAfterMs: number }) =>
      compile(db, { ...p, shard: { sweepAfterMs: p.sweepAfterMs } }),
    { ...placeholders, sweepAfterMs: -103 },
  )
  return (params) => {
    const { shard } = params
    if (shard === undefined) return all(params)
    if ("sweepAfterMs" in shard) return sweep({ ...params, ...shard })
    if ("tenant" in shard) return tenant({ ...params, ...shard })
    return "tenants" in shard ? tenants({ ...params, ...shard }) : hash({ ...params, ...shard })
  }
}

/**
 * The relay's statements per batch as calls of migration 0020's functions in `schema`, whose plans
 * each connection keeps: sent as text, each was planned anew every time, and on the partitioned
 * outbox planning cost more than running (the migration has the figures). The claim answers as
 * `claimHeldQuery` does unsharded; the probe as the claim's `lastPublishedColumns`; the mark of a
 * claim's rows, all sent, its count in a column `updated` (fragments.ts's `updatedOf`).
 */
const cachedPlans = (schema: string) => {
  const fn = (name: string) => `${quoteIdent(schema)}.${name}`
  const claim = `SELECT * FROM ${fn("outbox_claim_held")}($1, $2, $3)`
  const markSent = `SELECT ${fn("outbox_mark_held_sent")}($1, $2) AS updated`
  return {
    claimHeld: (p: { readonly limit: number; readonly idleMs: string; readonly sinceMs: number }) =>
      rawStatement<ClaimedRow>(claim, [p.limit, p.idleMs, p.sinceMs]),
    lastPublished: CompiledQuery.raw(
      `SELECT * FROM ${fn("outbox_last_published")}()`,
    ) as CompiledQuery<LastPublishedColumns>,
    markHeldSent: (p: { readonly ids: string; readonly token: string }) =>
      rawStatement(markSent, [p.ids, p.token]),
  }
}

/** Compiles every statement once for `db` (bound to txbox's schema, `schema`). */
export const statements = (db: Kysely<TxboxDatabase>, schema: string): OutboxStatements => {
  const lag = lagQuery(db)
  const nextDue = nextDueQuery(db)
  const cached = cachedPlans(schema)
  const claimHeld = prepareSharded(db, claimHeldQuery, { limit: -1, idleMs: "\0idleMs", sinceMs: -3 })
  return {
    claim: prepareSharded(db, claimQuery, { limit: -1, token: "\0token", leaseMs: -2, sinceMs: -3 }),
    mark: prepare(db, markQuery, { token: "\0token", verdicts: "\0verdicts" }),
    // A sharded claim keeps its statement: its conditions differ by shard.
    claimHeld: (params) => (params.shard === undefined ? cached.claimHeld(params) : claimHeld(params)),
    markHeld: prepare(db, (db, p: { verdicts: string }) => markQuery(db, { ...p, token: null }), {
      verdicts: "\0verdicts",
    }),
    markHeldSent: cached.markHeldSent,
    markAllSent: prepare(db, markAllSentQuery, { token: "\0token", leaseUntil: "\0leaseUntil" }),
    release: prepare(db, releaseQuery, { token: "\0token", ids: "\0ids" }),
    extend: prepare(db, extendQuery, { token: "\0token", leaseMs: -1, ids: "\0ids" }),
    releaseByToken: prepare(db, (db, p: { token: string }) => releaseQuery(db, { ...p, ids: null }), {
      token: "\0token",
    }),
    extendByToken: prepare(
      db,
      (db, p: { token: string; leaseMs: number }) => extendQuery(db, { ...p, ids: null }),
      {
        token: "\0token",
        leaseMs: -1,
      },
    ),
    lag: () => ({ ...lag, queryId: createQueryId() }),
    nextDue: () => ({ ...nextDue, queryId: createQueryId() }),
    lastPublished: cached.lastPublished,
  }
}

const toMessage = (row: ClaimedRow): OutboxMessage => ({
  id: row.id,
  type: row.type,
  version: row.version,
  payload: row.payload,
  headers: row.headers ?? {},
  routingKey: row.routing_key,
  partitionKey: row.partition_key,
  position:
    row.partition_epoch === null || row.partition_seq === null
      ? null
      : { epoch: row.partition_epoch, seq: row.partition_seq },
  tenantId: row.tenant_id,
  occurredAt: row.occurred_at,
  attempts: row.attempts,
})

/** The claimed rows, and what the claim saw of the last publish (a claim that took nothing answers one row of nulls but that). */
const claimedAnswer = (result: { readonly rows: ReadonlyArray<ClaimAnswer> }, rank: string) => {
  const first = result.rows[0]
  const rows = first === undefined || first.id === null ? [] : (result.rows as ReadonlyArray<ClaimedRow>)
  return { rows, lastPublished: lastPublishedOf(first, rank) }
}

/** What a claim saw of the last publish, against this store's `rank`; null: nothing was ever sent. */
const lastPublishedOf = (
  row: LastPublishedColumns | undefined,
  rank: string,
): OutboxClaim["lastPublished"] => {
  const agoMs = row?.last_published_ago_ms
  return agoMs === null || agoMs === undefined
    ? null
    : { agoMs: Number(agoMs), by: publisherRank(row?.last_token ?? null, rank) }
}

/** A held claim's rows, and the last publish where its probe rode along with the claim (sessions). */
const heldAnswer = (
  { rows, after }: { readonly rows: ReadonlyArray<ClaimedRow>; readonly after?: ReadonlyArray<unknown> },
  rank: string,
) =>
  after === undefined
    ? { rows }
    : { rows, lastPublished: lastPublishedOf(after[0] as LastPublishedColumns | undefined, rank) }

/**
 * A claim token carries its store's rank in its last 8 hex digits (the rest is a UUIDv7, unique
 * in its process by time and counter): a store ranks a process among the relays that publish.
 */
const RANK_AT = 28
const tokenOf = (rank: string): string => `${uuidv7().slice(0, RANK_AT)}${rank}`

/** Where the relay that claimed under `token` ranks against this store's `rank`. */
const publisherRank = (token: string | null, rank: string): "self" | "before" | "after" | "unknown" => {
  const theirs = token?.slice(RANK_AT)
  // No token (sent by an older relay, which cleared it, by a per-row mark of a held claim, or by a
  // WAL relay, whose rows no claim held): it neither covers nor asks to be taken over (a WAL
  // relay's sweep would otherwise look every 50 ms while the log publishes).
  if (theirs === undefined || theirs.length !== rank.length) return "unknown"
  if (theirs === rank) return "self"
  return theirs < rank ? "before" : "after"
}

/** Sent rows older than `olderThanSeconds`, `batchSize` per statement, until none is left. */
const purgeSent = Effect.fn("OutboxStore.purgeSent")(function* (
  database: DatabaseShape,
  olderThanSeconds: number,
  batchSize: number,
) {
  // One cutoff for every batch: rows that age past it meanwhile wait for the
  // next purge, so the loop is sure to end.
  const before = yield* opsSql.cutoff(database, olderThanSeconds)
  let deleted = 0
  while (true) {
    const n = yield* opsSql.purgeSent(database, before, batchSize)
    deleted += n
    if (n < batchSize) return deleted
  }
})

/** Claims remembered for `markAllSent` at most; a relay has a claim or two in flight per worker. */
const MAX_LEASES = 1024

/** `OutboxStore.resendSent`: sent rows marked in a range of time, pending and due again. */
const resendSent = (db: Kysely<TxboxDatabase>) => (fromMsAgo: number, toMsAgo: number) =>
  tryStore("OutboxStore.resendSent", () =>
    db
      .updateTable("outbox")
      .set({ status: pending, visible_at: now, lock_token: null })
      // A literal status and published_at's range: the `outbox_sent` partial index finds them.
      .where("status", "=", sql.lit("sent"))
      .where("published_at", ">=", nowMinusMs(fromMsAgo))
      .where("published_at", "<=", nowMinusMs(toMsAgo))
      .executeTakeFirst()
      .then((result) => Number(result.numUpdatedRows)),
  )

/** `OutboxStore.settle`: verdicts for rows no claim holds (a WAL relay's), by id, where still pending. */
const settleRows =
  (db: Kysely<TxboxDatabase>, q: ReturnType<typeof statements>) => (marks: ReadonlyArray<OutboxMark>) =>
    marks.length === 0
      ? Effect.succeed(0)
      : tryStore("OutboxStore.settle", () =>
          db.executeQuery(q.markHeld({ verdicts: markVerdicts(marks) })).then(affected),
        )

export const make: Effect.Effect<OutboxStoreShape, never, Database | Scope.Scope> = Effect.gen(function* () {
  const database = yield* Database
  // Bound to txbox's schema once; `withSchema` leaves the CTE's name alone.
  const db = (database.db as Kysely<TxboxDatabase>).withSchema(database.schema)
  const q = statements(db, database.schema)

  // Per claim in flight: its rows (extend and release find them by id, written out only then), and
  // the lease it stamped, for `markAllSent` (undefined once extended: another visible_at).
  const leases = new Map<string, { until: string | undefined; readonly rows: ReadonlyArray<ClaimedRow> }>()
  const idsOf = (rows: ReadonlyArray<{ readonly id: string }>) => JSON.stringify(rows.map((row) => row.id))
  const release = (token: string, rows = leases.get(token)?.rows): Promise<number> => {
    leases.delete(token)
    const statement =
      rows === undefined ? q.releaseByToken({ token }) : q.release({ token, ids: idsOf(rows) })
    return db.executeQuery(statement).then(affected)
  }

  // Claims held in a transaction (`Database.holdsClaims`; heldClaims.ts).
  const held = makeHeldClaims(db, database.session, {
    ...q,
    verdictsOf: markVerdicts,
    afterClaim: q.lastPublished,
  })
  // Closing the store hands back what is still held: a pool does not close while a client is out.
  yield* Effect.addFinalizer(() => Effect.promise(held.releaseAll))

  // This store's rank among the relays (tokenOf): random, fixed for its life.
  const rank = uuidv7().slice(-8)
  const claimLeased = (token: string, limit: number, leaseMs: number, sinceMs: number, shard?: ShardParams) =>
    db.executeQuery(q.claim({ limit, token, leaseMs, sinceMs, shard })).then((r) => claimedAnswer(r, rank))
  const window = makeClaimWindow()

  // No generator (Effect.fnUntraced): once per cycle, and JavaScriptCore kept recompiling its body
  // for as long as the relay ran (core/inboxConsumer.ts says more).
  const bindShard = shardBinder()
  const claim = (
    limit: number,
    leaseMs: number,
    shard?: OutboxShard,
  ): Effect.Effect<OutboxClaim, StoreError> => {
    const bound = bindShard(shard)
    const token = tokenOf(rank)
    const { sinceMs, took } = startClaim(window, limit)
    return Effect.map(
      tryStoreUndoable(
        "OutboxStore.claim",
        (): Promise<{ rows: ReadonlyArray<ClaimedRow>; lastPublished?: OutboxClaim["lastPublished"] }> =>
          (database.holdsClaims === true
            ? held.claim(token, limit, leaseMs, sinceMs, bound).then((answer) => heldAnswer(answer, rank))
            : claimLeased(token, limit, leaseMs, sinceMs, bound)
          ).then((answer) => {
            took(answer.rows.length)
            return answer
          }),
        // Given up on (interrupted, e.g. timed out), the statement may still run
        // later: hand whatever it claims straight back rather than leave it to the lease.
        (claimed) => {
          claimed
            .then(({ rows }) => (rows.length > 0 ? (held.release(token) ?? release(token, rows)) : 0))
            .catch(() => 0)
        },
      ),
      ({ rows, lastPublished }) => {
        const first = rows[0]
        if (first !== undefined && !held.holds(token)) {
          // Claims that never reach a mark (a failed cycle) must not pile up: the per-row mark needs none.
          if (leases.size >= MAX_LEASES) leases.clear()
          leases.set(token, { until: first.lease_until, rows })
        }
        return { token, rows: rows.map(toMessage), ...(lastPublished === undefined ? {} : { lastPublished }) }
      },
    )
  }

  const mark = (token: string, marks: ReadonlyArray<OutboxMark>) => {
    // Run again (the relay retries a failed mark), a held claim is gone with its transaction: its
    // rows were rolled back and come due as they were, so nothing is marked.
    if (held.holds(token))
      return tryStore("OutboxStore.mark", () => held.mark(token, marks) ?? Promise.resolve(0))
    const lease = leases.get(token)
    leases.delete(token)
    if (marks.length === 0) return Effect.succeed(0)
    const perRow = () => db.executeQuery(q.mark({ token, verdicts: markVerdicts(marks) })).then(affected)
    const allSent =
      lease?.until !== undefined &&
      marks.length === lease.rows.length &&
      marks.every((m) => m.verdict._tag === "Done")
    const leaseUntil = lease?.until
    return tryStore("OutboxStore.mark", async () => {
      if (!allSent || leaseUntil === undefined) return perRow()
      const sent = await db.executeQuery(q.markAllSent({ token, leaseUntil })).then(affected)
      // Fewer: some rows' lease was extended (another visible_at) or taken over; the per-row mark
      // settles what is still ours and pending, and skips the rows just marked.
      return sent === marks.length ? sent : sent + (await perRow())
    })
  }

  const lagSeconds = tryStore("OutboxStore.lag", async () => {
    const result = await db.executeQuery(q.lag())
    return Math.max(0, Number(result.rows[0]?.lag ?? 0))
  })

  const nextDueMs = tryStore("OutboxStore.nextDue", async () => {
    // numeric comes back as a string from some drivers.
    const due = (await db.executeQuery(q.nextDue())).rows[0]?.due
    return due === null || due === undefined ? undefined : Number(due) * 1000
  })
  return {
    claim,
    mark,
    settle: settleRows(db, q),
    release: (token) => tryStore("OutboxStore.release", () => held.release(token) ?? release(token)),
    extend: (token, leaseMs) =>
      tryStore("OutboxStore.extend", () => {
        const extended = held.extend(token)
        if (extended !== undefined) return extended
        const lease = leases.get(token)
        if (lease === undefined) return db.executeQuery(q.extendByToken({ token, leaseMs })).then(affected)
        // The rows get another visible_at: the claim's no longer finds them.
        lease.until = undefined
        return db.executeQuery(q.extend({ token, leaseMs, ids: idsOf(lease.rows) })).then(affected)
      }),
    lagSeconds,
    nextDueMs,
    purgeSent: (olderThanSeconds, batchSize) => purgeSent(database, olderThanSeconds, batchSize),
    resendSent: resendSent(db),
    keepPartitions: (options) => partitions.keepOutboxPartitions(database, options),
    holdTask: (task, holder, ttlMs) =>
      tryStore("OutboxStore.holdTask", () =>
        db.executeQuery(holdTaskQuery(db, { task, holder, ttlMs })).then((r) => r.rows.length === 1),
      ),
    wakeups: (onWake, onHearing) =>
      database.listen(notifyChannel(database.schema, "outbox"), onWake, onHearing),
  } satisfies OutboxStoreShape
})

export const layer: Layer.Layer<OutboxStore, never, Database> = Layer.effect(OutboxStore, make)
