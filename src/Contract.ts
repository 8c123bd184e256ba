/**
 * Event contracts: the shared, versioned description of one kind of message.
 * A contract is a plain value that producer and consumer import from the same
 * module; validation runs on both sides with any Standard Schema validator
 * (valibot first of all). A new version can say how the previous one becomes
 * it (`upcast`), so a consumer's one handler for the newest version also takes
 * every older version still in flight.
 */
import { Effect } from "effect"
import type { StandardSchemaV1 } from "effect/StandardSchema"
import type { AnyContract, EventContract, InputOf, JsonSchema, PayloadOf, Upcast } from "./contracts/types.ts"
import { buildRoutes, checkUpcastFrom, type Route, routeFor } from "./contracts/upcast.ts"
import { ConfigError, UnknownEventError, ValidationError } from "./Errors.ts"

export type { AnyContract, EventContract, InputOf, JsonSchema, PayloadOf, Upcast }

const TYPE_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$/

/**
 * Declares a contract. The type is a routing key too, so it is restricted to
 * letters, digits and `. _ : -` (no `*`/`#`, which are AMQP wildcards).
 *
 * `upcast: { from: OrderPlacedV1, to: (v1) => v2Input }` says how the previous
 * version (same type, version − 1) becomes this one; `from`'s own upcast
 * continues the chain. A consumer registering this contract then receives
 * every older version of the chain upcast and validated against this schema.
 */
export const defineEvent = <
  const Type extends string,
  S extends StandardSchemaV1,
  // biome-ignore lint/suspicious/noExplicitAny: the previous version, whatever its payload type
  From extends EventContract<Type, any, any> = never,
>(definition: {
  readonly type: Type
  readonly version: number
  readonly schema: S
  readonly upcast?: {
    readonly from: From
    readonly to: (previous: PayloadOf<From>) => StandardSchemaV1.InferInput<S>
  }
  readonly jsonSchema?: JsonSchema
}): EventContract<Type, StandardSchemaV1.InferOutput<S>, StandardSchemaV1.InferInput<S>> => {
  if (!TYPE_PATTERN.test(definition.type)) {
    throw new ConfigError({
      reason: `event type ${JSON.stringify(definition.type)} must match ${TYPE_PATTERN.source}`,
    })
  }
  if (!Number.isInteger(definition.version) || definition.version < 1) {
    throw new ConfigError({ reason: `event version must be a positive integer, got ${definition.version}` })
  }
  const upcast = definition.upcast
  if (upcast !== undefined) checkUpcastFrom(definition, upcast.from)
  return {
    type: definition.type,
    version: definition.version,
    schema: definition.schema as unknown as StandardSchemaV1<
      StandardSchemaV1.InferInput<S>,
      StandardSchemaV1.InferOutput<S>
    >,
    ...(upcast === undefined ? {} : { upcast: { from: upcast.from, to: upcast.to as Upcast["to"] } }),
    ...(definition.jsonSchema === undefined ? {} : { jsonSchema: definition.jsonSchema }),
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

type Checked<A> = { readonly value: A } | ValidationError

/**
 * Runs the contract's validator once: its verdict now, or, from an async
 * validator, later. Every check below goes through here.
 */
const check = <C extends AnyContract>(
  contract: C,
  input: unknown,
): Checked<PayloadOf<C>> | Promise<Checked<PayloadOf<C>>> => {
  const verdict = (result: StandardSchemaV1.Result<PayloadOf<C>>): Checked<PayloadOf<C>> =>
    result.issues
      ? new ValidationError({
          type: contract.type,
          version: contract.version,
          issues: toIssues(result.issues),
        })
      : { value: result.value }
  let result: ReturnType<StandardSchemaV1["~standard"]["validate"]>
  try {
    result = contract.schema["~standard"].validate(input)
  } catch (cause) {
    return new ValidationError({
      type: contract.type,
      version: contract.version,
      issues: [{ message: `validator threw: ${cause instanceof Error ? cause.message : String(cause)}` }],
    })
  }
  // A rejected promise is the validator failing, not a verdict on the payload: a typed error the
  // inbox retries (an attempt spent, dead after maxAttempts), never a defect.
  const unavailable = (cause: unknown): Checked<PayloadOf<C>> =>
    new ValidationError({
      type: contract.type,
      version: contract.version,
      issues: [{ message: `validator failed: ${cause instanceof Error ? cause.message : String(cause)}` }],
      validatorFailed: true,
    })
  return result instanceof Promise
    ? (result as Promise<StandardSchemaV1.Result<PayloadOf<C>>>).then(verdict, unavailable)
    : verdict(result as StandardSchemaV1.Result<PayloadOf<C>>)
}

const fromChecked = <A>(checked: Checked<A>): Effect.Effect<A, ValidationError> =>
  checked instanceof ValidationError ? Effect.fail(checked) : Effect.succeed(checked.value)

/** Validates `input` against the contract; synchronous schemas stay synchronous. */
export const validate = <C extends AnyContract>(
  contract: C,
  input: unknown,
): Effect.Effect<PayloadOf<C>, ValidationError> =>
  Effect.suspend(() => {
    const checked = check(contract, input)
    return checked instanceof Promise
      ? Effect.flatMap(
          Effect.promise(() => checked),
          fromChecked,
        )
      : fromChecked(checked)
  })

type Encoded<C extends AnyContract> = { readonly payload: PayloadOf<C>; readonly json: string }

/** Serialises a validated payload, or says why it cannot round-trip through JSON. */
const serialise = <C extends AnyContract>(
  contract: C,
  checked: Checked<PayloadOf<C>>,
): Encoded<C> | ValidationError => {
  if (checked instanceof ValidationError) return checked
  const payload = checked.value
  // JSON.stringify drops what JSON cannot hold (undefined, functions); a
  // bigint throws. Either way the stored payload must round-trip, so refuse.
  let json: string | undefined
  let why = "payload is not JSON-serialisable"
  try {
    json = JSON.stringify(payload)
  } catch (cause) {
    why = `payload is not JSON-serialisable: ${(cause as Error).message}`
  }
  return json === undefined
    ? new ValidationError({ type: contract.type, version: contract.version, issues: [{ message: why }] })
    : { payload, json }
}

/**
 * `encode` without an Effect, for a validator that answers synchronously (the
 * common case: enqueue runs once per business transaction, and a fiber step
 * per check cost more than the check). An async validator's answer comes back
 * as an Effect to wait for.
 */
export const encodeSync = <C extends AnyContract>(
  contract: C,
  input: InputOf<C>,
): Encoded<C> | ValidationError | Effect.Effect<Encoded<C>, ValidationError> => {
  const checked = check(contract, input)
  if (!(checked instanceof Promise)) return serialise(contract, checked)
  return Effect.flatMap(
    Effect.promise(() => checked),
    (later) => {
      const encoded = serialise(contract, later)
      return encoded instanceof ValidationError ? Effect.fail(encoded) : Effect.succeed(encoded)
    },
  )
}

/** Validates and serialises a payload for the wire and the outbox row. */
export const encode = <C extends AnyContract>(
  contract: C,
  input: InputOf<C>,
): Effect.Effect<Encoded<C>, ValidationError> =>
  Effect.suspend(() => {
    const encoded = encodeSync(contract, input)
    return encoded instanceof ValidationError
      ? Effect.fail(encoded)
      : Effect.isEffect(encoded)
        ? encoded
        : Effect.succeed(encoded)
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

/** A received payload decoded for the contract that handles it. */
export interface Decoded {
  /** The registered contract the payload now conforms to (its handler's). */
  readonly contract: AnyContract
  /** The payload validated against `contract`'s schema (its `Type`), after any upcasts. */
  readonly payload: unknown
  /** The version the message was sent as, when it was upcast to `contract.version`. */
  readonly upcastFrom: number | undefined
}

/**
 * Resolves `(type, version)` to a contract; built once, read on every delivery.
 * An older version reaches the registered contract whose upcast chain covers
 * it; a version newer than every registered one is refused (`newer-version`).
 * A message without a version is read as version 1.
 */
export interface Registry {
  /** Every contract registered, as given. */
  readonly contracts: ReadonlyArray<AnyContract>
  /** The registered contract that handles a sent `(type, version)`, directly or through upcasts. */
  readonly resolve: (
    type: string,
    version: number | undefined,
  ) => Effect.Effect<AnyContract, UnknownEventError>
  /** Parses and validates a received body as sent, upcasting it (validated at every step) to the contract that handles it. */
  readonly decode: (
    type: string,
    version: number | undefined,
    body: string | unknown,
  ) => Effect.Effect<Decoded, UnknownEventError | ValidationError>
  /** The distinct event types registered: what an inbox subscribes its queue to. */
  readonly types: ReadonlyArray<string>
}

/** Runs one upcast step; a throwing `to` is a validation failure of the message, not a crash. */
const upcastStep = (
  next: AnyContract,
  payload: unknown,
  sent: number,
): Effect.Effect<unknown, ValidationError> =>
  Effect.suspend(() => {
    const upcast = next.upcast!
    let input: unknown
    try {
      input = upcast.to(payload)
    } catch (cause) {
      const message = `upcast from @v${upcast.from.version} threw: ${cause instanceof Error ? cause.message : String(cause)}`
      return Effect.fail(
        new ValidationError({
          type: next.type,
          version: next.version,
          issues: [{ message }],
          upcastFrom: sent,
        }),
      )
    }
    return validate(next, input).pipe(
      Effect.mapError(
        (e) =>
          new ValidationError({
            type: e.type,
            version: e.version,
            issues: e.issues,
            upcastFrom: sent,
            ...(e.validatorFailed ? { validatorFailed: true } : {}),
          }),
      ),
    )
  })

const decodeRoute = (route: Route, body: string | unknown): Effect.Effect<Decoded, ValidationError> => {
  const [sent, ...rest] = route.steps
  const first = decode(sent!, body)
  if (rest.length === 0) {
    return Effect.map(first, (payload) => ({ contract: route.target, payload, upcastFrom: undefined }))
  }
  return Effect.gen(function* () {
    let payload: unknown = yield* first
    for (const next of rest) payload = yield* upcastStep(next, payload, sent!.version)
    return { contract: route.target, payload, upcastFrom: sent!.version }
  })
}

/**
 * Builds a registry. Registering the same (type, version) twice is a
 * `ConfigError`: two schemas for one wire format would make decoding depend on
 * registration order.
 */
export const makeRegistry = (contracts: Iterable<AnyContract>): Effect.Effect<Registry, ConfigError> =>
  Effect.suspend(() => {
    const all = [...contracts]
    let table: ReturnType<typeof buildRoutes>
    try {
      table = buildRoutes(all)
    } catch (error) {
      if (error instanceof ConfigError) return Effect.fail(error)
      throw error
    }
    const resolve = (type: string, version: number | undefined) => {
      const route = routeFor(table, type, version)
      return route instanceof UnknownEventError ? Effect.fail(route) : Effect.succeed(route.target)
    }
    const decodeBody = (type: string, version: number | undefined, body: string | unknown) => {
      const route = routeFor(table, type, version)
      return route instanceof UnknownEventError ? Effect.fail(route) : decodeRoute(route, body)
    }
    return Effect.succeed({ contracts: all, resolve, decode: decodeBody, types: [...table.keys()] })
  })
