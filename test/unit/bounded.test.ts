// The statement bound holds inside an uninterruptible cycle, and only the bound interrupts.
import { expect, test } from "bun:test"
import { Effect, Exit, Fiber } from "effect"
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
