/**
 * A contract's payload as JSON Schema, which the compatibility check and the
 * AsyncAPI document are written in. txbox depends on no validator for it: the
 * schema comes from the contract (`jsonSchema`), from the validator itself
 * when it implements Standard JSON Schema (`~standard.jsonSchema`: valibot
 * through `toStandardJsonSchema` from `@valibot/to-json-schema`, and others
 * natively), or from a converter the caller passes.
 */
import { Effect } from "effect"
import { ConfigError } from "../Errors.ts"
import type { AnyContract, JsonSchema } from "./types.ts"

/** Turns a contract's schema into JSON Schema; undefined when it cannot (the next source is tried). */
export type JsonSchemaConverter = (contract: AnyContract) => JsonSchema | undefined

/** A JSON Schema as the check and the AsyncAPI document read it: keywords by name. */
export type JsonSchemaObject = Readonly<Record<string, unknown>>

/**
 * Draft-07: the draft AsyncAPI's schema format extends, and one Standard JSON
 * Schema asks every implementation to support.
 */
const TARGET = "draft-07"

interface StandardJsonSchemaProps {
  readonly jsonSchema?: {
    readonly input?: (options: { readonly target: string }) => Record<string, unknown>
  }
}

const errorText = (cause: unknown) => (cause instanceof Error ? cause.message : String(cause))

/**
 * The payload's JSON Schema (what the contract accepts as input): the
 * contract's own `jsonSchema` first, then the validator's Standard JSON
 * Schema, then `converter`. None of them → a `ConfigError` saying how to give one.
 */
export const jsonSchemaOf = (
  contract: AnyContract,
  converter?: JsonSchemaConverter,
): Effect.Effect<JsonSchemaObject, ConfigError> =>
  Effect.suspend(() => {
    const name = `${contract.type}@${contract.version}`
    if (contract.jsonSchema !== undefined) return Effect.succeed(contract.jsonSchema as JsonSchemaObject)
    const standard = (contract.schema["~standard"] as StandardJsonSchemaProps).jsonSchema
    if (typeof standard?.input === "function") {
      try {
        return Effect.succeed(standard.input({ target: TARGET }))
      } catch (cause) {
        return Effect.fail(
          new ConfigError({
            reason: `${name}: its schema cannot be converted to JSON Schema: ${errorText(cause)}`,
          }),
        )
      }
    }
    if (converter !== undefined) {
      let converted: JsonSchema | undefined
      try {
        converted = converter(contract)
      } catch (cause) {
        return Effect.fail(
          new ConfigError({
            reason: `${name}: its schema cannot be converted to JSON Schema: ${errorText(cause)}`,
          }),
        )
      }
      if (converted !== undefined) return Effect.succeed(converted as JsonSchemaObject)
    }
    const vendor = contract.schema["~standard"].vendor
    return Effect.fail(
      new ConfigError({
        reason:
          `${name}: no JSON Schema for its ${vendor} schema — give the contract a \`jsonSchema\`, ` +
          "or a schema that implements Standard JSON Schema (valibot: `toStandardJsonSchema(schema)` from @valibot/to-json-schema)",
      }),
    )
  })
