/**
 * Flag values the command parses itself: durations (`90s`, `2h`, `7d`) and
 * points in time (a duration ago, or an ISO timestamp). Pure, so the rules
 * are unit-tested without a database.
 */
import type { TimeBound } from "../storage/sql/operations.ts"
import { UsageError } from "./errors.ts"

const UNIT_SECONDS: Readonly<Record<string, number>> = { s: 1, m: 60, h: 3600, d: 86_400, w: 604_800 }
const DURATION = /^(\d+(?:\.\d+)?)(s|m|h|d|w)$/

/** `30s`, `15m`, `2h`, `7d`, `2w` → seconds. A bare number is refused: minutes or days are too easy to mix up. */
export const parseDuration = (flag: string, text: string): number => {
  const match = DURATION.exec(text.trim())
  if (!match) {
    throw new UsageError({
      reason: `--${flag} ${JSON.stringify(text)} is not a duration (a number and a unit: 30s, 15m, 2h, 7d, 2w)`,
    })
  }
  return Number(match[1]) * UNIT_SECONDS[match[2]!]!
}

const ISO = /^(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)(Z|[+-]\d{2}:?\d{2})?)?$/i

/**
 * A duration means "that long ago" by the database's clock; anything else must
 * be an ISO 8601 date or timestamp. One without an offset is read as UTC —
 * `Date` alone would read `2024-05-01T12:00` in the local zone of whoever runs
 * the command, and the same command line must mean the same rows everywhere.
 */
export const parseTimeBound = (flag: string, text: string): TimeBound => {
  const trimmed = text.trim()
  if (DURATION.test(trimmed)) return { secondsAgo: parseDuration(flag, trimmed) }
  const match = ISO.exec(trimmed)
  const at = match
    ? new Date(match[2] === undefined ? `${match[1]}T00:00:00Z` : `${match[1]}T${match[2]}${match[3] ?? "Z"}`)
    : undefined
  if (at === undefined || Number.isNaN(at.getTime())) {
    throw new UsageError({
      reason: `--${flag} ${JSON.stringify(text)} is neither a duration (2h, 7d) nor an ISO timestamp (2024-05-01T12:00:00Z)`,
    })
  }
  return { at }
}

/** `--limit`, `--batch`: Flag.Int accepts 0 and negatives, which would make no sense here. */
export const parsePositive = (flag: string, value: number): number => {
  if (!Number.isInteger(value) || value < 1) {
    throw new UsageError({ reason: `--${flag} must be a positive integer, got ${value}` })
  }
  return value
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i

/** Outbox ids are uuids; checked here so a typo is a usage error, not a database cast error. */
export const parseOutboxId = (text: string): string => {
  if (!UUID.test(text)) {
    throw new UsageError({ reason: `--id ${JSON.stringify(text)} is not a uuid (outbox ids are uuids)` })
  }
  return text.toLowerCase()
}

/** `42s`, `3m 20s`, `2h 5m`, `3d 4h`: an age for a table, to the two largest units. */
export const formatAge = (value: number | null): string => {
  if (value === null) return "-"
  const s = Math.max(0, Math.round(value))
  if (s < 60) return `${s}s`
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`
  if (s < 86_400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`
  return `${Math.floor(s / 86_400)}d ${Math.floor((s % 86_400) / 3600)}h`
}
