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

/**
 * The message is next: the one after the cursor in its epoch, or the first of
 * a newer epoch, or the first of a key the consumer has not seen.
 */
export const isNext = (at: PartitionPosition, cursor: PartitionCursor | undefined): boolean =>
  cursor === undefined
    ? at.seq === 1
    : cursor.epoch === at.epoch
      ? at.seq === cursor.lastSeq + 1
      : cursor.epoch < at.epoch && at.seq === 1

/** The message must wait: a predecessor has not been handled (a late or passed one never waits). */
export const isEarly = (at: PartitionPosition, cursor: PartitionCursor | undefined): boolean =>
  cursor === undefined
    ? at.seq !== 1
    : cursor.epoch === at.epoch
      ? at.seq > cursor.lastSeq + 1
      : cursor.epoch < at.epoch && at.seq !== 1

/** The cursor after handling `at`: never backwards within an epoch; a newer epoch replaces it. */
export const advanced = (cursor: PartitionCursor | undefined, at: PartitionPosition): PartitionCursor =>
  cursor === undefined || at.epoch > cursor.epoch
    ? { epoch: at.epoch, lastSeq: at.seq }
    : at.epoch === cursor.epoch
      ? { epoch: at.epoch, lastSeq: Math.max(cursor.lastSeq, at.seq) }
      : cursor

/**
 * Under `onOrderedDead: "skip"`: the numbers between the cursor and `at` are
 * all dead messages (`isDead` says which of the key's numbers in `at`'s epoch
 * are), so `at` may go although it is early. A missing number still holds it.
 */
export const onlyDeadBefore = (
  at: PartitionPosition,
  cursor: PartitionCursor | undefined,
  isDead: (seq: number) => boolean,
): boolean => {
  const handled = cursor !== undefined && cursor.epoch === at.epoch ? cursor.lastSeq : 0
  for (let seq = handled + 1; seq < at.seq; seq++) if (!isDead(seq)) return false
  return true
}
