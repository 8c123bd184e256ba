/**
 * A wake-up for loops that otherwise poll: `notify()` is called from driver
 * callbacks (LISTEN), `wait(ms)` returns when notified or after `ms` on
 * Effect's `Clock` (so `TestClock` drives it), whichever is first. A
 * notification between waits is not lost: one pending notification is kept.
 */
import { Effect } from "effect"

export interface Signal {
  readonly notify: () => void
  readonly wait: (timeoutMs: number) => Effect.Effect<void>
}

export const makeSignal = (): Signal => {
  let pending = false
  const waiters = new Set<() => void>()
  const notify = () => {
    if (waiters.size === 0) {
      pending = true
      return
    }
    for (const wake of [...waiters]) wake()
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
  return { notify, wait: (timeoutMs) => Effect.raceFirst(notified, Effect.sleep(timeoutMs)) }
}
