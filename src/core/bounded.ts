/**
 * A statement on a connection whose server went away can hang instead of
 * failing (postgres.js after a backend dies, a half-open socket). Bounding it
 * turns the hang into a retryable `StoreError`, so the loop backs off and
 * tries again on a fresh connection instead of waiting forever.
 *
 * The bounded effect is made interruptible, so the bound holds inside the
 * loops' uninterruptible cycles too (a timeout there would otherwise wait for
 * the effect it is meant to cut short). A shutdown's interruption is still
 * held back until the cycle ends: only the timeout interrupts it.
 *
 * On the live clock the bound is a timer (`cutShortOnTimer`): a relay cycle
 * bounds three statements. Under another `Clock` (a `TestClock`) it is
 * `Effect.timeoutOrElse`, which sleeps on that clock.
 */
import { Effect } from "effect"
import { StoreError } from "../Errors.ts"
import { cutShortOnTimer, onLiveClock } from "./liveClock.ts"

export const bounded =
  (operation: string, ms: number) =>
  <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | StoreError, R> => {
    const timedOut = () =>
      new StoreError({ reason: "connection", operation, cause: `no answer within ${ms} ms` })
    return Effect.withFiber((parent) =>
      onLiveClock(parent)
        ? cutShortOnTimer(parent, effect as Effect.Effect<A, E>, ms, () => ({ fail: timedOut() }))
        : Effect.timeoutOrElse(Effect.interruptible(effect), {
            duration: ms,
            orElse: () => Effect.fail(timedOut()),
          }),
    )
  }
