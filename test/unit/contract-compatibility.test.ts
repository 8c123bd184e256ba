// The compatibility check without a server: JSON Schema from the contract, what each change breaks,
// and the verdict across versions and upcasts.
import { describe, expect, test } from "bun:test"
import { toJsonSchema, toStandardJsonSchema } from "@valibot/to-json-schema"
import { Effect, Exit } from "effect"
import * as v from "valibot"
import {
  type AnyContract,
  checkCompatibility,
  checkContracts,
  defineEvent,
  type JsonSchemaConverter,
  jsonSchemaOf,
} from "../../src/index.ts"
import { OrderPlaced as OrderPlacedV1 } from "../fixtures/orders-v1.ts"
import { OrderPlaced as OrderPlacedV2 } from "../fixtures/orders-v2.ts"
import { OrderPlaced as BreakingV2 } from "../fixtures/orders-v2-breaking.ts"

const valibot: JsonSchemaConverter = (c) =>
  c.schema["~standard"].vendor === "valibot" ? toJsonSchema(c.schema as never) : undefined

/** Two editions of one contract version: old schema, new schema. */
const editions = <A extends v.GenericSchema, B extends v.GenericSchema>(oldSchema: A, newSchema: B) =>
  [
    defineEvent({ type: "t.changed", version: 1, schema: oldSchema }),
    defineEvent({ type: "t.changed", version: 1, schema: newSchema }),
  ] as const

const report = (oldContract: AnyContract, newContract: AnyContract) =>
  Effect.runSync(checkCompatibility(oldContract, newContract, { toJsonSchema: valibot }))

const lines = (findings: ReadonlyArray<{ path: string; change: string }>) =>
  findings.map((f) => `${f.path}: ${f.change}`)

const failureOf = <A, E>(effect: Effect.Effect<A, E>): E => {
  const exit = Effect.runSyncExit(effect)
  if (Exit.isSuccess(exit)) throw new Error("expected a failure")
  const error = exit.cause.reasons.find((r) => r._tag === "Fail")
  if (error?._tag !== "Fail") throw new Error("expected a typed failure")
  return error.error as E
}

describe("JSON Schema of a contract", () => {
  test("the contract's own jsonSchema comes first", () => {
    const jsonSchema = { type: "object", properties: { a: { type: "string" } } }
    const c = defineEvent({ type: "t.own", version: 1, schema: v.any(), jsonSchema })
    expect(Effect.runSync(jsonSchemaOf(c, valibot))).toBe(jsonSchema)
  })

  test("a schema implementing Standard JSON Schema needs no converter", () => {
    const c = defineEvent({
      type: "t.std",
      version: 1,
      schema: toStandardJsonSchema(v.object({ a: v.string() })),
    })
    expect(Effect.runSync(jsonSchemaOf(c))).toMatchObject({
      type: "object",
      properties: { a: { type: "string" } },
      required: ["a"],
    })
  })

  test("with neither and no converter it is a ConfigError saying how to give one", () => {
    const error = failureOf(jsonSchemaOf(OrderPlacedV1))
    expect(error._tag).toBe("ConfigError")
    expect(error.message).toContain("orders.order-placed@1: no JSON Schema for its valibot schema")
    expect(error.message).toContain("toStandardJsonSchema")
  })

  test("a schema the converter cannot express is a ConfigError naming the contract", () => {
    const c = defineEvent({
      type: "t.transform",
      version: 1,
      schema: v.pipe(v.string(), v.transform(Number)),
    })
    const standard = { ...c, schema: toStandardJsonSchema(v.pipe(v.string(), v.transform(Number))) }
    expect(Effect.runSync(jsonSchemaOf(standard))).toMatchObject({ type: "string" })
    const error = failureOf(jsonSchemaOf(c, (x) => toJsonSchema(x.schema as never, { typeMode: "output" })))
    expect(error.message).toContain("t.transform@1: its schema cannot be converted to JSON Schema")
  })
})

describe("what a change breaks", () => {
  test("a removed required field breaks old consumers, not old producers", () => {
    const r = report(...editions(v.object({ a: v.string(), b: v.number() }), v.object({ a: v.string() })))
    expect(lines(r.breaksOldConsumers)).toEqual(["b: required field removed"])
    expect(r.breaksOldProducers).toEqual([])
  })

  test("an added required field breaks old producers; an added optional one breaks nobody", () => {
    const added = report(...editions(v.object({ a: v.string() }), v.object({ a: v.string(), b: v.number() })))
    expect(lines(added.breaksOldProducers)).toEqual(["b: required field added"])
    expect(added.breaksOldConsumers).toEqual([])
    const optional = report(
      ...editions(v.object({ a: v.string() }), v.object({ a: v.string(), b: v.optional(v.number()) })),
    )
    expect(optional.breaksOldProducers).toEqual([])
    expect(optional.breaksOldConsumers).toEqual([])
    expect(optional.compatible).toBe(true)
  })

  test("a retyped field breaks both sides", () => {
    const r = report(...editions(v.object({ total: v.number() }), v.object({ total: v.string() })))
    expect(lines(r.breaksOldProducers)).toEqual(["total: type changed from number to string"])
    expect(lines(r.breaksOldConsumers)).toEqual(["total: type changed from number to string"])
  })

  test("a narrowed enum breaks old producers; a widened one breaks old consumers", () => {
    const r = report(
      ...editions(
        v.object({ c: v.picklist(["EUR", "USD", "GBP"]) }),
        v.object({ c: v.picklist(["EUR", "CHF"]) }),
      ),
    )
    expect(lines(r.breaksOldProducers)).toEqual(['c: enum narrowed: "USD", "GBP" no longer accepted'])
    expect(lines(r.breaksOldConsumers)).toEqual(['c: enum widened: "CHF" added'])
  })

  test("optional becoming required, and required becoming optional", () => {
    const r = report(
      ...editions(
        v.object({ a: v.optional(v.string()), b: v.string() }),
        v.object({ a: v.string(), b: v.optional(v.string()) }),
      ),
    )
    expect(lines(r.breaksOldProducers)).toEqual(["a: optional field became required"])
    expect(lines(r.breaksOldConsumers)).toEqual(["b: required field became optional"])
  })

  test("nullable, nested objects, arrays and bounds are followed", () => {
    const r = report(
      ...editions(
        v.object({
          note: v.nullable(v.string()),
          lines: v.array(v.object({ sku: v.string(), qty: v.number() })),
          code: v.pipe(v.string(), v.maxLength(10)),
          ref: v.string(),
        }),
        v.object({
          note: v.string(),
          lines: v.array(v.object({ sku: v.string(), qty: v.pipe(v.number(), v.integer(), v.minValue(1)) })),
          code: v.pipe(v.string(), v.maxLength(5)),
          ref: v.nullable(v.string()),
        }),
      ),
    )
    expect(lines(r.breaksOldProducers)).toEqual([
      "note: no longer accepts null",
      "lines[].qty: type changed from number to integer",
      "code: maxLength changed from 10 to 5",
    ])
    expect(lines(r.breaksOldConsumers)).toEqual(["ref: now also accepts null"])
  })

  test("a closed object refuses fields the other side sends", () => {
    const r = report(
      ...editions(
        v.strictObject({ a: v.string() }),
        v.strictObject({ a: v.string(), b: v.optional(v.string()) }),
      ),
    )
    expect(r.breaksOldProducers).toEqual([])
    expect(lines(r.breaksOldConsumers)).toEqual(["b: field added, but the old schema refuses unknown fields"])
  })

  test("local $refs are followed", () => {
    const money = { type: "object", properties: { amount: { type: "number" } }, required: ["amount"] }
    const old = defineEvent({
      type: "t.ref",
      version: 1,
      schema: v.any(),
      jsonSchema: { $defs: { money }, type: "object", properties: { total: { $ref: "#/$defs/money" } } },
    })
    const next = defineEvent({
      type: "t.ref",
      version: 1,
      schema: v.any(),
      jsonSchema: {
        $defs: { money: { ...money, properties: { amount: { type: "string" } } } },
        type: "object",
        properties: { total: { $ref: "#/$defs/money" } },
      },
    })
    expect(lines(report(old, next).breaksOldProducers)).toEqual([
      "total.amount: type changed from number to string",
    ])
  })
})

describe("the verdict", () => {
  test("a schema changed in place is incompatible when it breaks either side", () => {
    const consumersOnly = report(
      ...editions(v.object({ c: v.picklist(["a"]) }), v.object({ c: v.picklist(["a", "b"]) })),
    )
    expect(consumersOnly.compatible).toBe(false)
    expect(consumersOnly.notes[0]).toContain("t.changed@1 changed in place")
  })

  test("a new version that breaks old producers without an upcast is incompatible", () => {
    const r = report(OrderPlacedV1, BreakingV2)
    expect(r.compatible).toBe(false)
    expect(r.upcast).toBe(false)
    expect(lines(r.breaksOldProducers)).toEqual([
      "amount: required field added",
      "channel: required field added",
      'currency: enum narrowed: "USD" no longer accepted',
    ])
    expect(lines(r.breaksOldConsumers)).toEqual(["total: required field removed"])
    expect(r.notes[0]).toContain("no upcast from @1 on @2")
  })

  test("the same breaks with an upcast from the old version are compatible", () => {
    const r = report(OrderPlacedV1, OrderPlacedV2)
    expect(r.upcast).toBe(true)
    expect(r.compatible).toBe(true)
    expect(lines(r.breaksOldProducers)).toEqual(["total: type changed from number to object"])
    expect(r.notes).toEqual([
      "@1 messages are upcast to @2 by consumers that register @2",
      "consumers that handle only @1 send @2 messages to dead rows (newer version): upgrade consumers first",
    ])
  })

  test("a version bump that breaks nothing passes, with a note when there is no upcast", () => {
    const V2 = defineEvent({
      type: "orders.order-placed",
      version: 2,
      schema: v.object({
        orderId: v.string(),
        total: v.number(),
        currency: v.picklist(["EUR", "USD"]),
        note: v.optional(v.string()),
      }),
    })
    const r = report(OrderPlacedV1, V2)
    expect(r.compatible).toBe(true)
    expect(r.notes[0]).toContain("sends @1 messages still in flight to dead rows")
  })

  test("two modules: each shared version in place, and the newest old against the newest new", () => {
    const result = Effect.runSync(
      checkContracts({ old: [OrderPlacedV1], new: [OrderPlacedV2] }, { toJsonSchema: valibot }),
    )
    expect(result.reports.map((r) => `${r.oldVersion}->${r.newVersion}:${r.compatible}`)).toEqual([
      "1->1:true",
      "1->2:true",
    ])
    expect(result.compatible).toBe(true)
    const breaking = Effect.runSync(
      checkContracts({ old: [OrderPlacedV1], new: [BreakingV2] }, { toJsonSchema: valibot }),
    )
    expect(breaking.compatible).toBe(false)
  })

  test("one module: consecutive versions of each type, upcast ancestors included", () => {
    const result = Effect.runSync(checkContracts({ new: [OrderPlacedV2] }, { toJsonSchema: valibot }))
    expect(result.reports.map((r) => `${r.type}@${r.oldVersion}->@${r.newVersion}`)).toEqual([
      "orders.order-placed@1->@2",
    ])
  })

  test("a type the new module no longer defines is a note, not a failure", () => {
    const Gone = defineEvent({ type: "t.gone", version: 1, schema: v.string() })
    const result = Effect.runSync(
      checkContracts({ old: [OrderPlacedV1, Gone], new: [OrderPlacedV1] }, { toJsonSchema: valibot }),
    )
    expect(result.compatible).toBe(true)
    expect(result.notes).toEqual([
      "t.gone is no longer defined: its consumers get no new messages, its producers' messages still arrive",
    ])
  })
})
