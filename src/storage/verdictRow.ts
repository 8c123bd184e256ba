/**
 * A verdict as the row fields it sets: the one encoding behind the SQL stores'
 * marks (`markVerdicts`, `markFailures`) and the memory stores' (`applyFailure`).
 */
import type { Verdict } from "../ports/lease.ts"

type Failed = Exclude<Verdict, { readonly _tag: "Done" }>

export interface VerdictRow<Done extends string = never> {
  /** The row's status after the mark: a retried row stays pending. */
  readonly status: Done | "pending" | "dead"
  /** A retried row is due again this long after now; otherwise 0 and the due time is left alone. */
  readonly delayMs: number
  /** Attempts to add: a retry during an outage spends none, a dead row spends its last. */
  readonly inc: 0 | 1
  /** The error to record; null (Done): the last one stays. */
  readonly error: string | null
}

/** Retry: due again after its delay, one attempt more only if it spends one. Dead: one attempt more. */
export function verdictRow(verdict: Failed): VerdictRow & { readonly error: string }
/** Done: `done`, the success status of the row's table. */
export function verdictRow<Done extends string>(verdict: Verdict, done: Done): VerdictRow<Done>
export function verdictRow(verdict: Verdict, done?: string): VerdictRow<string> {
  switch (verdict._tag) {
    case "Done":
      return { status: done!, delayMs: 0, inc: 0, error: null }
    case "Retry":
      return {
        status: "pending",
        delayMs: verdict.delayMs,
        inc: verdict.spendsAttempt ? 1 : 0,
        error: verdict.error,
      }
    case "Dead":
      return { status: "dead", delayMs: 0, inc: 1, error: verdict.error }
  }
}
