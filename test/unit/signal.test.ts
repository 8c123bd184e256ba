// The wake-up signal (core/signal.ts): a NOTIFY wakes one waiting worker, not all of them; a nudge
// wakes one only if one waits; a notification with nobody waiting is kept for the next wait.
import { expect, test } from "bun:test"
import { Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { makeSignal } from "../../src/core/signal.ts"

/** Starts `n` waiters on `signal` (each waits up to 10 s of test time), runs `act`, and says which woke. */
const woken = (n: number, act: (signal: ReturnType<typeof makeSignal>) => void) =>
  Effect.runPromise(
    Effect.gen(function* () {
      const signal = makeSignal()
      const done: number[] = []
      const fibers = []
      for (let i = 0; i < n; i++)
        fibers.push(
          yield* Effect.forkChild(
            Effect.map(signal.wait(10_000), () => {
              done.push(i)
            }),
          ),
        )
      yield* Effect.yieldNow
      act(signal)
      yield* TestClock.adjust(1)
      const early = [...done]
      yield* TestClock.adjust(10_000)
      for (const f of fibers) yield* Fiber.join(f)
      return { early, all: done.length }
    }).pipe(Effect.provide(TestClock.layer())),
  )

test("a notification wakes the worker that waited longest, and only it", async () => {
  expect(await woken(3, (s) => s.notify())).toEqual({ early: [0], all: 3 })
})

test("two notifications wake two workers", async () => {
  expect(
    await woken(3, (s) => {
      s.notify()
      s.notify()
    }),
  ).toEqual({ early: [0, 1], all: 3 })
})

test("a nudge wakes one waiting worker", async () => {
  expect(await woken(2, (s) => s.nudge())).toEqual({ early: [0], all: 2 })
})

test("a notification with nobody waiting is kept for the next wait; a nudge is not", async () => {
  const next = (act: (signal: ReturnType<typeof makeSignal>) => void) =>
    Effect.runPromise(
      Effect.gen(function* () {
        const signal = makeSignal()
        act(signal)
        const waiting = yield* Effect.forkChild(signal.wait(10_000))
        yield* TestClock.adjust(1)
        const early = waiting.pollUnsafe() !== undefined
        yield* TestClock.adjust(10_000)
        yield* Fiber.join(waiting)
        return early
      }).pipe(Effect.provide(TestClock.layer())),
    )
  expect(await next((s) => s.notify())).toBe(true)
  expect(await next((s) => s.nudge())).toBe(false)
})
