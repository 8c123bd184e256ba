/**
 * The producer side: write events into the outbox inside the caller's own
 * transaction, so they commit or roll back with the business data.
 */
import { Context, Duration, Effect, type Fiber, Tracer } from "effect"
import { type Kysely, sql, type Transaction } from "kysely"
import { type AnyContract, encodeSync, type InputOf } from "./Contract.ts"
import { toConfigError } from "./core/config.ts"
import { classifyDbError } from "./core/dbErrors.ts"
import { insertOutbox } from "./core/enqueueStatement.ts"
import { validateSchemaName } from "./core/identifier.ts"
import { formatKeyRoutes, type KeyRoutes, withHeader } from "./core/keyRoutes.ts"
import { PARTITION_ROUTES_HEADER } from "./core/position.ts"
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

/** One event's outbox row from its validated JSON; nothing touches the database yet. */
const toRow = (event: EventInput, json: string, traceparent: string | undefined) => {
  const { contract, options = {} } = event
  const id = options.messageId ?? uuidv7()
  if (!isUuid(id))
    return invalid(contract, "messageId", `messageId must be a UUID, got ${JSON.stringify(id)}`)
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

type Row = Exclude<ReturnType<typeof toRow>, ValidationError>

/** Schema names already checked: the check is a regex, and the name is the same on every call. */
const validSchemas = new Set<string>()

/** The database's clock in ms since 1970: the enqueue time a message's successors carry for it. */
const NOW_MS = sql<number>`(extract(epoch FROM now()) * 1000)::bigint`

/** A keyed row's place, and the last message before it on each route of its key (`KeyRoutes`). */
interface Numbered extends PartitionPosition {
  readonly routes: KeyRoutes
}

/**
 * Takes the next numbers of each partition key in `rows` from its counter
 * row, in the caller's transaction: the row lock makes a concurrent
 * transaction for the same key wait for this one to commit, so numbers follow
 * commit order. Keys are locked in sorted order, so two transactions writing
 * the same keys cannot deadlock on them. The counter also keeps, per routing
 * key, its last message (number, enqueue time) and hands back what it held
 * before this statement (`routes_before`, read under the lock), from which
 * each row learns the last message before it on every route of its key. One
 * statement; none when no row has a key.
 */
const numberByKey = async (
  db: Kysely<TxboxDatabase>,
  rows: ReadonlyArray<{ readonly partition_key: string | null; readonly route: string }>,
): Promise<ReadonlyArray<Numbered | undefined>> => {
  // Per key: how many rows, and per route the (1-based) index of its last row among them.
  const perKey = new Map<string, { count: number; lastOn: Record<string, number> }>()
  for (const { partition_key: key, route } of rows) {
    if (key === null) continue
    const entry = perKey.get(key) ?? { count: 0, lastOn: {} }
    entry.count++
    entry.lastOn[route] = entry.count
    perKey.set(key, entry)
  }
  if (perKey.size === 0) return []
  // One JSON parameter for every key, in sorted order (the order their rows are locked in).
  const input = JSON.stringify(
    [...perKey.keys()]
      .sort()
      .map((key) => ({ key, count: perKey.get(key)!.count, last_on: perKey.get(key)!.lastOn })),
  )
  const k = sql<{
    key: string
    count: number
    last_on: string
  }>`jsonb_to_recordset(${input}::text::jsonb)`.as<"k">(sql`k(key text, count int, last_on jsonb)`)
  const counters = await db
    .insertInto("partition_counters")
    .columns(["partition_key", "seq", "routes"])
    .expression((eb) =>
      eb
        .selectFrom(k)
        .select([
          "k.key",
          "k.count",
          // A new key's numbers start at 1: each route's last is its index.
          sql<string>`(SELECT jsonb_object_agg(r, jsonb_build_array(i::bigint, ${NOW_MS}))
            FROM jsonb_each_text(k.last_on) AS e(r, i))`.as("routes"),
        ])
        .orderBy("k.key"),
    )
    .onConflict((oc) =>
      oc.column("partition_key").doUpdateSet((eb) => ({
        seq: eb("partition_counters.seq", "+", eb.ref("excluded.seq")),
        updated_at: sql<Date>`now()`,
        routes_before: sql<string>`partition_counters.routes`,
        // This call's routes, numbered after the counter's last message.
        routes: sql<string>`partition_counters.routes || (
          SELECT jsonb_object_agg(r, jsonb_build_array(partition_counters.seq + (v ->> 0)::bigint, v -> 1))
          FROM jsonb_each(excluded.routes) AS e(r, v))`,
      })),
    )
    .returning((eb) => [
      "partition_key",
      eb.cast<number>("epoch", "double precision").as("epoch"),
      eb.cast<number>("seq", "double precision").as("last"),
      // A new key's row has the column's default ({}): nothing before it.
      "routes_before",
      NOW_MS.as("now_ms"),
    ])
    .execute()
  // Each key's rows in order: the numbers after the counter's last, and the routes as they stood.
  const state = new Map(
    counters.map((c) => {
      const current: Record<string, readonly [number, number]> = {}
      for (const [route, entry] of Object.entries(c.routes_before ?? {}))
        current[route] = [Number(entry[0]), Number(entry[1])]
      return [
        c.partition_key,
        {
          epoch: c.epoch,
          next: c.last - perKey.get(c.partition_key)!.count + 1,
          now: Number(c.now_ms),
          current,
        },
      ]
    }),
  )
  return rows.map(({ partition_key: key, route }) => {
    if (key === null) return undefined
    const at = state.get(key)!
    const numbered: Numbered = { epoch: at.epoch, seq: at.next, routes: { ...at.current } }
    at.current[route] = [at.next, at.now]
    at.next++
    return numbered
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
  Effect.withFiber((fiber) => {
    if (fiber.getRef(Tracer.Tracer) === Tracer.nativeTracer) return enqueueRows(executor, events, fiber)
    // A span without the stack trace Effect.fn would capture on every call: enqueue runs once per
    // business transaction, and the trace cost more than the span. None without a tracer.
    return Effect.withSpan(
      "Outbox.enqueue",
      events.length === 0
        ? {}
        : { attributes: { "txbox.count": events.length, "txbox.type": events[0]!.contract.type } },
      { captureStackTrace: false },
    )(Effect.withFiber((inner) => enqueueRows(executor, events, inner)))
  })

/**
 * The work of `enqueueMany` in as few fiber steps as it allows: a synchronous
 * validator is called directly, and the only wait is the INSERT itself.
 */
const enqueueRows = (
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
  const write = (): Effect.Effect<ReadonlyArray<EnqueuedMessage>, ValidationError | StoreError> => {
    const rows = new Array<Row>(events.length)
    for (let i = 0; i < events.length; i++) {
      const row = toRow(events[i]!, jsons[i]!, traceparent)
      if (row instanceof ValidationError) return Effect.fail(row)
      rows[i] = row
    }
    return insertRows(executor, schema, rows)
  }
  return later === undefined ? write() : Effect.flatMap(Effect.all(later, { discard: true }), write)
}

const insertRows = (executor: Executor, schema: string, rows: ReadonlyArray<Row>) => {
  const keyed = rows.some((r) => r.partition_key !== null)
  const write = async (db: Kysely<TxboxDatabase>) => {
    const positions = keyed
      ? await numberByKey(
          db.withSchema(schema),
          rows.map((r) => ({ partition_key: r.partition_key, route: r.routing_key ?? r.type })),
        )
      : []
    // Payload and headers are bound as text and cast: postgres.js would otherwise encode the JSON
    // string a second time. The text names the schema itself.
    await db.executeQuery(
      insertOutbox(
        schema,
        rows.map((r, i) => {
          const at = positions[i]
          return at === undefined
            ? { ...r, partition_epoch: null, partition_seq: null }
            : {
                ...r,
                headers: withHeader(r.headers, PARTITION_ROUTES_HEADER, formatKeyRoutes(at.routes)),
                partition_epoch: at.epoch,
                partition_seq: at.seq,
              }
        }),
      ),
    )
  }
  // The caller's plugins (a CamelCasePlugin, say) would rename txbox's columns and result rows:
  // its statements run without them, still on the caller's connection and transaction.
  const db = executor.withoutPlugins() as Kysely<TxboxDatabase>
  return Effect.tryPromise({
    // Numbers and rows must commit together, or a key would have a gap its consumers wait on
    // forever: outside a transaction, enqueue opens one of its own.
    try: () => (keyed && !executor.isTransaction ? db.transaction().execute(write) : write(db)),
    catch: (cause) => classifyDbError("Outbox.enqueue", cause),
  }).pipe(Effect.as(rows.map(({ id, type, version }): EnqueuedMessage => ({ id, type, version }))))
}

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
