/**
 * A wake-up for loops that otherwise poll: `notify()` is called from driver
 * callbacks (LISTEN), `wait(ms)` returns when notified or after `ms` on
 * Effect's `Clock` (so `TestClock` drives it), whichever is first.
 *
 * A notification wakes one waiter, the one that has waited longest, not
 * all: several workers of a process share a signal, and a NOTIFY for a few
 * rows is one claim's work; waking every worker made the others' claims
 * find nothing (issue #25). A worker whose claim came back full `nudge`s the
 * next one, so a burst still spreads over all of them. A notification while
 * nobody waits is not lost: one pending notification is kept.
 */
import { Effect } from "effect"

export interface Signal {
  /** Wakes one waiter; with none waiting, the next wait returns at once. */
  readonly notify: () => void
  /** Wakes one waiter if there is one; otherwise nothing (no pending notification). */
  readonly nudge: () => void
  readonly wait: (timeoutMs: number) => Effect.Effect<void>
}

export const makeSignal = (): Signal => {
  let pending = false
  // In arrival order: a Set iterates in insertion order, so the first is the longest waiting.
  const waiters = new Set<() => void>()
  const wakeFirst = (): boolean => {
    for (const wake of waiters) {
      wake()
      return true
    }
    return false
  }
  const notify = () => {
    if (!wakeFirst()) pending = true
  }
  const nudge = () => {
    wakeFirst()
  }
  const notified = Effect.callback<void>((resume) => {
    if (pending) {
      pending = false
      resume(Effect.void)
      return
    }
    const wake = () => {
      waiters.delete(wake)
      resume(Effect.void)
    }
    waiters.add(wake)
    return Effect.sync(() => {
      waiters.delete(wake)
    })
  })
  return { notify, nudge, wait: (timeoutMs) => Effect.raceFirst(notified, Effect.sleep(timeoutMs)) }
}
