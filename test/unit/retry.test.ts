import { describe, expect, test } from "bun:test"
import { Duration, Effect, Schedule } from "effect"
import { baseDelayMillis, delayFor, makeRetryPolicy, schedule } from "../../src/Retry.ts"

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
