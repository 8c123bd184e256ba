/**
 * The one verdict rule, used by the relay, the idempotent inbox and the
 * store-then-process processor alike: given the attempts already recorded and
 * how this one failed, the message is retried after a backoff or is dead.
 *
 * Attempts are counted once and the same way everywhere: `attemptsBefore` is
 * the number of tries recorded before this one, so this try is number
 * `attemptsBefore + 1`, and a handler gets exactly `maxAttempts` runs. An
 * outage (broker or database away) never spends an attempt.
 */
import type { Verdict } from "../ports/lease.ts"
import type { PublishOutcome } from "../ports/Transport.ts"
import { delayFor, type RetryPolicy } from "../Retry.ts"

/** Why a try did not succeed. */
export type Failure =
  /** The message's own trouble, which may pass (a handler threw; the broker nacked, returned, timed out): spends an attempt. */
  | { readonly _tag: "Transient"; readonly error: string }
  /** The infrastructure, not the message (connection lost, database away): retried, spends nothing. */
  | { readonly _tag: "Outage"; readonly error: string }
  /** Can never succeed (undecodable, unknown type, too large): dead at once. */
  | { readonly _tag: "Permanent"; readonly error: string }

export const transient = (error: string): Failure => ({ _tag: "Transient", error })
export const outage = (error: string): Failure => ({ _tag: "Outage", error })
export const permanent = (error: string): Failure => ({ _tag: "Permanent", error })

/** The verdict after a try that failed with `failure`, or `Done` when it did not fail. */
export const verdictFor = (
  attemptsBefore: number,
  failure: Failure | undefined,
  policy: RetryPolicy,
  random: () => number = Math.random,
): Verdict => {
  if (failure === undefined) return { _tag: "Done" }
  const attempt = attemptsBefore + 1
  switch (failure._tag) {
    case "Permanent":
      return { _tag: "Dead", error: failure.error }
    case "Outage":
      // Same delay as this attempt number would get: the backoff neither grows nor resets during an outage.
      return {
        _tag: "Retry",
        delayMs: delayFor(policy, attempt, random()),
        error: failure.error,
        spendsAttempt: false,
      }
    case "Transient":
      return attempt >= policy.maxAttempts
        ? { _tag: "Dead", error: `${failure.error} (after ${attempt} attempts)` }
        : {
            _tag: "Retry",
            delayMs: delayFor(policy, attempt, random()),
            error: failure.error,
            spendsAttempt: true,
          }
  }
}

/** How the relay reads one publish outcome: undefined when the broker confirmed it. */
export const publishFailure = (outcome: PublishOutcome): Failure | undefined => {
  switch (outcome._tag) {
    case "Confirmed":
      return undefined
    case "Rejected":
      return permanent(outcome.error)
    // No confirm in time: the broker is blocked (a memory or disk alarm) or the socket is
    // half-open. The infrastructure's trouble, not the message's, like a lost channel.
    case "TimedOut":
    case "Interrupted":
      return outage(outcome.error)
    case "Nacked":
    case "Returned":
      return transient(outcome.error)
  }
}
