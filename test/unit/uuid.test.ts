// UUIDv7 ids: the outbox's and the inbox's primary keys, drawn from a pooled random buffer.
import { describe, expect, test } from "bun:test"
import { isUuid, uuidv7 } from "../../src/core/uuid.ts"

describe("uuidv7", () => {
  test("version 7, RFC 9562 variant, unique and rising across many pool refills", () => {
    const ids = Array.from({ length: 5_000 }, uuidv7)
    const malformed = ids.filter((id) => !isUuid(id) || id[14] !== "7" || !"89ab".includes(id[19]!))
    expect(malformed).toEqual([])
    expect(new Set(ids).size).toBe(ids.length)
    expect(ids.every((id, i) => i === 0 || ids[i - 1]! < id)).toBe(true)
  })

  test("starts with the current Unix time in milliseconds", () => {
    const before = Date.now()
    const id = uuidv7()
    const ms = Number.parseInt(id.replaceAll("-", "").slice(0, 12), 16)
    expect(ms).toBeGreaterThanOrEqual(before)
    expect(ms).toBeLessThanOrEqual(Date.now() + 1)
  })

  test("the random bits differ between ids (the pool is not reused)", () => {
    const tails = new Set(Array.from({ length: 1_000 }, () => uuidv7().slice(19)))
    expect(tails.size).toBe(1_000)
  })
})
