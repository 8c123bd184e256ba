// The id ranges of the partitioned outbox and inbox (migration 0015): pure arithmetic on UUIDv7 times.
import { describe, expect, test } from "bun:test"
import { UsageError } from "../../src/cli/errors.ts"
import { parseEvery } from "../../src/cli/partitions.ts"
import { uuidv7 } from "../../src/core/uuid.ts"
import {
  boundTime,
  DAY_MS,
  HOUR_MS,
  idBound,
  missingRanges,
  parseRange,
  partitionName,
  partitionStart,
} from "../../src/storage/sql/partitionBounds.ts"

const DAY = Date.UTC(2026, 10, 28)

describe("partition bounds", () => {
  test("a day's bounds hold exactly the UUIDv7 ids made that day, as uuids and as text", () => {
    const from = idBound(DAY)
    const to = idBound(DAY + DAY_MS)
    expect(from).toBe("01a21f73-9c00-0000-0000-000000000000")
    expect(boundTime(from)).toBe(DAY)
    expect(boundTime(to)).toBe(DAY + DAY_MS)
    const now = Date.now()
    const id = uuidv7()
    const start = partitionStart(now, DAY_MS)
    expect(id >= idBound(start)).toBe(true)
    expect(id < idBound(start + DAY_MS)).toBe(true)
    // The last millisecond of a day sorts before the next day's bound, the first one after its own.
    const hex = (ms: number) => ms.toString(16).padStart(12, "0")
    const at = (ms: number) => `${hex(ms).slice(0, 8)}-${hex(ms).slice(8)}-7fff-bfff-ffffffffffff`
    expect(at(DAY + DAY_MS - 1) < to).toBe(true)
    expect(at(DAY) >= from).toBe(true)
    expect(at(DAY - 1) < from).toBe(true)
  })

  test("names tell partitions of any length apart", () => {
    expect(partitionName("outbox", DAY, DAY_MS)).toBe("outbox_p20261128")
    expect(partitionName("inbox", DAY + 13 * HOUR_MS, HOUR_MS)).toBe("inbox_p2026112813")
    expect(partitionName("outbox", DAY + 13 * HOUR_MS + 5 * 60_000, 5 * 60_000)).toBe("outbox_p202611281305")
    expect(partitionName("outbox", DAY + 30_000, 30_000)).toBe("outbox_p20261128000030")
  })

  test("the ranges to make cover now to now + ahead, aligned, around the ones that exist", () => {
    const now = DAY + 5 * HOUR_MS
    expect(missingRanges(now, 2 * DAY_MS, DAY_MS, [])).toEqual([
      { fromMs: DAY, toMs: DAY + DAY_MS },
      { fromMs: DAY + DAY_MS, toMs: DAY + 2 * DAY_MS },
      { fromMs: DAY + 2 * DAY_MS, toMs: DAY + 3 * DAY_MS },
    ])
    // A partition made by hand over the second day, with other bounds: never overlapped.
    expect(
      missingRanges(now, 2 * DAY_MS, DAY_MS, [
        { fromMs: DAY + DAY_MS - HOUR_MS, toMs: DAY + DAY_MS + HOUR_MS },
      ]),
    ).toEqual([{ fromMs: DAY + 2 * DAY_MS, toMs: DAY + 3 * DAY_MS }])
  })

  test("the catalog's range text, and DEFAULT", () => {
    expect(
      parseRange(
        "FOR VALUES FROM ('019ac8e4-8000-0000-0000-000000000000') TO ('019ace0a-dc00-0000-0000-000000000000')",
      ),
    ).toEqual({
      from: "019ac8e4-8000-0000-0000-000000000000",
      to: "019ace0a-dc00-0000-0000-000000000000",
    })
    expect(parseRange("DEFAULT")).toBeUndefined()
    expect(boundTime("not-a-bound")).toBeUndefined()
  })

  test("--every takes whole days or hours that divide a day", () => {
    expect(parseEvery("1d")).toBe(DAY_MS)
    expect(parseEvery("7d")).toBe(7 * DAY_MS)
    expect(parseEvery("6h")).toBe(6 * HOUR_MS)
    expect(() => parseEvery("5h")).toThrow(UsageError)
    expect(() => parseEvery("90m")).toThrow(UsageError)
    expect(() => parseEvery("36h")).toThrow(UsageError)
  })
})
