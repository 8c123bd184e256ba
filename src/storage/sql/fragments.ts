/**
 * The few SQL pieces both SQL stores need where Kysely's builder has no words.
 */
import { type Expression, type QueryCreator, sql } from "kysely"
import { storableMessage } from "../../core/storable.ts"
import type { Verdict } from "../../ports/lease.ts"
import { verdictRow } from "../verdictRow.ts"

/**
 * `now() + n ms`: Kysely has no interval arithmetic. A number is bound as a
 * parameter (cast, so the driver need not guess its type); a column is referenced.
 */
/** `now()` less `ms` milliseconds (a look-back that may be centuries: float8, not int). */
export const nowMinusMs = (ms: number) => sql<Date>`now() - ${ms}::float8 * interval '1 millisecond'`

export const nowPlusMs = (ms: number | Expression<number>) =>
  typeof ms === "number"
    ? sql<Date>`now() + ${ms}::int * interval '1 millisecond'`
    : sql<Date>`now() + ${ms} * interval '1 millisecond'`

export const now = sql<Date>`now()`

/**
 * When a mark marks: its statement's start. A held claim's mark runs in the claim's transaction,
 * up to `MARK_WAIT_MS` later (heldClaims.ts), and `now()` is that transaction's start: a row's
 * `published_at` would read up to 50 ms older than its mark, and the producers' wake-up check
 * (`outbox_wake()`: a relay published within 100 ms) and the relays' cover (`lastPublished`) would
 * see a warm relay as cold, and wake every relay process.
 */
export const markedAt = sql<Date>`statement_timestamp()`

/**
 * `'pending'` as a literal, never a parameter: the due indexes are partial
 * (`WHERE status = 'pending'`), and a generic plan cannot prove a bound
 * parameter matches them. `as const` keeps it typed against the status column.
 */
export const pending = sql.lit("pending" as const)

/**
 * The inbox row aliased `row` is an ordered row still to handle of the key of
 * the row aliased `of` (same consumer, key and epoch), spelled with the
 * partial index's predicate (`inbox_ordered`: `partition_seq IS NOT NULL AND
 * status <> 'processed'`) so the planner uses it.
 */
export const pendingOfKey = (row: string, of: string) => {
  const col = (alias: string, name: string) => sql.ref(`${alias}.${name}`)
  return sql<boolean>`${col(row, "consumer")} = ${col(of, "consumer")}
    AND ${col(row, "partition_key")} = ${col(of, "partition_key")}
    AND ${col(row, "partition_epoch")} = ${col(of, "partition_epoch")}
    AND ${col(row, "partition_seq")} IS NOT NULL
    AND ${col(row, "status")} <> 'processed' AND ${col(row, "status")} = ${pending}`
}

/** What the inbox row aliased `row` waits for: its `partition_after`, or for a row that does not say, the number before it. */
export const waitsForOf = (row: string) =>
  sql<string>`COALESCE(${sql.ref(`${row}.partition_after`)}, ${sql.ref(`${row}.partition_seq`)} - 1)`

/** Rows an UPDATE or DELETE changed. */
export const affected = (result: { readonly numAffectedRows?: bigint }): number =>
  Number(result.numAffectedRows ?? 0n)

/**
 * How many rows a mark wrote: `count` (an UPDATE's), or what a function that answers it says in a
 * column `updated` (migration 0020's `outbox_mark_held_sent`).
 */
export const updatedOf = (rows: ReadonlyArray<unknown>, count: number): number => {
  const first = rows[0]
  return typeof first === "object" && first !== null && "updated" in first
    ? Number((first as { readonly updated: unknown }).updated)
    : count
}

/** `updatedOf` for Kysely's answer. */
export const markedCount = (result: {
  readonly numAffectedRows?: bigint
  readonly rows: ReadonlyArray<unknown>
}): number => updatedOf(result.rows, affected(result))

/**
 * How an existing cursor takes an upserted one (`ON CONFLICT … DO UPDATE SET`):
 * it only ever moves forward. Within an epoch to the greater number (a
 * redriven row that was already passed, a skip that raced the processor);
 * a newer epoch replaces it; an older one changes nothing.
 */
const cursorForward = {
  epoch: sql<number>`GREATEST(inbox_cursors.epoch, excluded.epoch)`,
  last_seq: sql<number>`CASE
    WHEN excluded.epoch > inbox_cursors.epoch THEN excluded.last_seq
    WHEN excluded.epoch = inbox_cursors.epoch THEN GREATEST(inbox_cursors.last_seq, excluded.last_seq)
    ELSE inbox_cursors.last_seq END`,
  updated_at: now,
}

/** One consumer's cursor for one key: the epoch and number of the last message it handled. */
export interface CursorValues {
  readonly consumer: string
  readonly partition_key: string
  readonly epoch: number
  readonly last_seq: number
}

/**
 * The one upsert of consumers' cursors: each cursor inserted, or an existing
 * one moved forward only (`cursorForward`). The cursors are given as values,
 * or taken from the ordered rows a mark's CTE `m` changed: every one, or the
 * furthest of each key (a claim may hold several rows of one key).
 */
export const upsertCursors = (
  // biome-ignore lint/suspicious/noExplicitAny: a query creator whose `with` list may hold `m`
  qc: QueryCreator<any>,
  cursors: CursorValues | { readonly marked: "every" | "furthestPerKey" },
) => {
  const into = qc.insertInto("inbox_cursors")
  const rows =
    "marked" in cursors
      ? into.columns(["consumer", "partition_key", "epoch", "last_seq"]).expression((eb) => {
          const marked = eb.selectFrom("m")
          const select = (cursors.marked === "furthestPerKey" ? marked.distinctOn("m.partition_key") : marked)
            .select(["m.consumer", "m.partition_key", "m.partition_epoch", "m.partition_seq"])
            .where("m.partition_key", "is not", null)
            .where("m.partition_epoch", "is not", null)
            .where("m.partition_seq", "is not", null)
          return cursors.marked === "furthestPerKey"
            ? select
                .orderBy("m.partition_key")
                .orderBy("m.partition_epoch", "desc")
                .orderBy("m.partition_seq", "desc")
            : select
        })
      : into.values(cursors)
  return rows.onConflict((oc) => oc.columns(["consumer", "partition_key"]).doUpdateSet(cursorForward))
}

/**
 * A batch's verdicts as the one JSON parameter both stores' mark statements
 * read (`json_to_recordset`): per row `{ id, status, delay_ms, inc, error }`,
 * from the one verdict encoding (`verdictRow`), error text made storable.
 * `done`: the status a Done verdict sets in that table.
 */
export const verdictsJson = (
  marks: ReadonlyArray<{ readonly id: string; readonly verdict: Verdict }>,
  done: string,
): string =>
  JSON.stringify(
    marks.map(({ id, verdict }) => {
      const row = verdictRow(verdict, done)
      return {
        id,
        status: row.status,
        delay_ms: row.delayMs,
        inc: row.inc,
        error: storableMessage(row.error),
      }
    }),
  )
