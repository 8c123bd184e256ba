/**
 * How far back a relay's claim looks, and an inbox processor's (issue #26: a
 * hot path that stays small under a long snapshot). A claim walks `outbox_due`
 * (`inbox_due`: the consumer's entries) from its oldest entry.
 * Every row marked sent leaves a dead entry there until vacuum removes it, and
 * while any transaction holds an old snapshot (a report, a `txbox status` scan,
 * a 30 s handler) neither vacuum nor the scans themselves may remove it: a
 * claim then steps over every row sent since that snapshot began, a cost that
 * grows with its age (bench/retention.ts).
 *
 * So most claims look back only RECENT_MS (`visible_at >= now() - RECENT_MS`),
 * which skips the old dead entries in the index, and a full claim runs at
 * least every `fullEveryMs` and whenever a claim came back full (a backlog:
 * rows are taken in due order until it is gone). What only a full claim finds
 * is a row that became due more than RECENT_MS before the claim: one of a
 * transaction that ran longer than that before it committed (its `visible_at`
 * is its transaction's start), or one whose relay looked late. It waits for
 * the next full claim, a second at most while full claims are quick; when
 * they are slow (a long snapshot), they are spaced at 50 times their time
 * (the quicker of the last two), up to MAX_FULL_EVERY_MS, so that they cost
 * the database about 2 %.
 * Pure: the outbox store keeps one per process, the inbox store one per consumer.
 */

/** How far back a bounded claim looks. */
export const RECENT_MS = 3_000
/** The look-back of a full claim: a thousand years, every row whatever its due time. */
export const ALL_MS = 1000 * 365 * 24 * 3_600_000
/** A full claim at least this often while full claims are quick. */
export const FULL_EVERY_MS = 1_000
/** And at least this often however slow they are. */
export const MAX_FULL_EVERY_MS = 30_000

export interface ClaimWindow {
  /** The look-back of the next claim, in ms: RECENT_MS or ALL_MS. */
  readonly next: (nowMs: number) => number
  /** What a claim with look-back `sinceMs` found: `rows` of `limit`, in `tookMs`. */
  readonly record: (sinceMs: number, nowMs: number, tookMs: number, rows: number, limit: number) => void
}

/** A claim of up to `limit` rows starting now: its look-back, and what to call once it took `rows`. */
export const startClaim = (window: ClaimWindow, limit: number) => {
  const startedMs = Date.now()
  const sinceMs = window.next(startedMs)
  return {
    sinceMs,
    took: (rows: number) => window.record(sinceMs, startedMs, Date.now() - startedMs, rows, limit),
  }
}

export const makeClaimWindow = (): ClaimWindow => {
  let fullAt = Number.NEGATIVE_INFINITY
  let fullEveryMs = FULL_EVERY_MS
  // The time of the full claim before the last: the spacing follows the quicker of the last two,
  // so one slow claim (a connection opened, a pause) does not space them out; a slow table does.
  let previousTookMs = 0
  // Until a full claim came back short, older rows may be due: the first claim is a full one.
  let backlog = true
  return {
    next: (nowMs) => (backlog || nowMs - fullAt >= fullEveryMs ? ALL_MS : RECENT_MS),
    record: (sinceMs, nowMs, tookMs, rows, limit) => {
      if (sinceMs === ALL_MS) {
        fullAt = nowMs
        fullEveryMs = Math.min(
          MAX_FULL_EVERY_MS,
          Math.max(FULL_EVERY_MS, 50 * Math.min(tookMs, previousTookMs)),
        )
        previousTookMs = tookMs
        backlog = rows >= limit
      } else if (rows >= limit) backlog = true
    },
  }
}
