// The WAL relay's loop (core/walRelay.ts) over a log and a broker of the test's own: what shutdown
// and a failed settle do, which the integration tests (test/integration/wal-relay.test.ts) cannot time.
import { describe, expect, test } from "bun:test"
import { Effect, Fiber } from "effect"
import { makeLoopState } from "../../src/core/leaseLoop.ts"
import { makeRelayCounters, type RelaySettings } from "../../src/core/relayCycle.ts"
import { runWalLoop } from "../../src/core/walRelay.ts"
import type { OutboxLogBatch, OutboxLogShape } from "../../src/ports/OutboxLog.ts"
import type { OutboxMark } from "../../src/ports/OutboxStore.ts"
import type { TransportShape } from "../../src/ports/Transport.ts"
import { makeRetryPolicy } from "../../src/Retry.ts"
import { logRow } from "../support/outboxLogRow.ts"

const settings: RelaySettings = {
  batchSize: 100,
  leaseMs: 30_000,
  statementTimeoutMs: 5_000,
  retry: makeRetryPolicy(),
  outage: makeRetryPolicy({ initialDelay: "10 millis", maxDelay: "10 millis" }),
}

/** What happened, in order: "publish a", "settled a" (its settle ended), "confirm 1". */
const run = async (batches: ReadonlyArray<OutboxLogBatch>, settleMs: number, failSettleOf?: string) => {
  const events: string[] = []
  const queue = [...batches]
  const log: OutboxLogShape = {
    // The next batch, or (none left) never: the loop then waits as on an idle outbox.
    take: () =>
      Effect.suspend(() => {
        const next = queue.shift()
        return next === undefined ? Effect.never : Effect.succeed(next)
      }),
    confirm: (position) => Effect.sync(() => void events.push(`confirm ${position}`)),
    status: Effect.die("not used"),
  }
  const transport = {
    publish: (messages) =>
      Effect.sync(() => {
        events.push(`publish ${messages.map((m) => m.id).join(",")}`)
        return messages.map(() => ({ _tag: "Confirmed" as const }))
      }),
    isConnected: Effect.succeed(true),
  } as Pick<TransportShape, "publish" | "isConnected"> as TransportShape
  const settle = (marks: ReadonlyArray<OutboxMark>) => {
    const ids = marks.map((m) => m.id).join(",")
    return Effect.sleep(settleMs).pipe(
      Effect.andThen(
        ids === failSettleOf
          ? Effect.fail({ _tag: "StoreError", message: "settle failed", retryable: false } as never)
          : Effect.sync(() => {
              events.push(`settled ${ids}`)
              return marks.length
            }),
      ),
    )
  }
  const counters = makeRelayCounters()
  const state = makeLoopState()
  const program = Effect.gen(function* () {
    const fiber = yield* Effect.forkChild(runWalLoop(log, settle, transport, settings, counters, state, 0))
    // Long enough for every batch and its settle; then shutdown, which waits for a settle in flight.
    yield* Effect.sleep(settleMs * batches.length + 300)
    yield* Fiber.interrupt(fiber)
  })
  await Effect.runPromise(program)
  return { events, counters, state }
}

const batch = (position: number, ...ids: string[]): OutboxLogBatch => ({
  rows: ids.map((id) => logRow({ id })),
  position: BigInt(position),
})

describe("the WAL relay's loop", () => {
  test("shutdown waits for the batch still settling: its rows are written sent and its position confirmed", async () => {
    const { events } = await run([batch(1, "a")], 400)
    expect(events).toEqual(["publish a", "settled a", "confirm 1"])
  })

  test("a settle that fails backs the loop off; its position is confirmed, and the batches after it settle", async () => {
    const { events, state, counters } = await run([batch(1, "a"), batch(2, "b"), batch(3, "c")], 100, "a")
    // a's position is confirmed all the same: its rows are still pending, the sweep's.
    expect(events.filter((e) => e.startsWith("settled") || e.startsWith("confirm"))).toEqual([
      "confirm 1",
      "settled b",
      "confirm 2",
      "settled c",
      "confirm 3",
    ])
    expect(counters.published).toBe(2)
    expect(state.consecutiveFailures).toBe(0)
    expect(state.lastSuccessAt).toBeDefined()
  })
})
