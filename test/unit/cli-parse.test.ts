import { describe, expect, test } from "bun:test"
import { UsageError } from "../../src/cli/errors.ts"
import { formatAge, parseDuration, parseOutboxId, parseTimeBound } from "../../src/cli/parse.ts"

describe("txbox command flag values", () => {
  test("durations take a unit: s, m, h, d, w", () => {
    expect(parseDuration("older-than", "90s")).toBe(90)
    expect(parseDuration("older-than", "15m")).toBe(900)
    expect(parseDuration("older-than", "2h")).toBe(7200)
    expect(parseDuration("older-than", "7d")).toBe(604_800)
    expect(parseDuration("older-than", "1.5d")).toBe(129_600)
    expect(parseDuration("older-than", "2w")).toBe(1_209_600)
  })

  test("a bare number or an unknown unit is a usage error naming the flag", () => {
    for (const bad of ["7", "7 days", "7y", "-1d", ""]) {
      expect(() => parseDuration("older-than", bad)).toThrow(UsageError)
    }
    expect(() => parseDuration("older-than", "7")).toThrow('--older-than "7" is not a duration')
  })

  test("a time bound is a duration ago, or an ISO date or timestamp read as UTC when it has no offset", () => {
    expect(parseTimeBound("since", "2h")).toEqual({ secondsAgo: 7200 })
    expect(parseTimeBound("since", "2024-05-01")).toEqual({ at: new Date("2024-05-01T00:00:00Z") })
    expect(parseTimeBound("since", "2024-05-01T12:00")).toEqual({ at: new Date("2024-05-01T12:00:00Z") })
    expect(parseTimeBound("since", "2024-05-01 12:00:30.5")).toEqual({
      at: new Date("2024-05-01T12:00:30.500Z"),
    })
    expect(parseTimeBound("since", "2024-05-01T12:00:00+02:00")).toEqual({
      at: new Date("2024-05-01T10:00:00Z"),
    })
    for (const bad of ["yesterday", "2024-13-01", "2024-05-01T25:00", "1714550400"]) {
      expect(() => parseTimeBound("since", bad)).toThrow(UsageError)
    }
  })

  test("outbox ids must be uuids", () => {
    expect(parseOutboxId("0190A3B4-1C2D-7E8F-9A0B-1C2D3E4F5A6B")).toBe("0190a3b4-1c2d-7e8f-9a0b-1c2d3e4f5a6b")
    expect(() => parseOutboxId("42")).toThrow(UsageError)
  })

  test("ages print to their two largest units", () => {
    expect(formatAge(null)).toBe("-")
    expect(formatAge(42.4)).toBe("42s")
    expect(formatAge(200)).toBe("3m 20s")
    expect(formatAge(7500)).toBe("2h 5m")
    expect(formatAge(3 * 86_400 + 4 * 3600 + 59)).toBe("3d 4h")
  })
})
