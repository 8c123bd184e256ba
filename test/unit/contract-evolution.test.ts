// Contract evolution without a server: upcast chains, and how the registry resolves every version
// of a type to the contract a consumer handles.
import { describe, expect, test } from "bun:test"
import { Effect, Exit } from "effect"
import * as v from "valibot"
import { type AnyContract, defineEvent, makeRegistry } from "../../src/index.ts"
import { OrderPlacedV1, OrderPlaced as OrderPlacedV2 } from "../fixtures/orders-v2.ts"

const OrderPlacedV3 = defineEvent({
  type: "orders.order-placed",
  version: 3,
  schema: v.object({
    orderId: v.string(),
    total: v.object({ amount: v.number(), currency: v.picklist(["EUR", "USD"]) }),
    channel: v.picklist(["web", "store"]),
  }),
  upcast: { from: OrderPlacedV2, to: (v2) => ({ ...v2, channel: "web" as const }) },
})

const failureOf = <A, E>(effect: Effect.Effect<A, E>): E => {
  const exit = Effect.runSyncExit(effect)
  if (Exit.isSuccess(exit)) throw new Error(`expected a failure, got ${JSON.stringify(exit.value)}`)
  const error = exit.cause.reasons.find((r) => r._tag === "Fail")
  if (error?._tag !== "Fail") throw new Error("expected a typed failure")
  return error.error as E
}

const registryOf = (...contracts: AnyContract[]) => Effect.runSync(makeRegistry(contracts))
const v1Body = JSON.stringify({ orderId: "o-1", total: 12.5, currency: "USD" })

describe("defineEvent with an upcast", () => {
  test("without an upcast a contract is what it was: no upcast field", () => {
    expect("upcast" in OrderPlacedV1).toBe(false)
    expect(OrderPlacedV2.upcast?.from).toBe(OrderPlacedV1)
  })

  test("an upcast must come from the same type's previous version", () => {
    const Other = defineEvent({ type: "billing.invoice", version: 1, schema: v.any() })
    expect(() =>
      defineEvent({
        type: "orders.order-placed",
        version: 3,
        schema: v.any(),
        upcast: { from: OrderPlacedV1, to: (x) => x },
      }),
    ).toThrow("an upcast must come from the same type's previous version (@2)")
    expect(() =>
      defineEvent({
        type: "orders.order-placed",
        version: 2,
        schema: v.any(),
        // @ts-expect-error the upcast's `from` must be a contract of the same type
        upcast: { from: Other, to: (x) => x },
      }),
    ).toThrow("upcasts from billing.invoice@1")
  })

  test("the upcast's input is typed by `from` and its output by the new schema (checked by tsc)", () => {
    const typed = defineEvent({
      type: "orders.order-placed",
      version: 2,
      schema: v.object({ orderId: v.string(), cents: v.number() }),
      upcast: {
        from: OrderPlacedV1,
        to: (v1) => ({ orderId: v1.orderId, cents: Math.round(v1.total * 100) }),
      },
    })
    expect(() =>
      defineEvent({
        type: "orders.order-placed",
        version: 2,
        schema: v.object({ orderId: v.string(), cents: v.number() }),
        // @ts-expect-error `to` must return the new version's input
        upcast: { from: OrderPlacedV1, to: (v1) => ({ orderId: v1.orderId }) },
      }),
    ).not.toThrow()
    expect(typed.version).toBe(2)
  })
})

describe("registry across versions", () => {
  test("an @1 message reaches the @2 contract upcast and validated", () => {
    const decoded = Effect.runSync(registryOf(OrderPlacedV2).decode("orders.order-placed", 1, v1Body))
    expect(decoded.contract).toBe(OrderPlacedV2)
    expect(decoded.upcastFrom).toBe(1)
    expect(decoded.payload).toEqual({ orderId: "o-1", total: { amount: 12.5, currency: "USD" } })
  })

  test("the chain is followed: an @1 message reaches @3 through @2", () => {
    const decoded = Effect.runSync(registryOf(OrderPlacedV3).decode("orders.order-placed", 1, v1Body))
    expect(decoded.contract).toBe(OrderPlacedV3)
    expect(decoded.upcastFrom).toBe(1)
    expect(decoded.payload).toEqual({
      orderId: "o-1",
      total: { amount: 12.5, currency: "USD" },
      channel: "web",
    })
  })

  test("the handled version itself is decoded as it is, without an upcast", () => {
    const body = JSON.stringify({ orderId: "o-2", total: { amount: 3, currency: "EUR" } })
    const decoded = Effect.runSync(registryOf(OrderPlacedV2).decode("orders.order-placed", 2, body))
    expect(decoded).toEqual({
      contract: OrderPlacedV2,
      payload: { orderId: "o-2", total: { amount: 3, currency: "EUR" } },
      upcastFrom: undefined,
    })
  })

  test("a consumer that still registers @1 gets @1 as @1; @2 goes to its @2 contract", () => {
    const registry = registryOf(OrderPlacedV1, OrderPlacedV2)
    expect(Effect.runSync(registry.resolve("orders.order-placed", 1))).toBe(OrderPlacedV1)
    expect(Effect.runSync(registry.resolve("orders.order-placed", 2))).toBe(OrderPlacedV2)
  })

  test("an older version goes to the oldest registered version whose chain reaches it", () => {
    const registry = registryOf(OrderPlacedV2, OrderPlacedV3)
    expect(Effect.runSync(registry.resolve("orders.order-placed", 1))).toBe(OrderPlacedV2)
  })

  test("a message without a version is read as @1, and upcast from there", () => {
    const decoded = Effect.runSync(registryOf(OrderPlacedV2).decode("orders.order-placed", undefined, v1Body))
    expect(decoded.upcastFrom).toBe(1)
    expect(decoded.contract).toBe(OrderPlacedV2)
  })

  test("a newer version than the consumer handles is refused: upgrade the consumer first", () => {
    const error = failureOf(registryOf(OrderPlacedV2).decode("orders.order-placed", 3, "{}"))
    expect(error._tag).toBe("UnknownEventError")
    expect(error.message).toBe(
      "orders.order-placed@3 is newer than this consumer handles (@2): upgrade the consumer first",
    )
  })

  test("an older version no upcast reaches names the versions handled and the fix", () => {
    const Unlinked = defineEvent({ type: "orders.order-placed", version: 2, schema: v.any() })
    const error = failureOf(registryOf(Unlinked).decode("orders.order-placed", 1, v1Body))
    expect(error.message).toBe(
      'event type "orders.order-placed" has no contract for version 1 (this consumer handles @2; declare an upcast chain from @1 to @2)',
    )
    const unversioned = failureOf(registryOf(Unlinked).decode("orders.order-placed", undefined, v1Body))
    expect(unversioned.message).toContain("came without a version (read as 1)")
  })

  test("an old payload is validated against its own version first", () => {
    const error = failureOf(
      registryOf(OrderPlacedV2).decode(
        "orders.order-placed",
        1,
        JSON.stringify({ orderId: "o", total: "12" }),
      ),
    )
    expect(error._tag).toBe("ValidationError")
    expect(error.message).toContain("invalid payload for orders.order-placed@v1: total:")
  })

  test("an upcast result the newer schema refuses is a ValidationError naming the upcast", () => {
    const body = JSON.stringify({ orderId: "o", total: -5, currency: "EUR" })
    const error = failureOf(registryOf(OrderPlacedV2).decode("orders.order-placed", 1, body))
    expect(error._tag).toBe("ValidationError")
    expect(error.message).toContain(
      "invalid payload for orders.order-placed@v2 (upcast from @v1): total.amount:",
    )
  })

  test("an upcast that throws is a ValidationError, not a defect", () => {
    const Throwing = defineEvent({
      type: "orders.order-placed",
      version: 2,
      schema: v.any(),
      upcast: {
        from: OrderPlacedV1,
        to: () => {
          throw new Error("no currency table")
        },
      },
    })
    const error = failureOf(registryOf(Throwing).decode("orders.order-placed", 1, v1Body))
    expect(error.message).toBe(
      "invalid payload for orders.order-placed@v2 (upcast from @v1): upcast from @v1 threw: no currency table",
    )
  })

  test("a hand-built contract whose chain does not fall one version at a time is a ConfigError", () => {
    const broken: AnyContract = { ...OrderPlacedV3, upcast: { from: OrderPlacedV1, to: (x) => x } }
    const error = failureOf(makeRegistry([broken]))
    expect(error._tag).toBe("ConfigError")
    expect(error.message).toContain("must come from the same type's previous version (@2)")
  })
})
