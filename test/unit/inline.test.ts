import { describe, expect, test } from "bun:test"
import { CompiledQuery } from "kysely"
import { inlined } from "../../src/storage/sql/inline.ts"

describe("inlined: a statement with its parameters written in (held claims, Outbox.transaction's commit)", () => {
  test("integers as they are, text as an escape string with quotes and backslashes doubled", () => {
    const statement = CompiledQuery.raw("SELECT $1, $2, $10", [
      30000,
      `it's a \\ back'slash`,
      ...Array(7).fill(0),
      "ten",
    ])
    expect(inlined(statement)).toBe(`SELECT 30000, E'it''s a \\\\ back''slash', E'ten'`)
  })

  test("NULL as NULL, a Date as its ISO text (the statement casts it)", () => {
    const at = new Date(Date.UTC(2026, 11, 5, 14, 30, 0, 123))
    expect(inlined(CompiledQuery.raw("SELECT $1::timestamptz, $2", [at, null]))).toBe(
      "SELECT '2026-12-05T14:30:00.123Z'::timestamptz, NULL",
    )
  })

  test("what it cannot write safely is refused, never written", () => {
    expect(() => inlined(CompiledQuery.raw("SELECT $1", ["a\0b"]))).toThrow("NUL")
    expect(() => inlined(CompiledQuery.raw("SELECT $1", [1.5]))).toThrow("number")
    expect(() => inlined(CompiledQuery.raw("SELECT $1", [undefined]))).toThrow("undefined")
    expect(() => inlined(CompiledQuery.raw("SELECT $1", [new Date(Number.NaN)]))).toThrow("object")
    expect(() => inlined(CompiledQuery.raw("SELECT $1", [{ a: 1 }]))).toThrow("object")
  })
})
