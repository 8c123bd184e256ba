/**
 * Effect's own clock, the one every fiber has unless another is provided: its
 * sleeps are `setTimeout`s. Code on a hot path may then use a timer directly
 * instead of a fiber that sleeps (`bounded.ts`, `heartbeat.ts`), and keep the
 * fiber under another clock, so that `TestClock` still drives it in tests.
 */
import { Clock, Effect, type Fiber } from "effect"

const liveClock = Effect.runSync(Effect.clockWith(Effect.succeed))

/** Whether `fiber` runs on the live clock. */
export const onLiveClock = (fiber: Fiber.Fiber<unknown, unknown>): boolean =>
  fiber.getRef(Clock.Clock) === liveClock
