/**
 * The per-key order rule in TypeScript, for the stores that cannot say it in
 * SQL (the memory store) and for the operator commands that check it (`dead
 * skip`). The SQL claim states the same rule as `notEarly` in
 * `SqlInboxStore.ts`; the store contract holds the two to it.
 */
import type { PartitionPosition } from "../ports/Transport.ts"

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
