// A database of the bench's own on the shared server, txbox's schema migrated into it, and fast
// backlog fills (one INSERT ... SELECT generate_series, never through enqueue: setup stays seconds).
import { randomBytes } from "node:crypto"
import { Effect } from "effect"
import { Kysely, sql } from "kysely"
import { PostgresJSDialect } from "kysely-postgres-js"
import postgres from "postgres"
import { migrate } from "../../src/storage/sql/migrator.ts"
import { BODY_BYTES } from "./payload.ts"

export interface BenchDatabase {
  readonly url: string
  readonly name: string
  /** A plain Kysely for the bench's own setup and checks (not the code under test). */
  // biome-ignore lint/suspicious/noExplicitAny: the bench reads txbox's tables and its own freely
  readonly db: Kysely<any>
  readonly sql: postgres.Sql
  /** Closes the pool and drops the database (WITH FORCE). */
  readonly drop: () => Promise<void>
}

const admin = async <T>(serverUrl: string, body: (sql: postgres.Sql) => Promise<T>): Promise<T> => {
  const client = postgres(serverUrl, { max: 1, onnotice: () => {} })
  try {
    return await body(client)
  } finally {
    await client.end({ timeout: 5 })
  }
}

/** Creates `bench_<prefix>_<random>` on the server of `serverUrl` and applies txbox's migrations. */
export const createBenchDatabase = async (serverUrl: string, prefix: string): Promise<BenchDatabase> => {
  const name = `bench_${prefix.replace(/[^a-z0-9_]/g, "_")}_${Date.now().toString(36)}_${randomBytes(3).toString("hex")}`
  await admin(serverUrl, (s) => s.unsafe(`CREATE DATABASE "${name}"`))
  const url = new URL(serverUrl)
  url.pathname = `/${name}`
  const client = postgres(url.toString(), { max: 4, onnotice: () => {} })
  // biome-ignore lint/suspicious/noExplicitAny: see BenchDatabase.db
  const db = new Kysely<any>({ dialect: new PostgresJSDialect({ postgres: client }) })
  await Effect.runPromise(migrate(db))
  let dropped: Promise<void> | undefined
  return {
    url: url.toString(),
    name,
    db,
    sql: client,
    drop: () => {
      dropped ??= (async () => {
        await db.destroy().catch(() => {})
        await admin(serverUrl, (s) => s.unsafe(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`))
      })()
      return dropped
    },
  }
}

/** The event type of every bench message (also its routing key). */
export const BENCH_TYPE = "bench.order-placed"

/**
 * A ~250-byte order payload as PostgreSQL's jsonb text renders it (what the relay publishes: it
 * casts `payload::text` and never re-serialises). `note` pads it to BODY_BYTES; jsonb adds a space
 * after every `:` and `,`, hence the arithmetic in SQL rather than a constant.
 */
const payloadSql = (serial: string) => sql`(
  SELECT p || jsonb_build_object('note', repeat('x', greatest(0, ${BODY_BYTES}::int - octet_length((p || '{"note": ""}'::jsonb)::text))))
  FROM (SELECT jsonb_build_object(
    'orderId', gen_random_uuid(),
    'customerId', gen_random_uuid(),
    'serial', ${sql.raw(serial)},
    'total', round((random() * 1000)::numeric, 2),
    'currency', 'EUR',
    'lines', 3,
    'committedAt', 0
  ) AS p) AS base)`

/** A UUIDv7 from a millisecond timestamp (an SQL expression), as SQL text (PostgreSQL 15 has only v4 built in). */
export const uuidv7Text = (millis: string): string =>
  `encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) placing substring(int8send((${millis})::bigint) from 3) from 1 for 6), 52, 1), 53, 1), 'hex')::uuid`

/** The same, for Kysely's `sql`. */
const uuidv7Sql = (millis: string) => sql.raw(uuidv7Text(millis))

/**
 * Makes sure `bench.backlog` holds at least `count` generated messages (serial `g`, a UUIDv7 `id`
 * in due order, the payload, a due time an hour ago). Generating is the slow part (two random
 * UUIDs and a jsonb build per row), so it happens once per database; fills copy from it.
 */
// biome-ignore lint/suspicious/noExplicitAny: any database
const ensureBacklog = async (db: Kysely<any>, count: number): Promise<void> => {
  await sql`CREATE SCHEMA IF NOT EXISTS bench`.execute(db)
  await sql`
    CREATE TABLE IF NOT EXISTS bench.backlog (
      g int PRIMARY KEY, id uuid NOT NULL, payload jsonb NOT NULL, at timestamptz NOT NULL
    )`.execute(db)
  const have = Number(
    (await sql<{ n: string | null }>`SELECT max(g) AS n FROM bench.backlog`.execute(db)).rows[0]?.n ?? 0,
  )
  if (have >= count) return
  await sql`
    INSERT INTO bench.backlog (g, id, payload, at)
    SELECT g, ${uuidv7Sql("floor(extract(epoch from now()) * 1000) - 3600000 + g / 10")}, ${payloadSql("g")},
           now() - interval '1 hour' + g * interval '1 microsecond'
    FROM generate_series(${have + 1}::int, ${count}::int) AS g`.execute(db)
}

/**
 * Empties the outbox and fills it with `count` due rows in one statement (copied from
 * `bench.backlog`: ids UUIDv7 in due order, as enqueue writes them), then VACUUM ANALYZE so the
 * claim runs on fresh statistics.
 */
// Due just now, in id order, not when the template was made: a claim that comes back empty then
// means the fill is drained (a relay's claim looks back 3 s between full ones: claimWindow.ts).
// With `occurredWhenDue`, each row occurred when it came due, as an enqueue with no delay writes it:
// what a WAL relay publishes itself (an older occurred_at reads as a delayed row, the sweep's).
export const fillOutbox = async (
  // biome-ignore lint/suspicious/noExplicitAny: any database with txbox's schema
  db: Kysely<any>,
  count: number,
  schema = "txbox",
  options: { readonly occurredWhenDue?: boolean } = {},
): Promise<void> => {
  await ensureBacklog(db, count)
  await sql`TRUNCATE ${sql.id(schema, "outbox")}`.execute(db)
  const due = sql`now() - (${count}::int - g) * interval '1 microsecond'`
  await sql`
    INSERT INTO ${sql.id(schema, "outbox")} (id, type, version, payload, occurred_at, visible_at)
    SELECT id, ${BENCH_TYPE}, 1, payload, ${options.occurredWhenDue ? due : sql`at`}, ${due} FROM bench.backlog WHERE g <= ${count}::int ORDER BY g`.execute(
    db,
  )
  await sql`VACUUM ANALYZE ${sql.id(schema, "outbox")}`.execute(db)
}

/**
 * Fills the outbox with `count` rows generated in place (no copy from `bench.backlog`): for the
 * one-off million-row backlog of the memory bench, where a template would double the work.
 */
// biome-ignore lint/suspicious/noExplicitAny: any database with txbox's schema
export const generateOutbox = async (db: Kysely<any>, count: number, schema = "txbox"): Promise<void> => {
  await sql`TRUNCATE ${sql.id(schema, "outbox")}`.execute(db)
  await sql`
    INSERT INTO ${sql.id(schema, "outbox")} (id, type, version, payload, occurred_at, visible_at)
    SELECT ${uuidv7Sql("floor(extract(epoch from now()) * 1000) - 3600000 + g / 10")}, ${BENCH_TYPE}, 1,
           ${payloadSql("g")},
           now() - interval '1 hour' + g * interval '1 microsecond',
           now() - interval '1 hour' + g * interval '1 microsecond'
    FROM generate_series(1, ${count}::int) AS g`.execute(db)
  await sql`VACUUM ANALYZE ${sql.id(schema, "outbox")}`.execute(db)
}

// biome-ignore lint/suspicious/noExplicitAny: any database with txbox's schema
export const outboxStatus = async (db: Kysely<any>, schema = "txbox") => {
  const rows = await sql<{ status: string; n: string }>`
    SELECT status, count(*) AS n FROM ${sql.id(schema, "outbox")} GROUP BY status`.execute(db)
  const by = Object.fromEntries(rows.rows.map((r) => [r.status, Number(r.n)]))
  return { pending: by.pending ?? 0, sent: by.sent ?? 0, dead: by.dead ?? 0 }
}

// biome-ignore lint/suspicious/noExplicitAny: any database
export const averageBodyBytes = async (db: Kysely<any>, schema = "txbox"): Promise<number> => {
  const r = await sql<{ n: string | null }>`
    SELECT avg(octet_length(payload::text)) AS n FROM (SELECT payload FROM ${sql.id(schema, "outbox")} LIMIT 1000) s`.execute(
    db,
  )
  return Math.round(Number(r.rows[0]?.n ?? 0))
}

/**
 * The articles' table, `bench.outbox_messages` (id, type, content jsonb, occurred_on_utc,
 * processed_on_utc, error), for the naive and optimized baselines. `coveringIndex` adds the
 * sequel's partial covering index; without it the naive query scans and sorts, as in the article.
 */
// biome-ignore lint/suspicious/noExplicitAny: any database
export const fillArticleTable = async (db: Kysely<any>, count: number, coveringIndex: boolean) => {
  await ensureBacklog(db, count)
  await sql`DROP TABLE IF EXISTS bench.outbox_messages`.execute(db)
  await sql`
    CREATE TABLE bench.outbox_messages (
      id uuid PRIMARY KEY,
      type varchar(255) NOT NULL,
      content jsonb NOT NULL,
      occurred_on_utc timestamptz NOT NULL,
      processed_on_utc timestamptz NULL,
      error text NULL
    )`.execute(db)
  await sql`
    INSERT INTO bench.outbox_messages (id, type, content, occurred_on_utc)
    SELECT id, ${BENCH_TYPE}, payload, at FROM bench.backlog WHERE g <= ${count}::int ORDER BY g`.execute(db)
  if (coveringIndex) {
    await sql`
      CREATE INDEX idx_outbox_messages_unprocessed ON bench.outbox_messages (occurred_on_utc, processed_on_utc)
      INCLUDE (id, type, content) WHERE processed_on_utc IS NULL`.execute(db)
  }
  await sql`VACUUM ANALYZE bench.outbox_messages`.execute(db)
}

// biome-ignore lint/suspicious/noExplicitAny: any database
export const articleProcessed = async (db: Kysely<any>): Promise<number> => {
  const r = await sql<{ n: string }>`
    SELECT count(*) AS n FROM bench.outbox_messages WHERE processed_on_utc IS NOT NULL`.execute(db)
  return Number(r.rows[0]?.n ?? 0)
}

/**
 * Drops the database's replication slots nobody reads: a WAL relay's slot outlives the relay, and
 * would keep its WAL and its database from being dropped. Never fails (a cleanup).
 */
// biome-ignore lint/suspicious/noExplicitAny: any database
export const dropIdleSlots = (db: Kysely<any>): Promise<unknown> =>
  sql`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE NOT active AND database = current_database()`
    .execute(db)
    .catch(() => undefined)
