/**
 * What both memory stores share: a failure verdict applied to a leased row
 * (`verdictRow`, the encoding the SQL marks write), and the wake-up listeners.
 */
import { Effect, type Scope } from "effect"
import type { StoreError } from "../../Errors.ts"
import type { Verdict } from "../../ports/lease.ts"
import { verdictRow } from "../verdictRow.ts"

/** The mutable lease fields of a memory row. */
interface LeasedRow {
  status: string
  visibleAt: number
  attempts: number
  lastError: string | null
  lockToken: string | null
}

/** A failure verdict applied as the SQL marks write it (`verdictRow`). Either way the lease ends. */
export const applyFailure = (
  row: LeasedRow,
  verdict: Exclude<Verdict, { readonly _tag: "Done" }>,
  now: number,
): void => {
  const set = verdictRow(verdict)
  if (set.status === "pending") row.visibleAt = now + set.delayMs
  row.status = set.status
  row.attempts += set.inc
  row.lastError = set.error
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
