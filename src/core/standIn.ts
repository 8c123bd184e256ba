/**
 * Ordered duplicates. A handler's `dedupeKey` folds a resent business event
 * into the row already stored, but the resend has a number of its own in its
 * key's sequence: dropped, it would leave a gap that the key's next message
 * waits on forever. So an ordered row whose key is taken at another position
 * is stored as a stand-in: its own key, the key it repeats in `standsInFor`.
 * The processor marks a stand-in processed without running the handler, and
 * the key moves on. Both stores apply this rule in `insertPending`.
 */
import type { InboxRow } from "../ports/InboxStore.ts"
import type { PartitionPosition } from "../ports/Transport.ts"

/** A stand-in's key: the key it repeats and its place, so a redelivery of the same resend collapses into it. */
export const standInKey = (key: string, at: PartitionPosition): string => `${key}@${at.epoch}.${at.seq}`

/**
 * The stand-ins an insert of `rows` may need: every ordered row that did not
 * get its key (`inserted` holds the keys the insert stored; a key given twice
 * in one batch is stored for its first row). Whether a stand-in is stored is
 * the store's to decide: not when its key's row holds the same position (a
 * redelivery, not a resend).
 */
export const standInsFor = (rows: ReadonlyArray<InboxRow>, inserted: ReadonlySet<string>): InboxRow[] => {
  const seen = new Set<string>()
  const standIns: InboxRow[] = []
  for (const row of rows) {
    const first = !seen.has(row.key)
    seen.add(row.key)
    if ((first && inserted.has(row.key)) || row.position == null || row.standsInFor != null) continue
    standIns.push({ ...row, key: standInKey(row.key, row.position), standsInFor: row.key })
  }
  return standIns
}
