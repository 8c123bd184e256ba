// What a keyed message tells its consumers about its predecessors (core/keyRoutes.ts): pure logic.
import { describe, expect, test } from "bun:test"
import { afterFor, parseKeyRoutes, topicMatches, withHeader } from "../../src/core/keyRoutes.ts"

describe("key routes", () => {
  test("afterFor: the last predecessor on a bound route, enqueued after the binding began", () => {
    const routes = { placed: [1, 100] as const, paid: [2, 200] as const, shipped: [4, 400] as const }
    const bound = (pattern: string, boundAtMs = 0) => ({ pattern, boundAtMs })
    // Bound to all three: wait for #4.
    expect(afterFor(routes, [bound("placed"), bound("paid"), bound("shipped")], 5)).toBe(4)
    // Not bound to shipped: "not for me"; wait for #2.
    expect(afterFor(routes, [bound("placed"), bound("paid")], 5)).toBe(2)
    // Bound to nothing before it: waits for nothing.
    expect(afterFor(routes, [bound("refunded")], 5)).toBe(0)
    // Bound to paid at 300: #2 (enqueued at 200) never reached the queue; placed's #1 neither.
    expect(afterFor(routes, [bound("placed", 300), bound("paid", 300)], 5)).toBe(0)
    // Bound at 150: #2 (200) is awaited, #1 (100) is not.
    expect(afterFor(routes, [bound("placed", 150), bound("paid", 150)], 5)).toBe(2)
    // Topic patterns, the earliest binding of a route counts.
    expect(afterFor(routes, [bound("#", 500), bound("shipped", 300)], 5)).toBe(4)
    expect(afterFor(routes, [bound("*.x", 0)], 5)).toBe(0)
  })

  test("topicMatches: AMQP topic rules", () => {
    expect(topicMatches("orders.placed", "orders.placed")).toBe(true)
    expect(topicMatches("orders.placed", "orders.paid")).toBe(false)
    expect(topicMatches("orders.*", "orders.paid")).toBe(true)
    expect(topicMatches("orders.*", "orders.paid.eu")).toBe(false)
    expect(topicMatches("orders.#", "orders")).toBe(true)
    expect(topicMatches("orders.#", "orders.paid.eu")).toBe(true)
    expect(topicMatches("#.eu", "orders.paid.eu")).toBe(true)
    expect(topicMatches("#", "anything.at.all")).toBe(true)
    expect(topicMatches("*", "two.words")).toBe(false)
  })

  test("parseKeyRoutes takes only what txbox writes", () => {
    expect(parseKeyRoutes('{"a":[1,100]}')).toEqual({ a: [1, 100] })
    expect(parseKeyRoutes("{}")).toEqual({})
    for (const bad of [
      undefined,
      "",
      "[]",
      "null",
      '{"a":[0,1]}',
      '{"a":[1]}',
      '{"a":[1.5,1]}',
      '{"a":"1"}',
      "{",
    ]) {
      expect(parseKeyRoutes(bad)).toBeUndefined()
    }
  })

  test("withHeader adds a header to a headers JSON text", () => {
    expect(JSON.parse(withHeader("{}", "h", "v"))).toEqual({ h: "v" })
    expect(JSON.parse(withHeader('{"a":"1"}', "h", "v"))).toEqual({ a: "1", h: "v" })
  })
})
