// The one retry-or-dead rule, read by the relay, the idempotent inbox and the processor.
import { describe, expect, test } from "bun:test"
import { outage, permanent, publishFailure, transient, verdictFor } from "../../src/core/verdict.ts"
import { makeRetryPolicy } from "../../src/Retry.ts"

const policy = makeRetryPolicy({
  initialDelay: "100 millis",
  factor: 2,
  maxDelay: "1 second",
  maxAttempts: 4,
})
const half = () => 0.5 // jitter factor 1.0

describe("the verdict rule", () => {
  test("a try that did not fail is done", () => {
    expect(verdictFor(0, undefined, policy)).toEqual({ _tag: "Done" })
  })

  test("a transient failure retries with growing backoff and spends an attempt", () => {
    const delays = [0, 1, 2].map((before) => verdictFor(before, transient("boom"), policy, half))
    expect(delays).toEqual([
      { _tag: "Retry", delayMs: 100, error: "boom", spendsAttempt: true },
      { _tag: "Retry", delayMs: 200, error: "boom", spendsAttempt: true },
      { _tag: "Retry", delayMs: 400, error: "boom", spendsAttempt: true },
    ])
  })

  test("maxAttempts tries in all: the try numbered maxAttempts is dead, not one earlier or later", () => {
    expect(verdictFor(2, transient("boom"), policy)._tag).toBe("Retry") // try 3 of 4
    expect(verdictFor(3, transient("boom"), policy)).toEqual({
      _tag: "Dead",
      error: "boom (after 4 attempts)",
    })
  })

  test("an outage never spends an attempt and never makes a message dead, however many came before", () => {
    const v = verdictFor(99, outage("ECONNREFUSED"), policy, half)
    expect(v).toEqual({ _tag: "Retry", delayMs: 1000, error: "ECONNREFUSED", spendsAttempt: false })
  })

  test("a permanent failure is dead at once, on the first try", () => {
    expect(verdictFor(0, permanent("too large"), policy)).toEqual({ _tag: "Dead", error: "too large" })
  })

  test("jitter keeps every retry delay within ±20 % of the base", () => {
    for (const r of [0, 0.25, 0.5, 0.999999]) {
      const v = verdictFor(1, transient("x"), policy, () => r)
      expect(v._tag === "Retry" && v.delayMs >= 160 && v.delayMs <= 240).toBe(true)
    }
  })
})

describe("publish outcomes as failures", () => {
  test("confirmed is success; rejected is permanent; interrupted or timed out (a blocked broker) is an outage; the rest are transient", () => {
    expect(publishFailure({ _tag: "Confirmed" })).toBeUndefined()
    expect(publishFailure({ _tag: "Rejected", error: "too large" })?._tag).toBe("Permanent")
    expect(publishFailure({ _tag: "Interrupted", error: "channel closed" })?._tag).toBe("Outage")
    expect(publishFailure({ _tag: "TimedOut", error: "no confirm within 10000 ms" })?._tag).toBe("Outage")
    for (const tag of ["Nacked", "Returned"] as const) {
      expect(publishFailure({ _tag: tag, error: tag })?._tag).toBe("Transient")
    }
  })
})
