// The embedded store: txbox's migrations, outbox, relay and inbox on PGlite, with the in-memory
// broker. Counts come from the tables. One PGlite for the file (opening one costs a few seconds);
// each test works in a schema of its own.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { PGlite } from "@electric-sql/pglite"
import { Effect, Exit, Layer, ManagedRuntime } from "effect"
import { Kysely, sql } from "kysely"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import * as Inbox from "../../src/Inbox.ts"
import * as Outbox from "../../src/Outbox.ts"
import { Database, TxboxSchema } from "../../src/ports/Database.ts"
import * as Relay from "../../src/Relay.ts"
import { PgliteDialect } from "../../src/storage/drivers/pglite/dialect.ts"
import * as PgliteStore from "../../src/storage/drivers/pglite/PgliteStore.ts"
import { migrations } from "../../src/storage/sql/migrations.generated.ts"
import { migrate } from "../../src/storage/sql/migrator.ts"
import * as MemoryTransport from "../../src/transport/memory/MemoryTransport.ts"

/** Runs an enqueue as under a store layer whose schema is `schema`. */
const inSchema = <A, E>(schema: string, effect: Effect.Effect<A, E>) =>
  Effect.provideService(effect, TxboxSchema, schema)

const Ping = defineEvent({
  type: "test.ping",
  version: 1,
  schema: v.object({ n: v.number(), note: v.nullable(v.string()) }),
})

let pglite: PGlite
// biome-ignore lint/suspicious/noExplicitAny: the test's own tables and txbox's
let db: Kysely<any>

beforeAll(async () => {
  pglite = await PGlite.create()
  db = new Kysely({ dialect: new PgliteDialect({ pglite }) })
})
afterAll(async () => {
  await db.destroy()
  await pglite.close()
})

const count = async (query: ReturnType<typeof sql<{ n: number | string | bigint }>>) =>
  Number((await query.execute(db)).rows[0]!.n)

const eventually = async (what: string, check: () => Promise<boolean>, timeoutMs = 30_000) => {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (await check()) return
    await Bun.sleep(50)
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for: ${what}`)
}

describe("PGlite store", () => {
  test("migrations apply, and a second run applies nothing", async () => {
    const first = await Effect.runPromise(migrate(db, { schema: "mig" }))
    expect(first.applied.map((m) => m.version)).toEqual(migrations.map((m) => m.version))
    const again = await Effect.runPromise(migrate(db, { schema: "mig" }))
    expect(again.applied).toEqual([])
    const tables = await sql<{ table_name: string }>`
      SELECT table_name FROM information_schema.tables WHERE table_schema = 'mig' ORDER BY table_name`.execute(
      db,
    )
    expect(tables.rows.map((r) => r.table_name)).toEqual([
      "housekeeping_leases",
      "inbox",
      "inbox_archive",
      "inbox_bindings",
      "inbox_consumers",
      "inbox_cursors",
      "inbox_default",
      "outbox",
      "outbox_archive",
      "outbox_default",
      "partition_counters",
      "txbox_migrations",
    ])
    expect(await count(sql`SELECT count(*) AS n FROM mig.txbox_migrations`)).toBe(migrations.length)
  })

  test("an event enqueued in a rolled-back transaction is gone; one in a committed transaction stays", async () => {
    await Effect.runPromise(migrate(db, { schema: "enq" }))
    const rolledBack = await db
      .transaction()
      .execute(async (trx) => {
        const m = await Effect.runPromise(inSchema("enq", Outbox.enqueue(trx, Ping, { n: 1, note: null })))
        throw Object.assign(new Error("roll back on purpose"), { id: m.id })
      })
      .catch((e: { id: string }) => e.id)
    const committed = await db
      .transaction()
      .execute((trx) => Effect.runPromise(inSchema("enq", Outbox.enqueue(trx, Ping, { n: 2, note: "kept" }))))
    const rows = await sql<{ id: string; payload: { n: number; note: string } }>`
      SELECT id, payload FROM enq.outbox`.execute(db)
    expect(rows.rows).toEqual([{ id: committed.id, payload: { n: 2, note: "kept" } }])
    expect(rows.rows.some((r) => r.id === rolledBack)).toBe(false)
  })

  test("Outbox.transaction: PGlite takes one statement per call, so the events go just before the COMMIT", async () => {
    await Effect.runPromise(migrate(db, { schema: "otx" }))
    // Were the INSERT and the COMMIT sent as one text, PGlite would refuse it and the commit fail.
    const committed = await Effect.runPromise(
      inSchema(
        "otx",
        Outbox.transaction(db, (trx) =>
          Effect.andThen(
            Outbox.enqueue(trx, Ping, { n: 1, note: "it's kept" }),
            Outbox.enqueue(trx, Ping, { n: 2, note: null }),
          ),
        ),
      ),
    )
    const failed = await Effect.runPromiseExit(
      inSchema(
        "otx",
        Outbox.transaction(db, (trx) =>
          Effect.andThen(Outbox.enqueue(trx, Ping, { n: 3, note: null }), Effect.fail("no")),
        ),
      ),
    )
    expect(Exit.isFailure(failed)).toBe(true)
    const rows = await sql<{
      id: string
      payload: { n: number; note: string | null }
    }>`SELECT id, payload FROM otx.outbox ORDER BY payload->>'n'`.execute(db)
    expect(rows.rows.map((r) => r.payload)).toEqual([
      { n: 1, note: "it's kept" },
      { n: 2, note: null },
    ])
    expect(rows.rows[1]!.id).toBe(committed.id)
    // Keyed events are numbered in the statement before the COMMIT, on PGlite too.
    for (const n of [10, 11])
      await Effect.runPromise(
        inSchema(
          "otx",
          Outbox.transaction(db, (trx) =>
            Outbox.enqueue(trx, Ping, { n, note: null }, { partitionKey: "ride" }),
          ),
        ),
      )
    const keyed = await sql<{ seq: string }>`
      SELECT partition_seq AS seq FROM otx.outbox WHERE partition_key = 'ride' ORDER BY partition_seq`.execute(
      db,
    )
    expect(keyed.rows.map((r) => Number(r.seq))).toEqual([1, 2])
  })

  test("partition numbers: 1, 2 per key in commit order; a rolled-back enqueue takes its number with it", async () => {
    await Effect.runPromise(migrate(db, { schema: "num" }))
    const enqueue = (n: number, fail: boolean) =>
      db
        .transaction()
        .execute(async (trx) => {
          await Effect.runPromise(
            inSchema("num", Outbox.enqueue(trx, Ping, { n, note: null }, { partitionKey: "k" })),
          )
          if (fail) throw new Error("roll back on purpose")
        })
        .catch(() => undefined)
    await enqueue(1, true)
    await enqueue(2, false)
    await enqueue(3, false)
    const rows = await sql<{ n: number; seq: string }>`
      SELECT (payload->>'n')::int AS n, partition_seq AS seq FROM num.outbox ORDER BY partition_seq`.execute(
      db,
    )
    expect(rows.rows.map((r) => [r.n, Number(r.seq)])).toEqual([
      [2, 1],
      [3, 2],
    ])
  })

  test("a statement from another fiber waits for an open transaction instead of joining it", async () => {
    await sql`CREATE TABLE lock_probe (id int PRIMARY KEY)`.execute(db)
    const trx = await db.startTransaction().execute()
    await sql`INSERT INTO lock_probe VALUES (1)`.execute(trx)
    // Without the session lock this INSERT would run inside `trx` and vanish with its rollback.
    const outside = sql`INSERT INTO lock_probe VALUES (2)`.execute(db)
    await Bun.sleep(50)
    await trx.rollback().execute()
    await outside
    const rows = await sql<{ id: number }>`SELECT id FROM lock_probe`.execute(db)
    expect(rows.rows).toEqual([{ id: 2 }])
  })

  test("INSERT, UPDATE and DELETE report the rows they changed; parameters bind as on PostgreSQL", async () => {
    await sql`CREATE TABLE binds (id int PRIMARY KEY, label text, doc jsonb, ref uuid)`.execute(db)
    const ref = "0190a0b0-0000-7000-8000-000000000001"
    const inserted = await sql`
      INSERT INTO binds VALUES
        (${1}::int, ${"one"}, ${JSON.stringify({ a: 1 })}::text::jsonb, ${ref}::uuid),
        (${2}::int, ${null}, ${null}::text::jsonb, ${null}::uuid),
        (3, 'three', '{}', NULL)`.execute(db)
    expect(inserted.numAffectedRows).toBe(3n)
    const updated = await sql`UPDATE binds SET label = ${"x"} WHERE id >= ${2}::int`.execute(db)
    expect(updated.numAffectedRows).toBe(2n)
    const none = await sql`UPDATE binds SET label = 'y' WHERE id = ${99}`.execute(db)
    expect(none.numAffectedRows).toBe(0n)
    const rows = await sql`SELECT id, label, doc, ref FROM binds ORDER BY id`.execute(db)
    expect(rows.rows).toEqual([
      { id: 1, label: "one", doc: { a: 1 }, ref },
      { id: 2, label: "x", doc: null, ref: null },
      { id: 3, label: "x", doc: {}, ref: null },
    ])
    const deleted = await sql`DELETE FROM binds WHERE label = ${"x"}`.execute(db)
    expect(deleted.numAffectedRows).toBe(2n)
  })

  test("closing the layer closes the PGlite it opened, and leaves one it was given open", async () => {
    let opened: Kysely<unknown> | undefined
    await Effect.runPromise(
      Effect.provide(
        Effect.gen(function* () {
          const store = yield* Database
          expect(store.schema).toBe("txbox")
          opened = store.db
          yield* Effect.promise(() => sql`SELECT 1`.execute(store.db))
        }),
        PgliteStore.layer(),
      ),
    )
    const afterClose = await Effect.runPromiseExit(Effect.tryPromise(() => sql`SELECT 1`.execute(opened!)))
    expect(Exit.isFailure(afterClose)).toBe(true)

    await Effect.runPromise(Effect.provide(Effect.void, PgliteStore.layer({ pglite })))
    expect(pglite.closed).toBe(false)
    expect(await count(sql`SELECT 1 AS n`)).toBe(1)
  })

  test("with a dataDir, what one layer committed is there when the next one opens it", async () => {
    const dataDir = await mkdtemp(join(tmpdir(), "txbox-pglite-"))
    const inStore = <A>(f: (db: Kysely<unknown>) => Promise<A>) =>
      Effect.runPromise(
        Effect.provide(
          Effect.flatMap(Database, (store) => Effect.promise(() => f(store.db))),
          PgliteStore.layer({ dataDir }),
        ),
      )
    try {
      await inStore(async (store) => {
        await Effect.runPromise(migrate(store))
        await Effect.runPromise(Outbox.enqueue(store, Ping, { n: 7, note: "kept on disk" }))
      })
      const after = await inStore(async (store) => ({
        applied: (await Effect.runPromise(migrate(store))).applied,
        rows: (await sql<{ payload: unknown }>`SELECT payload FROM txbox.outbox`.execute(store)).rows,
      }))
      expect(after.applied).toEqual([])
      expect(after.rows).toEqual([{ payload: { n: 7, note: "kept on disk" } }])
    } finally {
      await rm(dataDir, { recursive: true, force: true })
    }
  })

  test("bad configuration is a ConfigError", async () => {
    for (const [config, message] of [
      [{ schema: "Bad-Name" }, "not a valid identifier"],
      [{ pglite, dataDir: "/tmp/x" }, "not both"],
    ] as const) {
      const exit = await Effect.runPromiseExit(Effect.provide(Effect.void, PgliteStore.layer(config)))
      expect(String(Exit.isFailure(exit) && exit.cause)).toContain(message)
    }
  })
})

describe("relay and inbox on PGlite", () => {
  test("NOTIFY wakes the relay: a commit is published long before the next poll", async () => {
    const schema = "wake"
    await Effect.runPromise(migrate(db, { schema }))
    const broker = MemoryTransport.makeBroker()
    broker.declare("watcher", [Ping.type])
    const runtime = ManagedRuntime.make(
      Relay.layer({ pollInterval: "1 minute" }).pipe(
        Layer.provide(
          Layer.mergeAll(
            Layer.orDie(PgliteStore.layer({ pglite, schema })),
            MemoryTransport.layerFrom(broker),
          ),
        ),
      ),
    )
    try {
      await runtime.runPromise(Effect.void)
      await Bun.sleep(200) // the relay's first (empty) claim is done; it now waits for a minute or a NOTIFY
      await db
        .transaction()
        .execute((trx) =>
          Effect.runPromise(inSchema(schema, Outbox.enqueue(trx, Ping, { n: 1, note: null }))),
        )
      await eventually("the event is published", async () => broker.stats().published === 1, 5_000)
    } finally {
      await runtime.dispose()
    }
  })

  test("with duplicate deliveries and lost acks, each message's effect is applied exactly once", async () => {
    const schema = "e2e"
    const total = 300
    await Effect.runPromise(migrate(db, { schema }))
    await sql`CREATE TABLE e2e_effects (id bigserial PRIMARY KEY, message_id text NOT NULL, n int NOT NULL)`.execute(
      db,
    )
    const broker = MemoryTransport.makeBroker({ duplicateRate: 0.3, lostAckRate: 0.1 })
    broker.declare("effects", [Ping.type])
    const infra = Layer.mergeAll(
      Layer.orDie(PgliteStore.layer({ pglite, schema })),
      MemoryTransport.layerFrom(broker),
    )
    const runtime = ManagedRuntime.make(
      Layer.mergeAll(
        Relay.layer({ batchSize: 50, pollInterval: "100 millis" }),
        Inbox.layer({
          consumer: "effects",
          handlers: [
            Inbox.handler(Ping, ({ payload, envelope, trx }) =>
              Effect.promise(() =>
                sql`INSERT INTO e2e_effects (message_id, n) VALUES (${envelope.id}, ${payload.n})`.execute(
                  trx,
                ),
              ),
            ),
          ],
        }),
      ).pipe(Layer.provide(infra)),
    )
    try {
      await runtime.runPromise(Effect.void)
      // Ten transactions of 30 events each, committed while the relay and inbox run.
      for (let batch = 0; batch < total / 30; batch++) {
        await db.transaction().execute((trx) =>
          Effect.runPromise(
            inSchema(
              schema,
              Outbox.enqueueMany(
                trx,
                Array.from({ length: 30 }, (_, i) => ({
                  contract: Ping,
                  payload: { n: batch * 30 + i, note: null },
                })),
              ),
            ),
          ),
        )
      }
      const applied = () => count(sql`SELECT count(DISTINCT message_id) AS n FROM e2e_effects`)
      await eventually("every message applied", async () => (await applied()) === total)
      await eventually("the broker queue drained", async () => broker.depth("effects") === 0)
      await Bun.sleep(300) // leave time for a late duplicate to (wrongly) apply

      expect(broker.stats().duplicatesInjected).toBeGreaterThan(0)
      expect(broker.stats().acksLost).toBeGreaterThan(0)
      expect(broker.stats().delivered).toBeGreaterThan(total)
      expect(await count(sql`SELECT count(*) AS n FROM e2e_effects`)).toBe(total)
      expect(await count(sql`SELECT count(DISTINCT n) AS n FROM e2e_effects`)).toBe(total)
      expect(await count(sql`SELECT count(*) AS n FROM e2e.outbox WHERE status <> 'sent'`)).toBe(0)
      expect(
        await count(
          sql`SELECT count(*) AS n FROM e2e.inbox WHERE consumer = 'effects' AND status = 'processed'`,
        ),
      ).toBe(total)
    } finally {
      await runtime.dispose()
    }
  })
})
