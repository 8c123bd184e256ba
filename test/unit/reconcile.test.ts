// `txbox reconcile`'s pure parts: AMQP topic patterns as regular expressions (run by PostgreSQL;
// these constructs mean the same in JavaScript), and the tally's rules for in flight and missing.
import { describe, expect, test } from "bun:test"
import { makeTally } from "../../src/cli/reconcile.ts"
import { topicRegex } from "../../src/storage/sql/reconcile.ts"

describe("topicRegex", () => {
  const cases: ReadonlyArray<[string, ReadonlyArray<string>, ReadonlyArray<string>]> = [
    [
      "orders.order-placed",
      ["orders.order-placed"],
      ["orders.order-placedx", "xorders.order-placed", "orders"],
    ],
    ["orders.*", ["orders.placed"], ["orders", "orders.a.b", "ordersXplaced"]],
    ["orders.#", ["orders", "orders.a", "orders.a.b"], ["order", "x.orders"]],
    ["#.placed", ["placed", "x.placed", "x.y.placed"], ["xplaced", "placed.x"]],
    ["a.#.b", ["a.b", "a.x.b", "a.x.y.b"], ["ab", "a.b.c", "x.a.b"]],
    ["#", ["", "x", "x.y"], []],
    ["#.#", ["x", "x.y"], []],
    ["*.*", ["a.b"], ["a", "a.b.c"]],
    ["a+b.(c)", ["a+b.(c)"], ["aab.c", "aaab.(c)"]],
  ]
  for (const [pattern, yes, no] of cases) {
    test(`${pattern}: matches ${JSON.stringify(yes)}, not ${JSON.stringify(no)}`, () => {
      const re = new RegExp(topicRegex(pattern))
      expect(yes.filter((k) => !re.test(k))).toEqual([])
      expect(no.filter((k) => re.test(k))).toEqual([])
    })
  }
})

describe("the tally", () => {
  const graceEdge = new Date("2026-11-28T12:00:00Z")
  const owed = (id: string, occurredAt: string, status: "pending" | "sent" | "dead" = "sent") => ({
    id,
    type: "t",
    tenant: null,
    status,
    occurredAt: new Date(occurredAt),
    publishedAt: null,
    attempts: 1,
  })
  const inbox = (id: string, status: "pending" | "processed" | "dead", processedAt?: string) => ({
    id,
    status,
    attempts: 1,
    receivedAt: new Date("2026-11-28T10:00:00Z"),
    processedAt: processedAt === undefined ? null : new Date(processedAt),
  })

  test("an unprocessed message older than the grace edge is missing, with why; a younger one is in flight", () => {
    const tally = makeTally({ by: "day", graceEdge, limit: 10 })
    tally.add(owed("p", "2026-11-28T10:00:00Z"), inbox("p", "processed", "2026-11-28T10:00:00.250Z"))
    tally.add(owed("u", "2026-11-28T10:00:00Z", "pending"), undefined)
    tally.add(owed("x", "2026-11-28T10:00:00Z", "dead"), undefined)
    tally.add(owed("n", "2026-11-28T10:00:00Z"), undefined)
    tally.add(owed("i", "2026-11-28T10:00:00Z"), inbox("i", "pending"))
    tally.add(owed("d", "2026-11-28T10:00:00Z"), inbox("d", "dead"))
    tally.add(owed("y", "2026-11-28T12:00:01Z", "pending"), undefined)
    const [g] = tally.summaries()
    expect(g).toMatchObject({
      bucket: "2026-11-28T00:00:00.000Z",
      owed: 7,
      processed: 1,
      inFlight: 1,
      missing: 5,
    })
    expect(g!.reasons).toEqual({ unpublished: 2, "not received": 1, pending: 1, dead: 1 })
    expect(g!.missingIds.map((m) => m.id)).toEqual(["u", "x", "n", "i", "d"])
    // The outbox's dead row and the inbox's: 2 of 7.
    expect(g!.deadRatio).toBeCloseTo(2 / 7)
    expect(g!.latencyMs.p50).toBe(250)
  })

  test("rows per bucket: by hour, a message a minute after the hour goes to the next one; ids listed up to the limit", () => {
    const tally = makeTally({ by: "hour", graceEdge, limit: 1 })
    tally.add(owed("a", "2026-11-28T09:59:00Z"), undefined)
    tally.add(owed("b", "2026-11-28T10:01:00Z"), undefined)
    tally.add(owed("c", "2026-11-28T10:02:00Z"), undefined)
    const groups = tally.summaries()
    expect(groups.map((g) => [g.bucket, g.missing, g.missingIds.length])).toEqual([
      ["2026-11-28T09:00:00.000Z", 1, 1],
      ["2026-11-28T10:00:00.000Z", 2, 1],
    ])
  })
})
