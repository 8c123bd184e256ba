import { describe, expect, test } from "bun:test"
import { Effect, Exit } from "effect"
import * as v from "valibot"
import { decode, defineEvent, encode, makeRegistry, type PayloadOf } from "../../src/index.ts"

const OrderPlaced = defineEvent({
  type: "orders.order-placed",
  version: 1,
  schema: v.object({ orderId: v.pipe(v.string(), v.uuid()), total: v.number() }),
})
const OrderPlacedV2 = defineEvent({
  type: "orders.order-placed",
  version: 2,
  schema: v.object({ orderId: v.string(), total: v.number(), currency: v.string() }),
})
const id = "0191e1a4-7f6e-7a3c-9b1d-2f4e6a8c0b1d"

const failureOf = <A, E>(effect: Effect.Effect<A, E>): E => {
  const exit = Effect.runSyncExit(effect)
  if (Exit.isSuccess(exit)) throw new Error("expected a failure")
  const error = exit.cause.reasons.find((r) => r._tag === "Fail")
  if (error?._tag !== "Fail") throw new Error("expected a typed failure")
  return error.error as E
}

describe("contracts", () => {
  test("a valid payload encodes to JSON and decodes back", () => {
    const { json } = Effect.runSync(encode(OrderPlaced, { orderId: id, total: 12.5 }))
    expect(JSON.parse(json)).toEqual({ orderId: id, total: 12.5 })
    expect(Effect.runSync(decode(OrderPlaced, json))).toEqual({ orderId: id, total: 12.5 })
  })

  test("an invalid payload is a ValidationError naming the field", () => {
    const error = failureOf(encode(OrderPlaced, { orderId: "not-a-uuid", total: 1 }))
    expect(error._tag).toBe("ValidationError")
    expect(error.retryable).toBe(false)
    expect(error.issues[0]?.path).toBe("orderId")
    expect(error.message).toContain("orders.order-placed@v1")
  })

  test("malformed JSON on decode is a ValidationError, not a throw", () => {
    const error = failureOf(decode(OrderPlaced, "{not json"))
    expect(error._tag).toBe("ValidationError")
    expect(error.message).toContain("malformed JSON")
  })

  test("a payload JSON cannot hold is refused at encode", () => {
    const Loose = defineEvent({ type: "t.loose", version: 1, schema: v.any() })
    expect(failureOf(encode(Loose, { n: 1n })).message).toContain("not JSON-serialisable")
  })

  test("contract types with AMQP wildcards or bad versions are rejected when defined", () => {
    expect(() => defineEvent({ type: "orders.*", version: 1, schema: v.any() })).toThrow(/must match/)
    expect(() => defineEvent({ type: "orders.x", version: 0, schema: v.any() })).toThrow(/positive integer/)
  })

  test("any Standard Schema validator is accepted", () => {
    const schema = {
      "~standard": {
        version: 1 as const,
        vendor: "hand-made",
        validate: (value: unknown) =>
          typeof value === "string" ? { value } : { issues: [{ message: "expected a string" }] },
      },
    }
    const Named = defineEvent({ type: "t.named", version: 1, schema })
    expect(Effect.runSync(decode(Named, '"x"'))).toBe("x")
    expect(failureOf(decode(Named, "1")).message).toContain("expected a string")
  })
})

describe("registry", () => {
  test("resolves a (type, version) pair", () => {
    const registry = Effect.runSync(makeRegistry([OrderPlaced, OrderPlacedV2]))
    expect(Effect.runSync(registry.resolve("orders.order-placed", 2))).toBe(OrderPlacedV2)
    expect(registry.types).toEqual(["orders.order-placed"])
  })

  test("an unknown type is an UnknownEventError with reason unknown-type", () => {
    const registry = Effect.runSync(makeRegistry([OrderPlaced]))
    const error = failureOf(registry.resolve("billing.invoice", 1))
    expect(error._tag).toBe("UnknownEventError")
    expect(error.reason).toBe("unknown-type")
  })

  test("a known type with an unregistered version below the newest is a version mismatch", () => {
    const V3 = defineEvent({ type: "orders.order-placed", version: 3, schema: v.any() })
    const registry = Effect.runSync(makeRegistry([OrderPlaced, V3]))
    const error = failureOf(registry.resolve("orders.order-placed", 2))
    expect(error.reason).toBe("unknown-version")
    expect(error.message).toContain("version 2")
  })

  test("a version newer than every registered one is refused as newer-version", () => {
    const registry = Effect.runSync(makeRegistry([OrderPlaced]))
    const error = failureOf(registry.resolve("orders.order-placed", 3))
    expect(error.reason).toBe("newer-version")
    expect(error.message).toBe(
      "orders.order-placed@3 is newer than this consumer handles (@1): upgrade the consumer first",
    )
  })

  test("registering the same (type, version) twice is a ConfigError", () => {
    const again = defineEvent({ type: "orders.order-placed", version: 1, schema: v.any() })
    const error = failureOf(makeRegistry([OrderPlaced, again]))
    expect(error._tag).toBe("ConfigError")
    expect(error.message).toContain("registered twice")
  })
})

describe("inferred types", () => {
  test("payload types follow the schema (checked by tsc in the test command)", () => {
    const payload: PayloadOf<typeof OrderPlaced> = { orderId: id, total: 1 }
    const typed: typeof OrderPlaced.Type = payload
    // @ts-expect-error total must be a number
    const wrongField: typeof OrderPlaced.Type = { orderId: id, total: "1" }
    // @ts-expect-error orderId is required
    const missing: PayloadOf<typeof OrderPlaced> = { total: 1 }
    // @ts-expect-error encode's input is the contract's input type
    const wrongInput = () => encode(OrderPlaced, { orderId: 1, total: 1 })
    expect([typed, wrongField, missing, typeof wrongInput].length).toBe(4)
  })
})
