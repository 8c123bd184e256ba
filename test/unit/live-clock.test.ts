// cutShortOnTimer (core/liveClock.ts): an effect in a fiber of its own, ended by a timer that looks
// again as often as it is told (the inbox's watchdog), or not at all once the effect ended.
import { expect, test } from "bun:test"
import { Effect, Exit } from "effect"
import { TestClock } from "effect/testing"
import { cutShortOnTimer, onLiveClock } from "../../src/core/liveClock.ts"

const hung = (onInterrupt: () => void) =>
  Effect.promise(() => new Promise<never>(() => {})).pipe(Effect.onInterrupt(() => Effect.sync(onInterrupt)))

test("the timer looks as often as next says, and ends the effect with next's failure", async () => {
  let looks = 0
  let interrupted = false
  const started = performance.now()
  const exit = await Effect.runPromise(
    Effect.exit(
      Effect.withFiber((parent) =>
        cutShortOnTimer(
          parent,
          hung(() => (interrupted = true)),
          10,
          () => (++looks < 3 ? 10 : { fail: "deadline passed" as const }),
        ),
      ),
    ),
  )
  expect(exit).toEqual(Exit.fail("deadline passed"))
  expect(looks).toBe(3)
  expect(performance.now() - started).toBeGreaterThanOrEqual(28)
  expect(interrupted).toBe(true)
})

test("an effect that ends first is not looked at again, and its exit is the answer", async () => {
  let looks = 0
  const value = await Effect.runPromise(
    Effect.withFiber((parent) =>
      cutShortOnTimer(
        parent,
        Effect.promise(() => new Promise((r) => setTimeout(() => r("done"), 15))),
        10,
        () => {
          looks++
          return 10
        },
      ),
    ),
  )
  expect(value).toBe("done")
  const atEnd = looks
  await new Promise((r) => setTimeout(r, 40))
  expect(looks).toBe(atEnd)
  expect(atEnd).toBeLessThanOrEqual(1)
})

test("onLiveClock: true on Effect's own clock, false under TestClock", async () => {
  expect(await Effect.runPromise(Effect.withFiber((fiber) => Effect.succeed(onLiveClock(fiber))))).toBe(true)
  expect(
    await Effect.runPromise(
      Effect.withFiber((fiber) => Effect.succeed(onLiveClock(fiber))).pipe(Effect.provide(TestClock.layer())),
    ),
  ).toBe(false)
})
