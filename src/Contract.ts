/**
 * Event contracts: the shared, versioned description of one kind of message.
 * A contract is a plain value that producer and consumer import from the same
 * module; validation runs on both sides with any Standard Schema validator
 * (valibot first of all).
 */
import { Effect } from "effect"
import type { StandardSchemaV1 } from "effect/StandardSchema"
import { ConfigError, UnknownEventError, ValidationError } from "./Errors.ts"

export interface EventContract<Type extends string = string, A = unknown, I = unknown> {
  readonly type: Type
  readonly version: number
  readonly schema: StandardSchemaV1<I, A>
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

const TYPE_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$/

/**
 * Declares a contract. The type is a routing key too, so it is restricted to
 * letters, digits and `. _ : -` (no `*`/`#`, which are AMQP wildcards).
 */
export const defineEvent = <const Type extends string, S extends StandardSchemaV1>(definition: {
  readonly type: Type
  readonly version: number
  readonly schema: S
}): EventContract<Type, StandardSchemaV1.InferOutput<S>, StandardSchemaV1.InferInput<S>> => {
  if (!TYPE_PATTERN.test(definition.type)) {
    throw new ConfigError({
      reason: `event type ${JSON.stringify(definition.type)} must match ${TYPE_PATTERN.source}`,
    })
  }
  if (!Number.isInteger(definition.version) || definition.version < 1) {
    throw new ConfigError({ reason: `event version must be a positive integer, got ${definition.version}` })
  }
  return {
    type: definition.type,
    version: definition.version,
    schema: definition.schema as unknown as StandardSchemaV1<
      StandardSchemaV1.InferInput<S>,
      StandardSchemaV1.InferOutput<S>
    >,
    Type: undefined as never,
    Encoded: undefined as never,
  }
}

const toIssues = (issues: ReadonlyArray<StandardSchemaV1.Issue>): ValidationError["issues"] =>
  issues.map((issue) => {
    const path = issue.path
      ?.map((segment) => String(typeof segment === "object" ? segment.key : segment))
      .join(".")
    return path ? { message: issue.message, path } : { message: issue.message }
  })

/** Validates `input` against the contract; synchronous schemas stay synchronous. */
export const validate = <C extends AnyContract>(
  contract: C,
  input: unknown,
): Effect.Effect<PayloadOf<C>, ValidationError> => {
  const fail = (issues: ReadonlyArray<StandardSchemaV1.Issue>) =>
    Effect.fail(
      new ValidationError({ type: contract.type, version: contract.version, issues: toIssues(issues) }),
    )
  const done = (result: StandardSchemaV1.Result<PayloadOf<C>>) =>
    result.issues ? fail(result.issues) : Effect.succeed(result.value)
  return Effect.suspend(() => {
    let result: ReturnType<StandardSchemaV1["~standard"]["validate"]>
    try {
      result = contract.schema["~standard"].validate(input)
    } catch (cause) {
      return fail([{ message: `validator threw: ${cause instanceof Error ? cause.message : String(cause)}` }])
    }
    return result instanceof Promise
      ? Effect.flatMap(
          Effect.promise(() => result as Promise<StandardSchemaV1.Result<PayloadOf<C>>>),
          done,
        )
      : done(result as StandardSchemaV1.Result<PayloadOf<C>>)
  })
}

/** Validates and serialises a payload for the wire and the outbox row. */
export const encode = <C extends AnyContract>(
  contract: C,
  input: InputOf<C>,
): Effect.Effect<{ readonly payload: PayloadOf<C>; readonly json: string }, ValidationError> =>
  Effect.flatMap(validate(contract, input), (payload) => {
    // JSON.stringify drops what JSON cannot hold (undefined, functions); a
    // bigint throws. Either way the stored payload must round-trip, so refuse.
    let json: string | undefined
    try {
      json = JSON.stringify(payload)
    } catch (cause) {
      json = undefined
      return Effect.fail(
        new ValidationError({
          type: contract.type,
          version: contract.version,
          issues: [{ message: `payload is not JSON-serialisable: ${(cause as Error).message}` }],
        }),
      )
    }
    if (json === undefined) {
      return Effect.fail(
        new ValidationError({
          type: contract.type,
          version: contract.version,
          issues: [{ message: "payload is not JSON-serialisable" }],
        }),
      )
    }
    return Effect.succeed({ payload, json })
  })

/** Parses (if given text) and validates a received payload. */
export const decode = <C extends AnyContract>(
  contract: C,
  body: string | unknown,
): Effect.Effect<PayloadOf<C>, ValidationError> =>
  Effect.suspend(() => {
    if (typeof body !== "string") return validate(contract, body)
    let parsed: unknown
    try {
      parsed = JSON.parse(body)
    } catch (cause) {
      return Effect.fail(
        new ValidationError({
          type: contract.type,
          version: contract.version,
          issues: [{ message: `malformed JSON: ${(cause as Error).message}` }],
        }),
      )
    }
    return validate(contract, parsed)
  })

/** Resolves `(type, version)` to a contract; built once, read on every delivery. */
export interface Registry {
  readonly contracts: ReadonlyArray<AnyContract>
  readonly resolve: (
    type: string,
    version: number | undefined,
  ) => Effect.Effect<AnyContract, UnknownEventError>
  readonly types: ReadonlyArray<string>
}

/**
 * Builds a registry. Registering the same (type, version) twice is a
 * `ConfigError`: two schemas for one wire format would make decoding depend on
 * registration order.
 */
export const makeRegistry = (contracts: Iterable<AnyContract>): Effect.Effect<Registry, ConfigError> =>
  Effect.suspend(() => {
    const byType = new Map<string, Map<number, AnyContract>>()
    const all: AnyContract[] = []
    for (const contract of contracts) {
      const versions = byType.get(contract.type) ?? new Map<number, AnyContract>()
      if (versions.has(contract.version)) {
        return Effect.fail(
          new ConfigError({ reason: `contract ${contract.type}@v${contract.version} is registered twice` }),
        )
      }
      versions.set(contract.version, contract)
      byType.set(contract.type, versions)
      all.push(contract)
    }
    const resolve = (type: string, version: number | undefined) => {
      const versions = byType.get(type)
      if (!versions) return Effect.fail(new UnknownEventError({ type, version, reason: "unknown-type" }))
      const found = version === undefined ? undefined : versions.get(version)
      return found
        ? Effect.succeed(found)
        : Effect.fail(new UnknownEventError({ type, version, reason: "unknown-version" }))
    }
    return Effect.succeed({ contracts: all, resolve, types: [...byType.keys()] })
  })
