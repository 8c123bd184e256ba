/**
 * The types of an event contract, below everything that works with one:
 * `Contract.ts` (which re-exports them) and the rest of contracts/.
 */
import type { StandardSchemaV1 } from "effect/StandardSchema"

/**
 * A JSON Schema document (any draft) as plain JSON. Typed as any object so that
 * converters' own types (valibot's `JSONSchema7` interface) fit as they are.
 */
export type JsonSchema = object

/** How the previous version's validated payload becomes this version's input (synchronously; a throw is a dead row). */
export interface Upcast {
  readonly from: AnyContract
  readonly to: (previous: unknown) => unknown
}

export interface EventContract<Type extends string = string, A = unknown, I = unknown> {
  readonly type: Type
  readonly version: number
  readonly schema: StandardSchemaV1<I, A>
  /** How version − 1 becomes this version; absent on a first version or a version that upcasts nothing. */
  readonly upcast?: Upcast
  /**
   * The payload's JSON Schema, for `txbox contracts check` and `txbox asyncapi`.
   * Absent: taken from the schema itself when it implements Standard JSON Schema
   * (`~standard.jsonSchema`), else from a converter the caller gives.
   */
  readonly jsonSchema?: JsonSchema
  /** The validated payload type; use as `typeof OrderPlaced.Type`. */
  readonly Type: A
  /** The accepted input type (before the schema's transformations). */
  readonly Encoded: I
}

/** Any contract, whatever its payload type. */
// biome-ignore lint/suspicious/noExplicitAny: a registry holds contracts of every payload type
export type AnyContract = EventContract<string, any, any>

export type PayloadOf<C> = C extends { readonly Type: infer A } ? A : never
export type InputOf<C> = C extends { readonly Encoded: infer I } ? I : never
