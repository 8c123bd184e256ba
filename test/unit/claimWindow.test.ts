// How far back a relay's claim looks (storage/sql/claimWindow.ts): bounded claims between full ones.
import { describe, expect, test } from "bun:test"
import {
  ALL_MS,
  FULL_EVERY_MS,
  MAX_FULL_EVERY_MS,
  makeClaimWindow,
  RECENT_MS,
} from "../../src/storage/sql/claimWindow.ts"

describe("claim window", () => {
  test("the first claim looks at every row; after a short one, claims look back RECENT_MS until a second has passed", () => {
    const w = makeClaimWindow()
    expect(w.next(0)).toBe(ALL_MS)
    w.record(ALL_MS, 0, 2, 3, 100)
    expect(w.next(10)).toBe(RECENT_MS)
    w.record(RECENT_MS, 10, 1, 5, 100)
    expect(w.next(FULL_EVERY_MS - 1)).toBe(RECENT_MS)
    expect(w.next(FULL_EVERY_MS)).toBe(ALL_MS)
  })

  test("a full batch means a backlog: claims look at every row until one comes back short", () => {
    const w = makeClaimWindow()
    w.record(ALL_MS, 0, 2, 100, 100)
    expect(w.next(5)).toBe(ALL_MS)
    w.record(ALL_MS, 5, 2, 40, 100)
    expect(w.next(6)).toBe(RECENT_MS)
    // A bounded claim that comes back full: older rows may wait behind, look at every row again.
    w.record(RECENT_MS, 6, 1, 100, 100)
    expect(w.next(7)).toBe(ALL_MS)
  })

  test("slow full claims (a long snapshot) are spaced at 50 times their time, up to MAX_FULL_EVERY_MS", () => {
    const w = makeClaimWindow()
    // One slow claim alone (a connection opened): the next full claim still comes a second later.
    w.record(ALL_MS, 0, 200, 1, 100)
    expect(w.next(FULL_EVERY_MS)).toBe(ALL_MS)
    // Two in a row: spaced at 50 times the quicker one.
    w.record(ALL_MS, 1_000, 300, 1, 100)
    expect(w.next(10_999)).toBe(RECENT_MS)
    expect(w.next(11_000)).toBe(ALL_MS)
    w.record(ALL_MS, 11_000, 5_000, 1, 100)
    w.record(ALL_MS, 11_000 + 10_000, 6_000, 1, 100)
    expect(w.next(21_000 + MAX_FULL_EVERY_MS - 1)).toBe(RECENT_MS)
    expect(w.next(21_000 + MAX_FULL_EVERY_MS)).toBe(ALL_MS)
  })
})
