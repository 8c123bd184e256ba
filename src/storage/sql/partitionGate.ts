/**
 * The per-key order rule in TypeScript, for the stores that cannot say it in
 * SQL (the memory store) and for the operator commands that check it (`dead
 * skip`). The SQL claim states the same rule as `notEarly` in
 * `SqlInboxStore.ts`; the store contract holds the two to it.
 */
import type { PartitionPosition } from "../../ports/Transport.ts"

/** A consumer's place in a key: the last number it handled, in which epoch. */
export interface PartitionCursor {
  readonly epoch: number
  readonly lastSeq: number
}

/** The number `at` waits for: its `after`, or for a message that does not say, the one before it. */
export const afterOf = (at: PartitionPosition): number => at.after ?? at.seq - 1

/** The cursor in `at`'s epoch: its last number there, 0 when it has none (no cursor, or an older epoch's). */
const handledIn = (at: PartitionPosition, cursor: PartitionCursor | undefined): number | "later epoch" =>
  cursor === undefined || cursor.epoch < at.epoch
    ? 0
    : cursor.epoch === at.epoch
      ? cursor.lastSeq
      : "later epoch"

/**
 * The message is at the head of its key for this consumer: what it waits for
 * is handled and it is not handled itself (in its epoch; a newer epoch's
 * cursor has passed it).
 */
export const isNext = (at: PartitionPosition, cursor: PartitionCursor | undefined): boolean => {
  const handled = handledIn(at, cursor)
  return handled !== "later epoch" && afterOf(at) <= handled && at.seq > handled
}

/** The message must wait: what it waits for is not handled yet (a late or passed one never waits). */
export const isEarly = (at: PartitionPosition, cursor: PartitionCursor | undefined): boolean => {
  const handled = handledIn(at, cursor)
  return handled !== "later epoch" && afterOf(at) > handled
}

/** The cursor after handling `at`: never backwards within an epoch; a newer epoch replaces it. */
export const advanced = (cursor: PartitionCursor | undefined, at: PartitionPosition): PartitionCursor =>
  cursor === undefined || at.epoch > cursor.epoch
    ? { epoch: at.epoch, lastSeq: at.seq }
    : at.epoch === cursor.epoch
      ? { epoch: at.epoch, lastSeq: Math.max(cursor.lastSeq, at.seq) }
      : cursor

/**
 * Under `onOrderedDead: "skip"`: what `at` waits for is a dead message
 * (`isDead` says which of the key's numbers in `at`'s epoch are), so `at` may
 * go although it is early. A dead message was at its key's head when it died
 * (the processor claimed it), so what it waited for was handled or dead in
 * turn. A missing number still holds it.
 */
export const onlyDeadBefore = (at: PartitionPosition, isDead: (seq: number) => boolean): boolean =>
  isDead(afterOf(at))

/**
 * A claim with chains takes up to its limit of rows that may go now and, behind
 * them, up to this many times its limit in all: finding a key's head reads the
 * rows due before it (with a backlog, every waiting row of every key), so a
 * claim is worth many rows (bench/ordered.ts, 64 keys: 20,000 waiting rows read
 * per claim).
 */
export const CHAINED_PER_CLAIM = 10

/** A claimed row's place for `chainOrder`: its key and position, when it is ordered. */
export interface Chained {
  readonly partitionKey: string | null
  readonly position?: PartitionPosition | null
}

/**
 * A claim's rows, each key's in the order they must run, and the rows that
 * must not run now: `heads` may go on their own (what they wait for is
 * handled or passed); any other row may go only after the claimed row it
 * waits for. A row whose predecessor is neither (another claim holds it) is
 * `unchained`: the caller hands it back.
 */
export const chainOrder = <R extends Chained>(
  rows: ReadonlyArray<R>,
  isHead: (row: R) => boolean,
): { readonly ordered: ReadonlyArray<R>; readonly unchained: ReadonlyArray<R> } => {
  const slot = (key: string, epoch: number, seq: number) => `${epoch}:${seq}:${key}`
  const byWait = new Map<string, R[]>()
  const ordered: R[] = []
  for (const row of rows) {
    const at = row.position
    if (at == null || row.partitionKey === null || isHead(row)) ordered.push(row)
    else {
      const k = slot(row.partitionKey, at.epoch, afterOf(at))
      byWait.set(k, [...(byWait.get(k) ?? []), row])
    }
  }
  // Each placed row lets the rows waiting for it follow it.
  for (let i = 0; i < ordered.length; i++) {
    const row = ordered[i]!
    if (row.position == null || row.partitionKey === null) continue
    const k = slot(row.partitionKey, row.position.epoch, row.position.seq)
    const next = byWait.get(k)
    if (next === undefined) continue
    byWait.delete(k)
    ordered.push(...next)
  }
  return { ordered, unchained: [...byWait.values()].flat() }
}
