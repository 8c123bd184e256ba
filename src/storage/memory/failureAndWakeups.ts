/**
 * What both memory stores share: a failure verdict applied to a leased row
 * (the rule the SQL marks write in SQL), and the wake-up listeners.
 */
import { Effect, type Scope } from "effect"
import type { StoreError } from "../../Errors.ts"
import type { Verdict } from "../../ports/lease.ts"

/** The mutable lease fields of a memory row. */
interface LeasedRow {
  status: string
  visibleAt: number
  attempts: number
  lastError: string | null
  lockToken: string | null
}

/** Retry: due again after its delay, one attempt more only if it spends one. Dead: one attempt more. Either way the lease ends. */
export const applyFailure = (
  row: LeasedRow,
  verdict: Exclude<Verdict, { readonly _tag: "Done" }>,
  now: number,
): void => {
  if (verdict._tag === "Retry") {
    row.visibleAt = now + verdict.delayMs
    row.attempts += verdict.spendsAttempt ? 1 : 0
  } else {
    row.status = "dead"
    row.attempts += 1
  }
  row.lastError = verdict.error
  row.lockToken = null
}

/** Wake-up listeners: `wakeups` registers one until its scope closes; `wake` calls them all. */
export const makeWakeups = (
  op: <A>(operation: string, f: (now: number) => A) => Effect.Effect<A, StoreError>,
) => {
  const listeners = new Set<{ readonly onWake: () => void }>()
  const wake = () => {
    for (const listener of [...listeners]) listener.onWake()
  }
  const wakeups = (onWake: () => void): Effect.Effect<void, StoreError, Scope.Scope> =>
    Effect.acquireRelease(
      op("listen", () => {
        // A fresh entry per call: the same callback registered twice is two listeners.
        const entry = { onWake }
        listeners.add(entry)
        return entry
      }),
      (entry) => Effect.sync(() => listeners.delete(entry)),
    ).pipe(Effect.asVoid)
  return { wake, wakeups }
}
