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
import { Effect, type Scope } from "effect"
import type { StoreError } from "../Errors.ts"

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

/** Whether a loop's wake-ups are heard (for its health): false while it polls only. */
export interface Listening {
  readonly listening: boolean
}

/**
 * Subscribes `signal` to a store's wake-ups (`subscribe` is the store's `wakeups`, bound): a store
 * that cannot LISTEN leaves the loop polling, said once in the log as `unavailable` words it. The
 * answer follows what the store says about its LISTEN (a self-test or ping that went unheard).
 */
export const subscribeWakeups = (
  subscribe: (
    onWake: () => void,
    onHearing: (hears: boolean) => void,
  ) => Effect.Effect<void, StoreError, Scope.Scope>,
  signal: Signal,
  unavailable: (error: StoreError) => string,
): Effect.Effect<Listening, never, Scope.Scope> =>
  Effect.suspend(() => {
    const state = { listening: true }
    const hearing = (hears: boolean) => {
      state.listening = hears
    }
    return subscribe(signal.notify, hearing).pipe(
      Effect.catch((error) =>
        Effect.andThen(
          Effect.sync(() => hearing(false)),
          Effect.logWarning(unavailable(error)),
        ),
      ),
      Effect.as(state),
    )
  })
