// The statement bound holds inside an uninterruptible cycle, and only the bound interrupts.
import { describe, expect, test } from "bun:test"
import { Context, Effect, Exit, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { bounded } from "../../src/core/bounded.ts"

const run = <A, E>(body: Effect.Effect<A, E>) =>
  Effect.runPromise(body.pipe(Effect.provide(TestClock.layer())))

test("a hung statement inside an uninterruptible cycle fails as a connection error when its bound runs out", () =>
  run(
    Effect.gen(function* () {
      // A driver call whose promise never settles (a query on a dead socket).
      const hung = Effect.promise(() => new Promise<never>(() => {}))
      const cycle = Effect.uninterruptible(Effect.exit(hung.pipe(bounded("claim", 1000))))
      const fiber = yield* Effect.forkChild(cycle)
      yield* TestClock.adjust(1000)
      const exit = yield* Fiber.join(fiber)
      expect(Exit.isFailure(exit)).toBe(true)
      const reason = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
      expect(reason?._tag === "Fail" && reason.error._tag === "StoreError" && reason.error.reason).toBe(
        "connection",
      )
    }),
  ))

test("a shutdown does not cut a bounded statement short inside an uninterruptible cycle", () =>
  run(
    Effect.gen(function* () {
      let finished = false
      const statement = Effect.sleep(500).pipe(Effect.andThen(Effect.sync(() => (finished = true))))
      const fiber = yield* Effect.forkChild(Effect.uninterruptible(statement.pipe(bounded("mark", 10_000))))
      yield* Effect.yieldNow
      const stopping = yield* Effect.forkChild(Fiber.interrupt(fiber))
      yield* TestClock.adjust(500)
      yield* Fiber.join(stopping)
      expect(finished).toBe(true)
    }),
  ))

// On the live clock the bound is a fiber and a timer instead of a race of two fibers: the same rules.
describe("on the live clock", () => {
  test("a hung statement fails as a connection error when its bound runs out, and is interrupted", async () => {
    let interrupted = false
    const hung = Effect.promise(() => new Promise<never>(() => {})).pipe(
      Effect.onInterrupt(() => Effect.sync(() => (interrupted = true))),
    )
    const started = performance.now()
    const exit = await Effect.runPromise(Effect.uninterruptible(Effect.exit(hung.pipe(bounded("claim", 50)))))
    expect(performance.now() - started).toBeGreaterThanOrEqual(45)
    const reason = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
    expect(reason?._tag === "Fail" && reason.error._tag === "StoreError" && reason.error.reason).toBe(
      "connection",
    )
    expect(interrupted).toBe(true)
  })

  test("an answer within the bound passes through: its value, its failure, in the caller's services", async () => {
    class Answer extends Context.Service<Answer, number>()("test/Answer") {}
    const value = await Effect.runPromise(
      Effect.gen(function* () {
        return (yield* Answer) * 2
      }).pipe(bounded("claim", 1000), Effect.provideService(Answer, 21)),
    )
    expect(value).toBe(42)
    const failed = await Effect.runPromise(Effect.exit(Effect.fail("refused").pipe(bounded("mark", 1000))))
    expect(failed).toEqual(Exit.fail("refused"))
  })

  test("a shutdown does not cut a bounded statement short inside an uninterruptible cycle", async () => {
    let finished = false
    const statement = Effect.promise(() => new Promise((r) => setTimeout(r, 100))).pipe(
      Effect.andThen(Effect.sync(() => (finished = true))),
    )
    const fiber = Effect.runFork(Effect.uninterruptible(statement.pipe(bounded("mark", 10_000))))
    await new Promise((r) => setTimeout(r, 10))
    await Effect.runPromise(Fiber.interrupt(fiber))
    expect(finished).toBe(true)
  })

  test("an interruptible caller interrupted while waiting interrupts the statement", async () => {
    let interrupted = false
    const hung = Effect.promise(() => new Promise<never>(() => {})).pipe(
      Effect.onInterrupt(() => Effect.sync(() => (interrupted = true))),
    )
    const fiber = Effect.runFork(hung.pipe(bounded("claim", 10_000)))
    await new Promise((r) => setTimeout(r, 10))
    await Effect.runPromise(Fiber.interrupt(fiber))
    expect(interrupted).toBe(true)
  })
})
