/**
 * Time ranges as id ranges, for the partitioned outbox and inbox (migration
 * 0015). A UUIDv7's first 48 bits are its time in ms, so the lowest UUID of a
 * millisecond, `idBound(ms)`, sorts before every UUIDv7 of that millisecond and
 * after every one of the millisecond before: `[idBound(from), idBound(to))`
 * holds exactly the UUIDv7 ids made in `[from, to)`. As text (the inbox's
 * message_id) the same strings keep that order: fixed-width lowercase hex with
 * the dashes in the same places. Pure: no database here.
 */

export const HOUR_MS = 3_600_000
export const DAY_MS = 24 * HOUR_MS

/** The lowest UUID whose UUIDv7 time is `ms`: the lower bound of the range starting then. */
export const idBound = (ms: number): string => {
  const hex = Math.floor(ms).toString(16).padStart(12, "0")
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-0000-0000-000000000000`
}

/** The time a bound made by `idBound` stands for; undefined for anything else. */
export const boundTime = (bound: string): number | undefined => {
  const m = /^([0-9a-f]{8})-([0-9a-f]{4})-0000-0000-000000000000$/.exec(bound)
  return m === null ? undefined : Number.parseInt(m[1]! + m[2]!, 16)
}

/** The start of the partition of size `everyMs` that holds `ms` (UTC-aligned: days start at midnight UTC). */
export const partitionStart = (ms: number, everyMs: number): number => Math.floor(ms / everyMs) * everyMs

const pad = (n: number) => String(n).padStart(2, "0")

/**
 * `<table>_p<yyyymmdd>`, then as much of `hhmmss` as tells partitions of `everyMs` apart: `hh` for
 * hours, `hhmm` for minutes, `hhmmss` below.
 */
export const partitionName = (table: string, fromMs: number, everyMs: number): string => {
  const d = new Date(fromMs)
  const day = `${d.getUTCFullYear()}${pad(d.getUTCMonth() + 1)}${pad(d.getUTCDate())}`
  const time = `${pad(d.getUTCHours())}${pad(d.getUTCMinutes())}${pad(d.getUTCSeconds())}`
  const digits = everyMs % DAY_MS === 0 ? 0 : everyMs % HOUR_MS === 0 ? 2 : everyMs % 60_000 === 0 ? 4 : 6
  return `${table}_p${day}${time.slice(0, digits)}`
}

/** A partition's range as the catalog prints it (`pg_get_expr(relpartbound)`); undefined for DEFAULT. */
export const parseRange = (expr: string): { readonly from: string; readonly to: string } | undefined => {
  const m = /FROM \('([^']*)'\) TO \('([^']*)'\)/.exec(expr)
  return m === null ? undefined : { from: m[1]!, to: m[2]! }
}

/**
 * The partitions to create so that `[now, now + ahead)` is covered, each
 * `everyMs` long and aligned to it, skipping every range that overlaps one
 * of `existing` (as times; a partition made by hand with other bounds is
 * respected, never overlapped).
 */
export const missingRanges = (
  nowMs: number,
  aheadMs: number,
  everyMs: number,
  existing: ReadonlyArray<{ readonly fromMs: number; readonly toMs: number }>,
): ReadonlyArray<{ readonly fromMs: number; readonly toMs: number }> => {
  const out: Array<{ fromMs: number; toMs: number }> = []
  for (let from = partitionStart(nowMs, everyMs); from < nowMs + aheadMs; from += everyMs) {
    const to = from + everyMs
    if (!existing.some((e) => e.fromMs < to && from < e.toMs)) out.push({ fromMs: from, toMs: to })
  }
  return out
}
