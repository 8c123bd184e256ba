// The SQL stores against the store contract (test/support/storeContract.ts): on the test
// PostgreSQL through each driver (postgres.js, node-postgres), and on an in-memory PGlite.
//
// One migrated database per runner, emptied before every test; each test gets a fresh store layer
// (its own pool) over it, with LISTEN off (wakeups are not part of the contract).
//
// Time: `advance(ms)` never sleeps. It shifts every timestamp column of every row back by `ms`,
// which is, for everything the store compares against `now()`, the clock moving forward by `ms`.
// So that the harness's clock agrees with that, it keeps the total it has advanced as an offset:
// `now()` is `SELECT now()` plus the offset, and `rows()` reports stored times plus the offset.
// In that frame a stored time never moves when the clock advances, exactly as on the memory
// runner's TestClock, so the spec's brackets hold however they straddle an `advance`.
import { afterAll, beforeAll, describe } from "bun:test"
import { PGlite } from "@electric-sql/pglite"
import { Effect, Layer, ManagedRuntime } from "effect"
import { Kysely, type RawBuilder, sql } from "kysely"
import type { TxboxStore } from "../../src/ports/stores.ts"
import { PgliteDialect } from "../../src/storage/drivers/pglite/dialect.ts"
import * as PgliteStore from "../../src/storage/drivers/pglite/PgliteStore.ts"
import { migrate } from "../../src/storage/sql/migrator.ts"
import {
  type InboxHarness,
  type InboxRowView,
  inboxStoreContract,
  type OutboxHarness,
  type OutboxRowView,
  outboxStoreContract,
} from "../support/storeContract.ts"
import { type MigratedDatabase, migratedDatabase, storeOf } from "../support/txbox.ts"

const SCHEMA = "txbox"
const outbox = sql.id(SCHEMA, "outbox")
const inbox = sql.id(SCHEMA, "inbox")
const cursors = sql.id(SCHEMA, "inbox_cursors")
const leases = sql.id(SCHEMA, "housekeeping_leases")

/** A database the contract runs on: the harness's own connection, and the store under test over it. */
interface Backend {
  /** For seeding, reading and shifting rows; not the store's own Kysely (on PGlite, the same session). */
  // biome-ignore lint/suspicious/noExplicitAny: the harness reads txbox's tables untyped
  readonly db: Kysely<any>
  /** A fresh store layer (its own pool) over the same database. */
  readonly layer: () => Layer.Layer<TxboxStore>
}

/** A timestamp expression as epoch ms, whole (the floor, so `a <= b` survives the rounding). */
const epochMs = (expression: RawBuilder<unknown>) =>
  sql<number | null>`floor(extract(epoch FROM ${expression}) * 1000)::float8`
const epochMsOf = (column: string) => epochMs(sql`${sql.ref(column)}`)
const minus = (column: string, ms: number) => sql`${sql.ref(column)} - ${ms}::int * interval '1 millisecond'`

/**
 * The harness's clock: the database's, plus what `advance` has added. `advance` shifts the given
 * timestamp columns of `table` back instead of waiting.
 */
// biome-ignore lint/suspicious/noExplicitAny: see Backend
const clock = (db: Kysely<any>, table: RawBuilder<unknown>, columns: ReadonlyArray<string>) => {
  let offset = 0
  return {
    now: async (): Promise<number> => {
      const result = await sql<{ now: number }>`SELECT ${epochMs(sql`now()`)} AS now`.execute(db)
      return Number(result.rows[0]?.now) + offset
    },
    /** A stored time (epoch ms, or null) on the harness's clock. */
    at: (ms: number | string | null): number | null => (ms === null ? null : Number(ms) + offset),
    advance: async (ms: number): Promise<void> => {
      const set = sql.join(columns.map((c) => sql`${sql.ref(c)} = ${minus(c, ms)}`))
      await sql`UPDATE ${table} SET ${set}`.execute(db)
      offset += ms
    },
  }
}

/**
 * Empties txbox's tables: every test starts on an empty store. DELETE rather than TRUNCATE: on
 * tables this small it is several times quicker (TRUNCATE makes new files for each table and index).
 */
// biome-ignore lint/suspicious/noExplicitAny: see Backend
const empty = async (db: Kysely<any>): Promise<void> => {
  await sql`DELETE FROM ${outbox}`.execute(db)
  await sql`DELETE FROM ${inbox}`.execute(db)
  await sql`DELETE FROM ${cursors}`.execute(db)
  await sql`DELETE FROM ${leases}`.execute(db)
}

const outboxHarness = async (backend: Backend): Promise<OutboxHarness> => {
  const { db } = backend
  await empty(db)
  const runtime = ManagedRuntime.make(backend.layer())
  const time = clock(db, outbox, ["occurred_at", "visible_at", "published_at"])
  return {
    run: (effect) => runtime.runPromise(effect),
    insert: async (seeds) => {
      if (seeds.length === 0) return
      // One statement, so every seed's due time counts from the same now().
      const values = sql.join(
        seeds.map(
          (s) =>
            sql`(${s.id}::uuid, ${s.type ?? "test.event"}, 1, ${s.payload ?? "{}"}::text::jsonb,
                 now() + ${s.dueInMs ?? 0}::int * interval '1 millisecond')`,
        ),
      )
      await sql`INSERT INTO ${outbox} (id, type, version, payload, visible_at) VALUES ${values}`.execute(db)
    },
    rows: async () => {
      const result = await sql<{
        id: string
        status: OutboxRowView["status"]
        attempts: number
        visible_at: number
        lock_token: string | null
        last_error: string | null
        published_at: number | null
      }>`
        SELECT id::text AS id, status, attempts, ${epochMsOf("visible_at")} AS visible_at,
               lock_token::text AS lock_token, last_error, ${epochMsOf("published_at")} AS published_at
        FROM ${outbox}`.execute(db)
      return result.rows.map(
        (r): OutboxRowView => ({
          id: r.id,
          status: r.status,
          attempts: Number(r.attempts),
          visibleAt: time.at(r.visible_at) ?? Number.NaN,
          lockToken: r.lock_token,
          lastError: r.last_error,
          publishedAt: time.at(r.published_at),
        }),
      )
    },
    advance: async (ms) => {
      await time.advance(ms)
      // The housekeeping leases run out on the same clock.
      await sql`UPDATE ${leases} SET held_until = held_until - ${ms}::int * interval '1 millisecond'`.execute(
        db,
      )
    },
    now: time.now,
    dispose: () => runtime.dispose(),
  }
}

const inboxHarness = async (backend: Backend): Promise<InboxHarness> => {
  const { db } = backend
  await empty(db)
  const runtime = ManagedRuntime.make(backend.layer())
  const time = clock(db, inbox, ["received_at", "visible_at", "processed_at"])
  return {
    run: (effect) => runtime.runPromise(effect),
    rows: async (consumer) => {
      const result = await sql<{
        message_id: string
        consumer: string
        status: InboxRowView["status"]
        attempts: number
        visible_at: number
        lock_token: string | null
        last_error: string | null
        raw: string | null
        processed_at: number | null
      }>`
        SELECT message_id, consumer, status, attempts, ${epochMsOf("visible_at")} AS visible_at,
               lock_token::text AS lock_token, last_error, raw, ${epochMsOf("processed_at")} AS processed_at
        FROM ${inbox}
        WHERE ${consumer === undefined ? sql`true` : sql`consumer = ${consumer}`}`.execute(db)
      return result.rows.map(
        (r): InboxRowView => ({
          key: r.message_id,
          consumer: r.consumer,
          status: r.status,
          attempts: Number(r.attempts),
          visibleAt: time.at(r.visible_at) ?? Number.NaN,
          lockToken: r.lock_token,
          lastError: r.last_error,
          raw: r.raw,
          processedAt: time.at(r.processed_at),
        }),
      )
    },
    advance: time.advance,
    now: time.now,
    dispose: () => runtime.dispose(),
  }
}

/** Both contracts over `open()`'s backend, opened once for the block and closed after it. */
const contracts = (name: string, open: () => Promise<Backend & { readonly close: () => Promise<void> }>) =>
  describe(name, () => {
    let backend: (Backend & { readonly close: () => Promise<void> }) | undefined
    beforeAll(async () => {
      backend = await open()
    })
    afterAll(async () => {
      await backend?.close()
    })
    const current = (): Backend => {
      if (backend === undefined) throw new Error(`${name}: the database did not open`)
      return backend
    }
    outboxStoreContract(name, () => outboxHarness(current()))
    inboxStoreContract(name, () => inboxHarness(current()))
  })

for (const driver of ["postgres.js", "pg"] as const) {
  contracts(`PostgreSQL (${driver})`, async () => {
    const database: MigratedDatabase = await migratedDatabase(`sql_store_${driver}`, SCHEMA)
    return {
      db: database.db,
      // The contract's claims are leases (holdClaims: false); held claims: held-claims.test.ts.
      layer: () =>
        Layer.orDie(
          storeOf(driver).layer({ url: database.url, schema: SCHEMA, listen: false, holdClaims: false }),
        ),
      close: database.close,
    }
  })
}

contracts("PGlite", async () => {
  // One in-memory PGlite for the block (creating one runs initdb: seconds), shared by the harness
  // and every store layer; the layers leave an instance they were given open.
  const pglite = await PGlite.create()
  // On the same instance, the dialect shares the store's session lock, so the harness's statements
  // never land inside a transaction the store has open.
  // biome-ignore lint/suspicious/noExplicitAny: see Backend
  const db: Kysely<any> = new Kysely({ dialect: new PgliteDialect({ pglite }) })
  await Effect.runPromise(migrate(db, { schema: SCHEMA }))
  return {
    db,
    layer: () => Layer.orDie(PgliteStore.layer({ pglite, schema: SCHEMA, listen: false })),
    close: async () => {
      await db.destroy()
      await pglite.close()
    },
  }
})
