/**
 * Effect's own clock, the one every fiber has unless another is provided: its
 * sleeps are `setTimeout`s. Code on a hot path may then use a timer directly
 * instead of a fiber that sleeps (`bounded.ts`, `heartbeat.ts`, the inbox's
 * `watchdog`), and keep the fiber under another clock, so that `TestClock`
 * still drives it in tests.
 */
import { Clock, Effect, type Fiber } from "effect"

const liveClock = Effect.runSync(Effect.clockWith(Effect.succeed))

/** Whether `fiber` runs on the live clock. */
export const onLiveClock = (fiber: Fiber.Fiber<unknown, unknown>): boolean =>
  fiber.getRef(Clock.Clock) === liveClock

/**
 * `effect` in a fiber of its own (in `parent`'s context: its services, clock, tracer and span),
 * cut short by a timer: after `firstMs`, and then whenever it asks, `next` answers how long until
 * it looks again, or the failure to end with (the fiber is interrupted then). One fiber and a
 * timer, where `Effect.raceFirst` with a sleep forks two fibers and interrupts the loser: on paths
 * that run for every batch, that was a third of the relay's own CPU.
 */
export const cutShortOnTimer = <A, E, E2>(
  parent: Fiber.Fiber<unknown, unknown>,
  effect: Effect.Effect<A, E>,
  firstMs: number,
  next: () => number | { readonly fail: E2 },
): Effect.Effect<A, E | E2> =>
  Effect.callback<A, E | E2>((resume) => {
    let settled = false
    let timer: ReturnType<typeof setTimeout> | undefined
    const fiber = Effect.runForkWith(parent.context as never)(Effect.interruptible(effect))
    const look = () => {
      timer = undefined
      if (settled) return
      const answer = next()
      if (typeof answer === "number") {
        timer = setTimeout(look, answer)
        return
      }
      settled = true
      fiber.interruptUnsafe()
      resume(Effect.fail(answer.fail))
    }
    fiber.addObserver((exit) => {
      if (settled) return
      settled = true
      if (timer !== undefined) clearTimeout(timer)
      resume(exit)
    })
    if (!settled) timer = setTimeout(look, firstMs)
    // The caller interrupted (outside an uninterruptible region): the effect goes with it.
    return Effect.sync(() => {
      if (settled) return
      settled = true
      if (timer !== undefined) clearTimeout(timer)
      fiber.interruptUnsafe()
    })
  })
