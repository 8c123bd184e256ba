// A claim's lease kept alive while its batch is worked on (core/heartbeat.ts): beats every third
// of the lease, none after the work ends, at most MAX_HOLD_LEASES leases' worth; on the live clock
// (a timer) and on TestClock (a fiber).
import { expect, test } from "bun:test"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { holdingLease, MAX_HOLD_LEASES } from "../../src/core/heartbeat.ts"

const sleepReal = (ms: number) => new Promise((r) => setTimeout(r, ms))

test("live clock: a beat every third of the lease while the work runs, none after it ended", async () => {
  let beats = 0
  const extend = Effect.sync(() => ++beats)
  const result = await Effect.runPromise(
    holdingLease(extend, 60, Effect.promise(() => sleepReal(110)).pipe(Effect.as("done"))),
  )
  expect(result).toBe("done")
  // Beats at ~20, 40, 60, 80, 100 ms; timers may run late on a busy machine, never early.
  expect(beats).toBeGreaterThanOrEqual(2)
  expect(beats).toBeLessThanOrEqual(5)
  const atEnd = beats
  await sleepReal(80)
  expect(beats).toBe(atEnd)
})

test("live clock: a work that ends at once leaves no beat behind, and a failed extension does not stop the beats", async () => {
  let beats = 0
  await Effect.runPromise(
    holdingLease(
      Effect.sync(() => ++beats),
      30,
      Effect.void,
    ),
  )
  await sleepReal(50)
  expect(beats).toBe(0)
  let tries = 0
  const failing = Effect.suspend(() => {
    tries++
    return Effect.fail(new Error("database away") as never)
  })
  await Effect.runPromise(
    holdingLease(
      failing,
      30,
      Effect.promise(() => sleepReal(75)),
    ),
  )
  expect(tries).toBeGreaterThanOrEqual(2)
})

test("live clock: the beats stop after MAX_HOLD_LEASES leases, so a hung worker's rows come back", async () => {
  let beats = 0
  const leaseMs = 6
  await Effect.runPromise(
    holdingLease(
      Effect.sync(() => ++beats),
      leaseMs,
      Effect.promise(() => sleepReal(MAX_HOLD_LEASES * leaseMs * 3)),
    ),
  )
  // Every 2 ms for MAX_HOLD_LEASES leases: 30 beats at most.
  expect(beats).toBeLessThanOrEqual((MAX_HOLD_LEASES * leaseMs) / 2)
  expect(beats).toBeGreaterThan(0)
})

test("TestClock: the same beats, driven by the clock", () =>
  Effect.runPromise(
    Effect.gen(function* () {
      let beats = 0
      const work = Effect.sleep(110)
      const fiber = yield* Effect.forkChild(
        holdingLease(
          Effect.sync(() => ++beats),
          60,
          work,
        ),
      )
      yield* TestClock.adjust(120)
      yield* Effect.promise(() => Effect.runPromise(Effect.void))
      expect(beats).toBe(5)
      yield* TestClock.adjust(100)
      expect(beats).toBe(5)
      return fiber
    }).pipe(Effect.provide(TestClock.layer())),
  ))
