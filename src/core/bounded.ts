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
 * On the live clock the bound is one fiber and a timer: `Effect.timeoutOrElse`
 * races two fibers (the effect and a sleep) and interrupts the loser, and a
 * relay cycle bounds three statements: at 20 cycles a second that was a
 * third of what the relay's own code spent. Under another `Clock` (a
 * `TestClock`) it is `timeoutOrElse`, which sleeps on that clock.
 */
import { Effect } from "effect"
import { StoreError } from "../Errors.ts"
import { onLiveClock } from "./liveClock.ts"

export const bounded =
  (operation: string, ms: number) =>
  <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | StoreError, R> => {
    const timedOut = () =>
      new StoreError({ reason: "connection", operation, cause: `no answer within ${ms} ms` })
    return Effect.withFiber((parent) => {
      if (!onLiveClock(parent))
        return Effect.timeoutOrElse(Effect.interruptible(effect), {
          duration: ms,
          orElse: () => Effect.fail(timedOut()),
        })
      return Effect.callback<A, E | StoreError, R>((resume) => {
        let settled = false
        // Its own fiber (in the caller's context: services, clock, tracer, span), so that the
        // timeout can interrupt it without interrupting the caller.
        const fiber = Effect.runForkWith(parent.context as never)(
          Effect.interruptible(effect) as Effect.Effect<A, E>,
        )
        const timer = setTimeout(() => {
          if (settled) return
          settled = true
          fiber.interruptUnsafe()
          resume(Effect.fail(timedOut()))
        }, ms)
        fiber.addObserver((exit) => {
          if (settled) return
          settled = true
          clearTimeout(timer)
          resume(exit)
        })
        // The caller interrupted (outside an uninterruptible cycle): the statement goes with it.
        return Effect.sync(() => {
          if (settled) return
          settled = true
          clearTimeout(timer)
          fiber.interruptUnsafe()
        })
      })
    })
  }
