/**
 * The producer's side in storage-neutral terms: events validated and encoded
 * by their contracts, each made an outbox row (id, headers, due time), handed
 * to a `WriteOutbox` in the caller's transaction. `Outbox.ts` gives it the
 * SQL writer.
 */
import { Context, Duration, Effect, type Fiber, Tracer } from "effect"
import { type AnyContract, encodeSync, type InputOf } from "../Contract.ts"
import { type ConfigError, type StoreError, ValidationError } from "../Errors.ts"
import { TxboxSchema } from "../ports/Database.ts"
import type { EnqueueRow, Executor, WriteOutbox } from "../ports/OutboxWriter.ts"
import { toConfigError } from "./config.ts"
import { validateSchemaName } from "./identifier.ts"
import * as trace from "./trace.ts"
import { isUuid, uuidv7 } from "./uuid.ts"

/** Per-event options of `Outbox.enqueue`: its id, ordering key, headers, routing and delay. */
export interface EnqueueOptions {
  /** The event id, also the AMQP `messageId` and the inbox dedupe key. A UUID. @default a new UUIDv7 */
  readonly messageId?: string
  /**
   * Numbers the message in its key's sequence (1, 2, 3, … in the order the
   * enqueueing transactions commit), carried to consumers as
   * `envelope.position`. Costs one more statement, and same-key transactions
   * wait for each other from this enqueue to their commit (in
   * `Outbox.transaction`: numbered at the end, one keyed event in the
   * COMMIT's own round trip, the wait only from there).
   */
  readonly partitionKey?: string
  /** The tenant the event belongs to: on its row (`txbox status` and `txbox dead` filter by it) and carried as `envelope.tenantId`. */
  readonly tenantId?: string
  /** Extra string headers carried to the consumer. Names starting with `cloudEvents:` or `txbox-` are reserved. */
  readonly headers?: Readonly<Record<string, string>>
  /** Routing key on the topic exchange. @default the contract's type */
  readonly routingKey?: string
  /** Publish no earlier than this long after commit (measured on the database clock). */
  readonly delay?: Duration.Input
  /** Publish no earlier than this time. Wins over `delay`. */
  readonly visibleAt?: Date
}

/** What enqueue wrote: the outbox row's message id and its contract. Sent once the transaction commits and the relay publishes it. */
export interface EnqueuedMessage {
  /** The message id (the given `messageId` or a new UUIDv7). */
  readonly id: string
  /** The contract's event type. */
  readonly type: string
  /** The contract's version the payload was written as. */
  readonly version: number
}

/** One event of `Outbox.enqueueMany`: what `enqueue` takes as arguments, as a record. */
export interface EventInput<C extends AnyContract = AnyContract> {
  /** The contract the payload is validated and encoded with. */
  readonly contract: C
  /** The payload in the contract's input (encoded) type. */
  readonly payload: InputOf<C>
  /** As for `enqueue`. */
  readonly options?: EnqueueOptions
}

const RESERVED_HEADER = /^(cloudevents[:_]|txbox-|x-txbox-)/i

const invalid = (contract: AnyContract, path: string, message: string) =>
  new ValidationError({ type: contract.type, version: contract.version, issues: [{ message, path }] })

/** One event's outbox row from its validated JSON; nothing touches the database yet. */
const toRow = (
  event: EventInput,
  json: string,
  traceparent: string | undefined,
): EnqueueRow | ValidationError => {
  const { contract, options = {} } = event
  const given = options.messageId
  if (given !== undefined && !isUuid(given))
    return invalid(contract, "messageId", `messageId must be a UUID, got ${JSON.stringify(given)}`)
  const id = given ?? uuidv7()
  let headers = "{}"
  if (options.headers !== undefined || traceparent !== undefined) {
    const given: Record<string, string> = {}
    for (const [key, value] of Object.entries(options.headers ?? {})) {
      if (RESERVED_HEADER.test(key)) return invalid(contract, `headers.${key}`, "header name is reserved")
      if (typeof value !== "string")
        return invalid(contract, `headers.${key}`, "header values must be strings")
      given[key] = value
    }
    if (traceparent && given.traceparent === undefined) given.traceparent = traceparent
    headers = JSON.stringify(given)
  }
  // Database time, not this process's clock: due times compare against now() in the claim.
  let visibleAt: Date | null = null
  let delayMs = 0
  if (options.visibleAt !== undefined) {
    if (!(options.visibleAt instanceof Date) || Number.isNaN(options.visibleAt.getTime())) {
      return invalid(contract, "visibleAt", "visibleAt must be a valid Date")
    }
    visibleAt = options.visibleAt
  } else if (options.delay !== undefined) {
    const ms = Duration.fromInput(options.delay)
    if (ms._tag === "None" || !Duration.isFinite(ms.value)) {
      return invalid(contract, "delay", "delay must be a finite duration")
    }
    delayMs = Math.max(0, Math.round(Duration.toMillis(ms.value)))
  }
  return {
    id,
    type: contract.type,
    version: contract.version,
    payload: json,
    headers,
    routing_key: options.routingKey ?? null,
    partition_key: options.partitionKey ?? null,
    tenant_id: options.tenantId ?? null,
    visible_at: visibleAt,
    delay_ms: delayMs,
  }
}

/** Schema names already checked: the check is a regex, and the name is the same on every call. */
const validSchemas = new Set<string>()

/**
 * Writes many events with one INSERT in the caller's transaction. Every
 * payload is validated first: one invalid event fails the call and nothing is
 * written.
 */
const enqueueManyWith = (
  write: WriteOutbox,
  executor: Executor,
  events: ReadonlyArray<EventInput>,
): Effect.Effect<ReadonlyArray<EnqueuedMessage>, ValidationError | StoreError | ConfigError> =>
  Effect.withFiber((fiber) => {
    if (fiber.getRef(Tracer.Tracer) === Tracer.nativeTracer)
      return enqueueRows(write, executor, events, fiber)
    // A span without the stack trace Effect.fn would capture on every call: enqueue runs once per
    // business transaction, and the trace cost more than the span. None without a tracer.
    return Effect.withSpan(
      "Outbox.enqueue",
      events.length === 0
        ? {}
        : { attributes: { "txbox.count": events.length, "txbox.type": events[0]!.contract.type } },
      { captureStackTrace: false },
    )(Effect.withFiber((inner) => enqueueRows(write, executor, events, inner)))
  })

/**
 * The work of `enqueueMany` in as few fiber steps as it allows: a synchronous
 * validator is called directly, and the only wait is the INSERT itself.
 */
const enqueueRows = (
  write: WriteOutbox,
  executor: Executor,
  events: ReadonlyArray<EventInput>,
  fiber: Fiber.Fiber<unknown, unknown>,
): Effect.Effect<ReadonlyArray<EnqueuedMessage>, ValidationError | StoreError | ConfigError> => {
  // The store layer's schema (or "txbox"): enqueue writes where the relay reads.
  const schema = fiber.getRef(TxboxSchema)
  if (!validSchemas.has(schema)) {
    try {
      validSchemas.add(validateSchemaName(schema))
    } catch (error) {
      return Effect.fail(toConfigError(error))
    }
  }
  if (events.length === 0) return Effect.succeed([])
  // The caller's span (or an external parent it set), carried to consumers as the traceparent.
  const parent = Context.getOption(fiber.context, Tracer.ParentSpan)
  const traceparent = parent._tag === "Some" ? trace.traceparentOf(parent.value) : undefined
  const jsons = new Array<string>(events.length)
  let later: Array<Effect.Effect<void, ValidationError>> | undefined
  for (let i = 0; i < events.length; i++) {
    const event = events[i]!
    const encoded = encodeSync(event.contract, event.payload)
    if (encoded instanceof ValidationError) return Effect.fail(encoded)
    if (Effect.isEffect(encoded)) {
      later ??= []
      later.push(
        Effect.map(encoded, ({ json }) => {
          jsons[i] = json
        }),
      )
    } else jsons[i] = encoded.json
  }
  const written = (): Effect.Effect<ReadonlyArray<EnqueuedMessage>, ValidationError | StoreError> => {
    const rows = new Array<EnqueueRow>(events.length)
    for (let i = 0; i < events.length; i++) {
      const row = toRow(events[i]!, jsons[i]!, traceparent)
      if (row instanceof ValidationError) return Effect.fail(row)
      rows[i] = row
    }
    return Effect.as(
      write(executor, schema, rows),
      rows.map(({ id, type, version }): EnqueuedMessage => ({ id, type, version })),
    )
  }
  return later === undefined ? written() : Effect.flatMap(Effect.all(later, { discard: true }), written)
}

/**
 * `Outbox.enqueue` and `Outbox.enqueueMany` over a writer of rows: the
 * validation and the rows are the same for any storage, the statement is the
 * writer's (`storage/sql/enqueue.ts`).
 */
export const makeEnqueue = (write: WriteOutbox) => {
  const enqueueMany = (
    executor: Executor,
    events: ReadonlyArray<EventInput>,
  ): Effect.Effect<ReadonlyArray<EnqueuedMessage>, ValidationError | StoreError | ConfigError> =>
    enqueueManyWith(write, executor, events)
  const enqueue = <C extends AnyContract>(
    executor: Executor,
    contract: C,
    payload: InputOf<C>,
    options?: EnqueueOptions,
  ): Effect.Effect<EnqueuedMessage, ValidationError | StoreError | ConfigError> =>
    Effect.map(
      enqueueManyWith(write, executor, [
        options === undefined ? { contract, payload } : { contract, payload, options },
      ]),
      (rows) => rows[0]!,
    )
  return { enqueue, enqueueMany }
}
