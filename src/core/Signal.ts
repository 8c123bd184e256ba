/**
 * A wake-up signal for loops that otherwise poll: `notify()` is called from
 * driver callbacks (LISTEN), `wait` returns when notified or after `timeoutMs`,
 * whichever is first. Notifications between waits are not lost: one pending
 * notification is remembered.
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
  const wait = (timeoutMs: number) =>
    Effect.callback<void>((resume) => {
      if (pending) {
        pending = false
        resume(Effect.void)
        return
      }
      const wake = () => {
        clearTimeout(timer)
        waiters.delete(wake)
        resume(Effect.void)
      }
      const timer = setTimeout(wake, timeoutMs)
      waiters.add(wake)
      return Effect.sync(() => {
        clearTimeout(timer)
        waiters.delete(wake)
      })
    })
  return { notify, wait }
}
