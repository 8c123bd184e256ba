// How many rows a mark wrote, whichever way its statement answers: an UPDATE's count, or
// migration 0020's `outbox_mark_held_sent`, which answers it in a column `updated`.
import { describe, expect, test } from "bun:test"
import { markedCount, updatedOf } from "../../src/storage/sql/fragments.ts"

describe("a mark's count", () => {
  test("an UPDATE's: its row count (no rows come back)", () => {
    expect(updatedOf([], 7)).toBe(7)
    expect(markedCount({ numAffectedRows: 7n, rows: [] })).toBe(7)
  })
  test("a function's: the `updated` column of its one row, whatever the row count says", () => {
    expect(updatedOf([{ updated: 25 }], 1)).toBe(25)
    expect(updatedOf([{ updated: "3" }], 1)).toBe(3)
    expect(markedCount({ rows: [{ updated: 0 }] })).toBe(0)
  })
  test("nothing answered: none", () => {
    expect(markedCount({ rows: [] })).toBe(0)
  })
})
