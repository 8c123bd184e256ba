// Test helpers for txbox itself: a migrated database per test file, layers over it, and counts read
// straight from the tables (never from the code under test).
import { Effect, Layer, ManagedRuntime } from "effect"
import { Kysely, sql } from "kysely"
import { PostgresJSDialect } from "kysely-postgres-js"
import postgres from "postgres"
import type { TxboxStore } from "../../src/ports/stores.ts"
import { type OutgoingMessage, Transport } from "../../src/ports/Transport.ts"
import * as PgStore from "../../src/storage/drivers/pg/PgStore.ts"
import * as PostgresJsStore from "../../src/storage/drivers/postgres-js/PostgresJsStore.ts"
import { migrate } from "../../src/storage/sql/migrator.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { amqpUrl, createTestDatabase, type TestDatabase } from "./db.ts"

export interface MigratedDatabase extends TestDatabase {
  /** A plain Kysely on the test database, for the test's own reads and business tables. */
  // biome-ignore lint/suspicious/noExplicitAny: tests query txbox's and their own tables freely
  readonly db: Kysely<any>
  readonly close: () => Promise<void>
}

/** A fresh database with txbox's schema migrated, plus an `orders`/`effects` business table pair. */
export const migratedDatabase = async (prefix: string, schema = "txbox"): Promise<MigratedDatabase> => {
  const test = await createTestDatabase(prefix)
  const client = postgres(test.url, { max: 4, onnotice: () => {} })
  // biome-ignore lint/suspicious/noExplicitAny: see above
  const db = new Kysely<any>({ dialect: new PostgresJSDialect({ postgres: client }) })
  await Effect.runPromise(migrate(db, { schema }))
  await sql`CREATE TABLE orders (id uuid PRIMARY KEY, total numeric NOT NULL)`.execute(db)
  await sql`CREATE TABLE effects (id bigserial PRIMARY KEY, consumer text NOT NULL, message_id text NOT NULL, note text)`.execute(
    db,
  )
  return {
    ...test,
    db,
    close: async () => {
      await db.destroy()
      await test.drop()
    },
  }
}

export type Driver = "postgres.js" | "pg"

/** The store of `driver`: `PgStore` (node-postgres, the default driver) when none is given. */
export const storeOf = (driver: Driver = "pg"): typeof PgStore | typeof PostgresJsStore =>
  driver === "pg" ? PgStore : PostgresJsStore

export const storeLayer = (
  url: string,
  { driver, ...options }: { driver?: Driver; schema?: string; poolSize?: number } = {},
): Layer.Layer<TxboxStore> =>
  // No driver given: the library's default, which is what users run.
  Layer.orDie(storeOf(driver).layer({ url, ...options }))

/** A runtime over `layer` for a test; dispose it to close pools and stop loops. */
export const runtimeOf = <R, E>(layer: Layer.Layer<R, E>) => ManagedRuntime.make(layer)

// biome-ignore lint/suspicious/noExplicitAny: tests read txbox's tables freely
export const outboxCounts = async (db: Kysely<any>, schema = "txbox") => {
  const rows = await sql<{ status: string; n: string }>`
    SELECT status, count(*) AS n FROM ${sql.id(schema, "outbox")} GROUP BY status`.execute(db)
  const by = Object.fromEntries(rows.rows.map((r) => [r.status, Number(r.n)]))
  return { pending: by.pending ?? 0, sent: by.sent ?? 0, dead: by.dead ?? 0 }
}

/** Polls `check` until it returns true, failing with `what` after `timeoutMs`. */
export const eventually = async (what: string, check: () => Promise<boolean>, timeoutMs = 30_000) => {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (await check()) return
    await new Promise((r) => setTimeout(r, 50))
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for: ${what}`)
}

/** Publishes through txbox's own AMQP transport; fails unless the broker confirmed every message. */
export const publishConfirmed = async (exchange: string, messages: ReadonlyArray<OutgoingMessage>) => {
  const runtime = ManagedRuntime.make(Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange })))
  try {
    const outcomes = await runtime.runPromise(
      Effect.gen(function* () {
        const transport = yield* Transport
        return yield* transport.publish(messages)
      }),
    )
    const refused = outcomes.filter((o) => o._tag !== "Confirmed")
    if (refused.length > 0) throw new Error(`not confirmed: ${JSON.stringify(refused)}`)
  } finally {
    await runtime.dispose()
  }
}
