import { describe, expect, test } from "bun:test"
import { CompiledQuery } from "kysely"
import { inlined } from "../../src/storage/sql/heldClaims.ts"

describe("inlined: a held claim's statement with its parameters written in", () => {
  test("integers as they are, text as an escape string with quotes and backslashes doubled", () => {
    const statement = CompiledQuery.raw("SELECT $1, $2, $10", [
      30000,
      `it's a \\ back'slash`,
      ...Array(7).fill(0),
      "ten",
    ])
    expect(inlined(statement)).toBe(`SELECT 30000, E'it''s a \\\\ back''slash', E'ten'`)
  })

  test("what it cannot write safely is refused, never written", () => {
    expect(() => inlined(CompiledQuery.raw("SELECT $1", ["a\0b"]))).toThrow("NUL")
    expect(() => inlined(CompiledQuery.raw("SELECT $1", [1.5]))).toThrow("number")
    expect(() => inlined(CompiledQuery.raw("SELECT $1", [null]))).toThrow("object")
    expect(() => inlined(CompiledQuery.raw("SELECT $1", [new Date()]))).toThrow("object")
  })
})
