/**
 * The producer side: write events into the outbox inside the caller's own
 * transaction, so they commit or roll back with the business data.
 */
import { Duration, Effect } from "effect"
import { type Kysely, sql, type Transaction } from "kysely"
import { type AnyContract, encode, type InputOf } from "./Contract.ts"
import { validateConfig } from "./core/config.ts"
import { classifyDbError } from "./core/dbErrors.ts"
import { insertOutbox } from "./core/enqueueStatement.ts"
import { validateSchemaName } from "./core/identifier.ts"
import * as trace from "./core/trace.ts"
import { isUuid, uuidv7 } from "./core/uuid.ts"
import { type ConfigError, type StoreError, ValidationError } from "./Errors.ts"
import { TxboxSchema } from "./ports/Database.ts"
import type { PartitionPosition } from "./ports/Transport.ts"
import type { TxboxDatabase } from "./ports/tables.ts"

export interface EnqueueOptions {
  /** The event id, also the AMQP `messageId` and the inbox dedupe key. A UUID. @default a new UUIDv7 */
  readonly messageId?: string
  /**
   * Numbers the message in its key's sequence (1, 2, 3, … in the order the
   * enqueueing transactions commit), carried to consumers as
   * `envelope.position`. Costs one more statement, and same-key transactions
   * wait for each other from this enqueue to their commit.
   */
  readonly partitionKey?: string
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

/** Any Kysely executor: the caller's transaction (the point) or, for one-off writes, the pool. */
// biome-ignore lint/suspicious/noExplicitAny: enqueue joins whatever database the caller describes
export type Executor = Kysely<any> | Transaction<any>

export interface EnqueuedMessage {
  readonly id: string
  readonly type: string
  readonly version: number
}

export interface EventInput<C extends AnyContract = AnyContract> {
  readonly contract: C
  readonly payload: InputOf<C>
  readonly options?: EnqueueOptions
}

const RESERVED_HEADER = /^(cloudevents[:_]|txbox-|x-txbox-)/i

const invalid = (contract: AnyContract, path: string, message: string) =>
  new ValidationError({ type: contract.type, version: contract.version, issues: [{ message, path }] })

/** Checks one event and turns it into a row; nothing touches the database yet. */
const prepare = (event: EventInput, traceparent: string | undefined) =>
  Effect.gen(function* () {
    const { contract, options = {} } = event
    const { json } = yield* encode(contract, event.payload)
    const id = options.messageId ?? uuidv7()
    if (!isUuid(id))
      return yield* invalid(contract, "messageId", `messageId must be a UUID, got ${JSON.stringify(id)}`)
    const headers: Record<string, string> = {}
    for (const [key, value] of Object.entries(options.headers ?? {})) {
      if (RESERVED_HEADER.test(key))
        return yield* invalid(contract, `headers.${key}`, "header name is reserved")
      if (typeof value !== "string")
        return yield* invalid(contract, `headers.${key}`, "header values must be strings")
      headers[key] = value
    }
    if (traceparent && headers.traceparent === undefined) headers.traceparent = traceparent
    // Database time, not this process's clock: due times compare against now() in the claim.
    let visibleAt: Date | null = null
    let delayMs = 0
    if (options.visibleAt !== undefined) {
      if (!(options.visibleAt instanceof Date) || Number.isNaN(options.visibleAt.getTime())) {
        return yield* invalid(contract, "visibleAt", "visibleAt must be a valid Date")
      }
      visibleAt = options.visibleAt
    } else if (options.delay !== undefined) {
      const ms = Duration.fromInput(options.delay)
      if (ms._tag === "None" || !Duration.isFinite(ms.value)) {
        return yield* invalid(contract, "delay", "delay must be a finite duration")
      }
      delayMs = Math.max(0, Math.round(Duration.toMillis(ms.value)))
    }
    return {
      id,
      type: contract.type,
      version: contract.version,
      payload: json,
      headers: JSON.stringify(headers),
      routing_key: options.routingKey ?? null,
      partition_key: options.partitionKey ?? null,
      tenant_id: options.tenantId ?? null,
      visible_at: visibleAt,
      delay_ms: delayMs,
    }
  })

/**
 * Takes the next numbers of each partition key in `rows` from its counter row,
 * in the caller's transaction: the row lock makes a concurrent transaction for
 * the same key wait for this one to commit, so numbers follow commit order.
 * Keys are locked in sorted order, so two transactions writing the same keys
 * cannot deadlock on them. One statement; none when no row has a key.
 */
const numberByKey = async (
  db: Kysely<TxboxDatabase>,
  rows: ReadonlyArray<{ readonly partition_key: string | null }>,
): Promise<ReadonlyArray<PartitionPosition | undefined>> => {
  const counts = new Map<string, number>()
  for (const { partition_key: key } of rows) if (key !== null) counts.set(key, (counts.get(key) ?? 0) + 1)
  if (counts.size === 0) return []
  const keys = [...counts.keys()].sort()
  const counters = await db
    .insertInto("partition_counters")
    .values(keys.map((key) => ({ partition_key: key, seq: counts.get(key)! })))
    .onConflict((oc) =>
      oc.column("partition_key").doUpdateSet((eb) => ({
        seq: eb("partition_counters.seq", "+", eb.ref("excluded.seq")),
        updated_at: sql<Date>`now()`,
      })),
    )
    .returning((eb) => [
      "partition_key",
      eb.cast<number>("epoch", "double precision").as("epoch"),
      eb.cast<number>("seq", "double precision").as("last"),
    ])
    .execute()
  // This call's numbers for a key are the last `count` of its counter, handed out in row order.
  const next = new Map(
    counters.map((c) => [
      c.partition_key,
      { epoch: c.epoch, seq: c.last - counts.get(c.partition_key)! + 1 },
    ]),
  )
  return rows.map(({ partition_key: key }) => {
    if (key === null) return undefined
    const at = next.get(key)!
    next.set(key, { epoch: at.epoch, seq: at.seq + 1 })
    return at
  })
}

/**
 * Writes many events with one INSERT in the caller's transaction. Every
 * payload is validated first: one invalid event fails the call and nothing is
 * written.
 */
export const enqueueMany = (
  executor: Executor,
  events: ReadonlyArray<EventInput>,
): Effect.Effect<ReadonlyArray<EnqueuedMessage>, ValidationError | StoreError | ConfigError> =>
  // A span without the stack trace Effect.fn would capture on every call: enqueue runs once per
  // business transaction, and the trace cost more than the span. None without a tracer.
  enqueueRows(executor, events).pipe(trace.spanned("Outbox.enqueue", undefined, { captureStackTrace: false }))

const enqueueRows = Effect.fnUntraced(function* (executor: Executor, events: ReadonlyArray<EventInput>) {
  // The store layer's schema (or "txbox"): enqueue writes where the relay reads.
  const configured = yield* TxboxSchema
  const schema = yield* validateConfig(() => validateSchemaName(configured))
  if (events.length === 0) return [] as ReadonlyArray<EnqueuedMessage>
  const traceparent = yield* trace.currentTraceparent
  const rows = yield* Effect.forEach(events, (event) => prepare(event, traceparent))
  yield* Effect.annotateCurrentSpan({ "txbox.count": rows.length, "txbox.type": rows[0]!.type })
  const keyed = rows.some((r) => r.partition_key !== null)
  const write = async (db: Kysely<TxboxDatabase>) => {
    const positions = keyed ? await numberByKey(db.withSchema(schema), rows) : []
    // Payload and headers are bound as text and cast: postgres.js would otherwise encode the JSON
    // string a second time. The text names the schema itself.
    await db.executeQuery(
      insertOutbox(
        schema,
        rows.map((r, i) => ({
          ...r,
          partition_epoch: positions[i]?.epoch ?? null,
          partition_seq: positions[i]?.seq ?? null,
        })),
      ),
    )
  }
  const db = executor as Kysely<TxboxDatabase>
  yield* Effect.tryPromise({
    // Numbers and rows must commit together, or a key would have a gap its consumers wait on
    // forever: outside a transaction, enqueue opens one of its own.
    try: () => (keyed && !executor.isTransaction ? db.transaction().execute(write) : write(db)),
    catch: (cause) => classifyDbError("Outbox.enqueue", cause),
  })
  return rows.map(({ id, type, version }): EnqueuedMessage => ({ id, type, version }))
})

/**
 * Writes one event in the caller's transaction. See `enqueueMany`. The schema
 * is the store layer's (`TxboxSchema`), so run it under the same layer as the
 * relay, or provide `TxboxSchema` when txbox's tables are not in "txbox".
 */
export const enqueue = <C extends AnyContract>(
  executor: Executor,
  contract: C,
  payload: InputOf<C>,
  options?: EnqueueOptions,
): Effect.Effect<EnqueuedMessage, ValidationError | StoreError | ConfigError> =>
  Effect.map(
    enqueueMany(executor, [options === undefined ? { contract, payload } : { contract, payload, options }]),
    (rows) => rows[0]!,
  )
