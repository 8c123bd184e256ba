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
  /** The previous version's contract (same type, version − 1). */
  readonly from: AnyContract
  /** Maps a payload valid for `from` to this version's input; the result is validated against this schema. */
  readonly to: (previous: unknown) => unknown
}

/**
 * One version of one event type, as `defineEvent` makes it: what enqueue
 * validates against and what an inbox handler is registered for.
 */
export interface EventContract<Type extends string = string, A = unknown, I = unknown> {
  /** The event type: the default routing key and, with `version`, what a message is decoded by. */
  readonly type: Type
  /** The payload's version, a positive integer; carried with every message. */
  readonly version: number
  /** Any Standard Schema validator (Effect Schema, Zod, Valibot, ArkType…) of the payload. */
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

/** A contract's validated payload type: what handlers receive. */
export type PayloadOf<C> = C extends { readonly Type: infer A } ? A : never
/** A contract's input (encoded) type: what enqueue accepts. */
export type InputOf<C> = C extends { readonly Encoded: infer I } ? I : never
