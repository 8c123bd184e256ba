import { describe, expect, test } from "bun:test"
import { Clock, Duration, Effect, Fiber, Schedule } from "effect"
import { TestClock } from "effect/testing"
import { baseDelayMillis, delayFor, makeRetryPolicy, retryAfterFailure, schedule } from "../../src/Retry.ts"

const policy = makeRetryPolicy({
  initialDelay: "100 millis",
  factor: 2,
  maxDelay: "1 second",
  maxAttempts: 4,
})

describe("retry policy", () => {
  test("delays grow exponentially and stop at the cap", () => {
    expect([1, 2, 3, 4, 5, 6].map((n) => baseDelayMillis(policy, n))).toEqual([
      100, 200, 400, 800, 1000, 1000,
    ])
  })

  test("jitter stays within ±20 %", () => {
    expect(delayFor(policy, 3, 0)).toBe(320)
    expect(delayFor(policy, 3, 0.999999)).toBe(480)
    expect(delayFor({ ...policy, jitter: false }, 3, 0.9)).toBe(400)
  })

  test("the Schedule follows the same numbers", async () => {
    const delays = await Effect.runPromise(
      Effect.gen(function* () {
        const step = yield* Schedule.toStep(schedule({ ...policy, jitter: false }))
        const out: number[] = []
        for (let i = 0; i < 6; i++) out.push(Duration.toMillis((yield* step(0, undefined))[1]))
        return out
      }),
    )
    expect(delays).toEqual([100, 200, 400, 800, 1000, 1000])
  })

  test("bad settings are ConfigErrors", () => {
    expect(() => makeRetryPolicy({ maxAttempts: 0 })).toThrow(/maxAttempts/)
    expect(() => makeRetryPolicy({ factor: 0.5 })).toThrow(/factor/)
    expect(() => makeRetryPolicy({ initialDelay: "2 seconds", maxDelay: "1 second" })).toThrow(/maxDelay/)
    expect(() => makeRetryPolicy({ initialDelay: "soon" as Duration.Input })).toThrow(/retry\.initialDelay/)
  })
})

describe("retryAfterFailure", () => {
  const run = <A, E>(body: Effect.Effect<A, E>) =>
    Effect.runPromise(body.pipe(Effect.provide(TestClock.layer())))
  const fixed = makeRetryPolicy({
    initialDelay: "100 millis",
    factor: 2,
    maxDelay: "1 second",
    jitter: false,
  })

  test("a success runs once, and neither the schedule nor the retries' wrapper is asked", () =>
    run(
      Effect.gen(function* () {
        let runs = 0
        let stepped = 0
        let wrapped = 0
        const counted = Schedule.map(schedule(fixed), (d) =>
          Effect.sync(() => {
            stepped++
            return d
          }),
        )
        const value = yield* retryAfterFailure(
          Effect.sync(() => ++runs),
          { schedule: counted },
          (retrying) =>
            Effect.suspend(() => {
              wrapped++
              return retrying
            }),
        )
        expect([value, runs, stepped, wrapped]).toEqual([1, 1, 0, 0])
      }),
    ))

  test("failures are retried on the schedule's delays, the first one included, then it succeeds", () =>
    run(
      Effect.gen(function* () {
        const at: number[] = []
        const flaky = Effect.flatMap(Clock.currentTimeMillis, (now) => {
          at.push(now)
          return at.length < 4 ? Effect.fail("down" as const) : Effect.succeed("up")
        })
        const fiber = yield* Effect.forkChild(retryAfterFailure(flaky, { schedule: schedule(fixed) }))
        yield* TestClock.adjust(10_000)
        expect(yield* Fiber.join(fiber)).toBe("up")
        expect(at.map((t) => t - at[0]!)).toEqual([0, 100, 300, 700])
      }),
    ))

  test("`while` is asked of the first failure too: one it refuses fails at once; the wrapper bounds the retries", () =>
    run(
      Effect.gen(function* () {
        let runs = 0
        const failing = Effect.suspend(() => {
          runs++
          return Effect.fail(runs === 1 ? "fatal" : "transient")
        })
        const refused = yield* Effect.flip(
          retryAfterFailure(failing, { schedule: schedule(fixed), while: (e) => e !== "fatal" }),
        )
        expect([refused, runs]).toEqual(["fatal", 1])
        runs = 1
        const bounded = yield* Effect.forkChild(
          retryAfterFailure(failing, { schedule: schedule(fixed) }, (retrying) =>
            Effect.timeoutOrElse(retrying, { duration: 350, orElse: () => Effect.fail("gave up" as const) }),
          ),
        )
        yield* TestClock.adjust(10_000)
        expect(yield* Effect.flip(Fiber.join(bounded))).toBe("gave up")
        // The replayed failure, then 100 ms and 200 ms later: the 400 ms delay is past the bound.
        expect(runs).toBe(4)
      }),
    ))
})
