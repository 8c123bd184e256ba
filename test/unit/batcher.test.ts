// How core/batcher.ts groups what waits into flushes: all together by default, or spread over the
// free flushes in shares of `minShare` or more (the inbox's shared transactions).
import { expect, test } from "bun:test"
import { Effect, Exit } from "effect"
import { type BatcherOptions, makeBatcher } from "../../src/core/batcher.ts"

/** The sizes of the flushes `items` were split into, in the order they started. */
const flushSizes = async (items: number, options: BatcherOptions) => {
  const sizes: number[] = []
  const batcher = makeBatcher<number, number, never>(
    (batch) =>
      Effect.sync(() => {
        sizes.push(batch.length)
        return batch.map((value) => ({ ok: true as const, value: value * 2 }))
      }),
    options,
  )
  const exits = await Effect.runPromise(batcher.submitAll(Array.from({ length: items }, (_, i) => i)))
  // Every item answered, each with its own result.
  expect(exits.map((exit) => (Exit.isSuccess(exit) ? exit.value : undefined))).toEqual(
    Array.from({ length: items }, (_, i) => i * 2),
  )
  return sizes
}

test("by default what waits goes together in one flush, up to maxSize", async () => {
  expect(await flushSizes(40, { concurrency: 4 })).toEqual([40])
  expect(await flushSizes(40, { concurrency: 4, maxSize: 16 })).toEqual([16, 16, 8])
})

test("with minShare, what waits is spread evenly over the free flushes, never in shares below it", async () => {
  expect(await flushSizes(40, { concurrency: 4, minShare: 16 })).toEqual([20, 20])
  expect(await flushSizes(40, { concurrency: 4, minShare: 12 })).toEqual([14, 13, 13])
  expect(await flushSizes(100, { concurrency: 4, minShare: 16 })).toEqual([25, 25, 25, 25])
  // Below twice the share: one flush.
  expect(await flushSizes(31, { concurrency: 4, minShare: 16 })).toEqual([31])
  expect(await flushSizes(32, { concurrency: 4, minShare: 16 })).toEqual([16, 16])
  expect(await flushSizes(15, { concurrency: 4, minShare: 16 })).toEqual([15])
  // maxSize still caps a share; what the free flushes cannot take waits for the next.
  expect(await flushSizes(200, { concurrency: 2, minShare: 16, maxSize: 64 })).toEqual([64, 64, 36, 36])
})
