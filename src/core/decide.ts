/**
 * Pure: what the relay records for each publish outcome. Kept apart from the
 * loop so the whole policy can be read (and unit-tested) in one place.
 */

import type { PublishOutcome } from "../ports/Transport.ts"
import { delayFor, type RetryPolicy } from "../Retry.ts"
import type { RowMark } from "../storage/outboxSql.ts"

export interface Attempted {
  readonly id: string
  /** Attempts recorded before this one. */
  readonly attempts: number
}

export const decide = (
  row: Attempted,
  outcome: PublishOutcome,
  policy: RetryPolicy,
  random: () => number = Math.random,
): RowMark => {
  const attempt = row.attempts + 1
  const retry = (error: string): RowMark => ({
    id: row.id,
    status: "pending",
    delayMs: delayFor(policy, attempt, random()),
    error,
  })
  switch (outcome._tag) {
    case "Confirmed":
      return { id: row.id, status: "sent" }
    case "Rejected":
      return { id: row.id, status: "dead", error: outcome.error }
    case "Interrupted":
      // The broker or the link failed, not the message: keep retrying however
      // long the outage lasts, and never spend the message's attempts on it.
      return retry(outcome.error)
    case "Nacked":
    case "Returned":
    case "TimedOut":
      return attempt >= policy.maxAttempts
        ? { id: row.id, status: "dead", error: `${outcome.error} (after ${attempt} attempts)` }
        : retry(outcome.error)
  }
}
