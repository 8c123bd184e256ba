/**
 * The statements of `Outbox.enqueue`, run in the caller's own transaction:
 * the per-key numbering on `partition_counters` (only when a row has a
 * partition key) and the outbox INSERT.
 *
 * The INSERT also wakes idle relays (see `wakeCheck`): the NOTIFY that a
 * trigger sent before migration 0013, asked only when needed.
 *
 * The outbox INSERT is SQL text written once per schema.
 * Kysely's builder built and compiled the statement on every call, at a
 * large share of enqueue's client CPU (bench/enqueue.ts); the text depends on
 * the schema and on one row vs. several, so two texts per schema cover every
 * call. Sent as a raw compiled query, it also skips the caller's plugins,
 * which must not rename txbox's columns anyway.
 */
import { Effect } from "effect"
import {
  type CompiledQuery,
  DummyDriver,
  type InferResult,
  Kysely,
  PostgresAdapter,
  PostgresIntrospector,
  PostgresQueryCompiler,
  sql,
} from "kysely"
import { formatKeyRoutes, type KeyRoutes, withHeader } from "../../core/keyRoutes.ts"
import { PARTITION_ROUTES_HEADER } from "../../core/position.ts"
import type { StoreError } from "../../Errors.ts"
import type { EnqueueRow, Executor, SqlClient, WriteOutbox } from "../../ports/OutboxWriter.ts"
import type { PartitionPosition } from "../../ports/Transport.ts"
import type { TxboxDatabase } from "../../ports/tables.ts"
import { behindHint, classifyDbError } from "./errors.ts"
import { inlined } from "./inline.ts"
import { rawStatement } from "./rawStatement.ts"

/** One outbox row, its values as the statement binds them: the row enqueue gave, and its place in its key. */
interface OutboxValues extends EnqueueRow {
  readonly partition_epoch: number | null
  readonly partition_seq: number | null
}

const COLUMNS =
  "id, type, version, payload, headers, routing_key, partition_key, tenant_id, visible_at, partition_epoch, partition_seq"

interface Inserts {
  /** One row with nothing but defaults beyond type, version, payload and headers: the common call. */
  readonly plain: string
  readonly one: string
  readonly many: string
}

/** Each INSERT as it is, and wrapped in the wake-up check (`wakeCheck`). */
interface Texts {
  readonly quiet: Inserts
  readonly checked: Inserts
}

const texts = new Map<string, Texts>()

/**
 * The INSERT in a statement that also asks `outbox_wake()` (migration 0013) whether to NOTIFY the
 * relays: only when none of them is warm. NOTIFY is delivered at commit and dropped on rollback.
 * The row it returns says whether it notified. A data-modifying CTE runs whether or not the
 * outer query reads it, and the function sees the table as it was before the INSERT.
 */
const wakeCheck = (schema: string, insert: string): string =>
  `WITH written AS (${insert}) SELECT "${schema}".outbox_wake() AS notified`

const textsFor = (schema: string): Texts => {
  let t = texts.get(schema)
  if (t === undefined) {
    const table = `"${schema}".outbox`
    const quiet: Inserts = {
      // Four parameters instead of twelve: each one is serialised by the driver and parsed by the
      // server on every call (visible_at's default is now(), the same as a delay of 0).
      plain: `INSERT INTO ${table} (id, type, version, payload, headers) VALUES ($1, $2, $3, $4::text::jsonb, $5::text::jsonb)`,
      // Database time, not the caller's clock: due times compare against now() in the claim.
      one:
        `INSERT INTO ${table} (${COLUMNS}) VALUES ($1, $2, $3, $4::text::jsonb, $5::text::jsonb, $6, $7, $8, ` +
        `COALESCE($9::timestamptz, now() + $10::bigint * interval '1 millisecond'), $11::bigint, $12::bigint)`,
      // One JSON text parameter for any number of rows: one text, one plan.
      many:
        `INSERT INTO ${table} (${COLUMNS}) SELECT r.id, r.type, r.version, r.payload::jsonb, r.headers::jsonb, ` +
        "r.routing_key, r.partition_key, r.tenant_id, " +
        "COALESCE(r.visible_at, now() + r.delay_ms * interval '1 millisecond'), r.partition_epoch, r.partition_seq " +
        "FROM json_to_recordset($1::text::json) AS r(id uuid, type text, version integer, payload text, headers text, " +
        "routing_key text, partition_key text, tenant_id text, visible_at timestamptz, delay_ms bigint, " +
        "partition_epoch bigint, partition_seq bigint)",
    }
    t = {
      quiet,
      checked: {
        plain: wakeCheck(schema, quiet.plain),
        one: wakeCheck(schema, quiet.one),
        many: wakeCheck(schema, quiet.many),
      },
    }
    texts.set(schema, t)
  }
  return t
}

/**
 * How long a process sends its INSERTs without the wake-up check after the check found a relay
 * warm. A warm relay published within 100 ms before the check (migration 0014) and keeps looking
 * by itself for 200 ms after that publish, so it finds rows committed in this window too. At a steady load a
 * few INSERTs in a hundred then ask instead of every one (5 % at 1,500 msg/s from 4 connections in
 * bench/cost.ts; as a trigger it cost about a quarter of PostgreSQL's work on a one-row enqueue
 * transaction, migration 0013).
 * After a check that notified, the next INSERT checks again: that NOTIFY is lost if its
 * transaction rolls back.
 */
export const QUIET_MS = 25

/**
 * Per database and schema, until when (performance.now()) this process's INSERTs skip the
 * wake-up check. A database is what the executor runs on: a Kysely instance (its adapter, which
 * its transactions share) or a plain client (each its own: a process writing to several
 * databases with the same schema name must not skip one's check for another's answer).
 */
const quietUntil = new WeakMap<object, Map<string, number>>()

/** Whether the next INSERT into `schema`'s outbox through `scope` asks whether to wake relays. */
const wantsWakeCheck = (scope: object, schema: string): boolean => {
  const until = quietUntil.get(scope)?.get(schema)
  return until === undefined || performance.now() >= until
}

/** Takes in a wake-up check's answer: a statement that did not notify found a relay warm. */
const checked = (scope: object, schema: string, notified: boolean): void => {
  let bySchema = quietUntil.get(scope)
  if (bySchema === undefined) {
    bySchema = new Map()
    quietUntil.set(scope, bySchema)
  }
  if (notified) bySchema.delete(schema)
  else bySchema.set(schema, performance.now() + QUIET_MS)
}

/** A row's values in the order of the INSERTs' first ten parameters (`one`, `keyedOneText`). */
const rowValues = (r: EnqueueRow) =>
  [
    r.id,
    r.type,
    r.version,
    r.payload,
    r.headers,
    r.routing_key,
    r.partition_key,
    r.tenant_id,
    r.visible_at,
    r.delay_ms,
  ] as const

/** The INSERT for `rows` (at least one) into `schema`'s outbox, with the wake-up check or without. */
const insertOutbox = (schema: string, rows: ReadonlyArray<OutboxValues>, check: boolean): CompiledQuery => {
  const texts = textsFor(schema)
  const t = check ? texts.checked : texts.quiet
  if (rows.length === 1) {
    const r = rows[0]!
    if (
      r.routing_key === null &&
      r.partition_key === null &&
      r.tenant_id === null &&
      r.visible_at === null &&
      r.delay_ms === 0 &&
      r.partition_epoch === null &&
      r.partition_seq === null
    )
      return rawStatement(t.plain, [r.id, r.type, r.version, r.payload, r.headers])
    return rawStatement(t.one, [...rowValues(r), r.partition_epoch, r.partition_seq])
  }
  return rawStatement(t.many, [JSON.stringify(rows)])
}

/**
 * A transaction's one keyed row numbered and written in one statement, for `Outbox.transaction`'s
 * COMMIT text: what `numberByKey` and the INSERT after it do for it, in SQL, so that nothing comes
 * back to the client before the row is written. The counter's upsert and the INSERT are
 * data-modifying CTEs: the counter answers its new number and the routes it held before (read
 * under its row lock, held until the COMMIT right after, so numbers follow commit order), which
 * the row takes as its number and its routes header. `$1`–`$10` as `rowValues`, `$11` the route.
 * (Several keyed rows: `numberByKey` in a round trip of its own, then the rows with the COMMIT. A
 * statement doing that for any number of rows, with windows and sorts, cost PostgreSQL twice the
 * two statements' time: planned anew on every call.)
 */
const keyedOneText = (schema: string, check: boolean): string => {
  const s = `"${schema}"`
  return (
    `WITH c AS (INSERT INTO ${s}.partition_counters AS pc (partition_key, seq, routes) ` +
    `VALUES ($7, 1, jsonb_build_object($11::text, jsonb_build_array(1, ${NOW_MS_TEXT}))) ` +
    "ON CONFLICT (partition_key) DO UPDATE SET seq = pc.seq + 1, updated_at = now(), routes_before = pc.routes, " +
    `routes = pc.routes || jsonb_build_object($11::text, jsonb_build_array(pc.seq + 1, ${NOW_MS_TEXT})) ` +
    "RETURNING pc.epoch, pc.seq, pc.routes_before), " +
    `w AS (INSERT INTO ${s}.outbox (${COLUMNS}) SELECT $1::uuid, $2, $3::integer, $4::text::jsonb, ` +
    `$5::text::jsonb || jsonb_build_object('${PARTITION_ROUTES_HEADER}', c.routes_before::text), $6, $7, $8, ` +
    "COALESCE($9::timestamptz, now() + $10::bigint * interval '1 millisecond'), c.epoch, c.seq FROM c) " +
    (check ? `SELECT ${s}.outbox_wake() AS notified` : "SELECT false AS notified")
  )
}

/** `NOW_MS` as text, for statements written as text. */
const NOW_MS_TEXT = "(extract(epoch FROM now()) * 1000)::bigint"

const keyedTexts = new Map<string, string>()

/** The one keyed row of a schema in `Outbox.transaction`'s COMMIT text (`keyedOneText`), values written in. */
const keyedOneInsert = (schema: string, r: EnqueueRow, check: boolean): string => {
  const cacheKey = `${check ? "1" : "0"}${schema}`
  let text = keyedTexts.get(cacheKey)
  if (text === undefined) {
    text = keyedOneText(schema, check)
    keyedTexts.set(cacheKey, text)
  }
  return inlined(rawStatement(text, [...rowValues(r), r.routing_key ?? r.type]))
}

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
  run: Run,
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
  const statement = db
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
    .compile()
  const counters: ReadonlyArray<InferResult<typeof statement>[number]> = await run(statement)
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

/** Runs a compiled statement on the caller's executor; its rows. */
// biome-ignore lint/suspicious/noExplicitAny: the statement's own row type
type Run = (statement: CompiledQuery<any>) => Promise<ReadonlyArray<any>>

/** Statements built for a caller that hands enqueue a plain client: Kysely compiles, never runs. */
const compiler: Kysely<TxboxDatabase> = new Kysely<TxboxDatabase>({
  dialect: {
    createAdapter: () => new PostgresAdapter(),
    createDriver: () => new DummyDriver(),
    createIntrospector: (db) => new PostgresIntrospector(db),
    createQueryCompiler: () => new PostgresQueryCompiler(),
  },
})

const isKysely = (executor: Executor): executor is Exclude<Executor, SqlClient> => "getExecutor" in executor

/** A row without a place in a key. */
const unnumbered = (r: EnqueueRow): OutboxValues => ({ ...r, partition_epoch: null, partition_seq: null })

/** The rows with their places in their keys (`run` runs the counter's statement; none without keys). */
const numbered = async (
  db: Kysely<TxboxDatabase>,
  run: Run,
  schema: string,
  rows: ReadonlyArray<EnqueueRow>,
  keyed: boolean,
): Promise<ReadonlyArray<OutboxValues>> => {
  const positions = keyed
    ? await numberByKey(
        db.withSchema(schema),
        rows.map((r) => ({ partition_key: r.partition_key, route: r.routing_key ?? r.type })),
        run,
      )
    : []
  return rows.map((r, i) => {
    const at = positions[i]
    return at === undefined
      ? unnumbered(r)
      : {
          ...r,
          headers: withHeader(r.headers, PARTITION_ROUTES_HEADER, formatKeyRoutes(at.routes)),
          partition_epoch: at.epoch,
          partition_seq: at.seq,
        }
  })
}

/** Numbers the keyed rows (`run` runs the statement), then one INSERT. */
const writeWith = async (
  db: Kysely<TxboxDatabase>,
  run: Run,
  scope: object,
  schema: string,
  rows: ReadonlyArray<EnqueueRow>,
  keyed: boolean,
): Promise<void> => {
  const values = await numbered(db, run, schema, rows, keyed)
  // Payload and headers are bound as text and cast: postgres.js would otherwise encode the JSON
  // string a second time. The text names the schema itself.
  const check = wantsWakeCheck(scope, schema)
  const notified = await run(insertOutbox(schema, values, check))
  if (check) checked(scope, schema, notified[0]?.notified === true)
}

const databases = new Map<string, object>()

/**
 * The database a plain client writes to, for the wake-up check's quiet window: one object per
 * server and database for a node-postgres client (a pool's clients share it), the client itself
 * for a client that does not say where it is connected.
 */
const databaseOf = (client: SqlClient): object => {
  let scope = clientDatabases.get(client)
  if (scope !== undefined) return scope
  const { host, port, database } = client as { host?: unknown; port?: unknown; database?: unknown }
  if (typeof host !== "string" || typeof database !== "string") scope = client
  else {
    const key = `${host}:${String(port)}/${database}`
    scope = databases.get(key) ?? { key }
    databases.set(key, scope)
  }
  clientDatabases.set(client, scope)
  return scope
}

/** A pool's clients live as long as their connections: each is looked up once. */
const clientDatabases = new WeakMap<SqlClient, object>()

/**
 * On a plain client: the statements as they are. Keyed rows must commit with their numbers, so
 * they go under a savepoint, which PostgreSQL refuses outside a transaction block (25P01): a
 * client that is not in one gets that error, and nothing is written.
 */
const writeOnClient = async (
  client: SqlClient,
  schema: string,
  rows: ReadonlyArray<EnqueueRow>,
  keyed: boolean,
): Promise<void> => {
  const run: Run = (statement) =>
    client.query(statement.sql, statement.parameters as unknown[]).then((result) => result.rows)
  const scope = databaseOf(client)
  if (!keyed) return writeWith(compiler, run, scope, schema, rows, false)
  await client.query("SAVEPOINT txbox_enqueue")
  await writeWith(compiler, run, scope, schema, rows, true)
  await client.query("RELEASE SAVEPOINT txbox_enqueue")
}

/**
 * Enqueue's failure as a `StoreError`, saying what to do when there is no outbox at all: PostgreSQL's
 * "does not exist" does not say that `txbox migrate` is the fix. (A missing `outbox_wake()`, 0013's,
 * `classifyDbError` hints at for every store statement.)
 */
export const enqueueError = (cause: unknown, operation = "Outbox.enqueue"): StoreError => {
  const code = typeof cause === "object" && cause !== null ? (cause as { code?: unknown }).code : undefined
  const message = cause instanceof Error ? cause.message : String(cause)
  const behind = code === "42P01" && message.includes("outbox")
  if (!behind) return classifyDbError(operation, cause)
  return classifyDbError(operation, behindHint(code, message, cause))
}

/**
 * Rows written at their transaction's COMMIT (`Outbox.transaction`): by the executor its body was
 * given, the rows its enqueue calls made, each with its schema. Keyed rows are numbered there too,
 * in the same text (`keyedText`).
 */
export const riding = new WeakMap<object, Array<RidingRow>>()

/** A row waiting for its transaction's COMMIT, and the schema whose outbox it goes into. */
export interface RidingRow {
  readonly schema: string
  readonly row: EnqueueRow
}

/** The database a transaction's statements run on, for the wake-up check's quiet window. */
export const scopeOf = (executor: Executor): object =>
  isKysely(executor) ? (executor.getExecutor().adapter ?? executor) : databaseOf(executor)

/**
 * The INSERTs for `rows` as texts with their values written in (one per schema, usually one), to
 * go in the COMMIT's round trip; `committed` takes in the wake-up checks once it succeeded. A
 * check whose transaction committed has had its NOTIFY delivered, so whatever it answered, the
 * next INSERTs may skip it for the quiet window. One keyed row is numbered in its text
 * (`keyedOneText`); several are numbered first (`run`: a text on the transaction's connection,
 * its last statement's rows), a round trip before the COMMIT's.
 */
export const commitInserts = async (
  scope: object,
  rows: ReadonlyArray<RidingRow>,
  run: (text: string) => Promise<ReadonlyArray<Record<string, unknown>>>,
): Promise<{ readonly texts: ReadonlyArray<string>; readonly committed: () => void }> => {
  const bySchema = new Map<string, EnqueueRow[]>()
  for (const { schema, row } of rows) {
    const of = bySchema.get(schema)
    if (of === undefined) bySchema.set(schema, [row])
    else of.push(row)
  }
  const texts: string[] = []
  const asked: string[] = []
  for (const [schema, all] of bySchema) {
    const check = wantsWakeCheck(scope, schema)
    if (check) asked.push(schema)
    const keyed = all.filter((r) => r.partition_key !== null)
    if (keyed.length === 0) {
      // The common case, on every producer transaction: no numbering, nothing awaited.
      texts.push(inlined(insertOutbox(schema, all.map(unnumbered), check)))
    } else if (keyed.length === 1) {
      // The keyed row's own statement carries the wake-up check; the others go without.
      texts.push(keyedOneInsert(schema, keyed[0]!, check))
      const unkeyed = all.filter((r) => r.partition_key === null)
      if (unkeyed.length > 0) texts.push(inlined(insertOutbox(schema, unkeyed.map(unnumbered), false)))
    } else {
      const values = await numbered(compiler, (statement) => run(inlined(statement)), schema, all, true)
      texts.push(inlined(insertOutbox(schema, values, check)))
    }
  }
  return {
    texts,
    committed: () => {
      for (const schema of asked) checked(scope, schema, false)
    },
  }
}

/** The `WriteOutbox` port in SQL: numbers the keyed rows, then one INSERT. */
export const writeOutbox: WriteOutbox = (executor, schema, rows) => {
  const waiting = riding.get(executor)
  if (waiting !== undefined) {
    for (const row of rows) waiting.push({ schema, row })
    return Effect.void
  }
  const keyed = rows.some((r) => r.partition_key !== null)
  if (!isKysely(executor)) {
    return Effect.tryPromise({
      try: () => writeOnClient(executor, schema, rows, keyed),
      catch: (cause) => enqueueError(cause),
    })
  }
  // The caller's plugins (a CamelCasePlugin, say) would rename txbox's columns and result rows:
  // its statements run without them, still on the caller's connection and transaction.
  // (A new Transaction per call only when there are plugins to shed: enqueue runs once per business transaction.)
  const db = (
    executor.getExecutor().plugins.length === 0 ? executor : executor.withoutPlugins()
  ) as Kysely<TxboxDatabase>
  // The database, for the wake-up check's quiet window: the adapter a Kysely instance's transactions share.
  const scope: object = executor.getExecutor().adapter ?? executor
  const write = (db: Kysely<TxboxDatabase>) =>
    writeWith(
      db,
      (statement) => db.executeQuery(statement).then((result) => result.rows),
      scope,
      schema,
      rows,
      keyed,
    )
  return Effect.tryPromise({
    // Numbers and rows must commit together, or a key would have a gap its consumers wait on
    // forever: outside a transaction, enqueue opens one of its own.
    try: () => (keyed && !executor.isTransaction ? db.transaction().execute(write) : write(db)),
    catch: (cause) => enqueueError(cause),
  })
}
