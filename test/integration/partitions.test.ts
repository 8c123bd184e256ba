// The partitioned outbox and inbox (migration 0015, issue #26) on real PostgreSQL: the migration
// from the plain tables with rows in them, partitions created ahead, dedupe across partitions, and
// drops refused while a partition holds pending or dead rows or is inside the dedupe window.
// Counted from the tables and the catalog, never from what the code under test reports.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect, Layer } from "effect"
import { type Kysely, sql } from "kysely"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import { uuidv7 } from "../../src/core/uuid.ts"
import * as Inbox from "../../src/Inbox.ts"
import * as Outbox from "../../src/Outbox.ts"
import * as Relay from "../../src/Relay.ts"
import { migrations } from "../../src/storage/sql/migrations.generated.ts"
import { migrate } from "../../src/storage/sql/migrator.ts"
import { DAY_MS, idBound, partitionName } from "../../src/storage/sql/partitionBounds.ts"
import {
  dropPartitions,
  ensurePartitions,
  listPartitions,
  QUEUE_PARTITION_SETTINGS,
} from "../../src/storage/sql/partitions.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { runTxbox } from "../support/cli.ts"
import { amqpUrl, createTestDatabase, type TestDatabase, uniqueName } from "../support/db.ts"
import {
  eventually,
  type MigratedDatabase,
  migratedDatabase,
  runtimeOf,
  storeLayer,
} from "../support/txbox.ts"

const Ping = defineEvent({ type: "part.ping", version: 1, schema: v.object({ n: v.number() }) })

// biome-ignore lint/suspicious/noExplicitAny: test database
type Db = Kysely<any>

/** Which partition holds the outbox row `id` / the inbox row `messageId`, by the catalog. */
const outboxHome = async (db: Db, id: string) =>
  (
    await sql<{
      home: string
    }>`SELECT tableoid::regclass::text AS home FROM txbox.outbox WHERE id = ${id}`.execute(db)
  ).rows[0]?.home
const inboxHomes = async (db: Db, messageId: string) =>
  (
    await sql<{
      home: string
    }>`SELECT tableoid::regclass::text AS home FROM txbox.inbox WHERE message_id = ${messageId}`.execute(db)
  ).rows.map((r) => r.home)

/** A UUIDv7 made at `ms` (uuidv7's own layout, the time replaced). */
const idAt = (ms: number) => {
  const hex = ms.toString(16).padStart(12, "0")
  const rest = uuidv7().slice(14)
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${rest}`
}

/** A partition of `table` for the day starting at `dayMs`, made by hand (a past day, which `ensurePartitions` never makes). */
const attachDay = async (db: Db, table: "outbox" | "inbox", dayMs: number) => {
  const name = partitionName(table, dayMs, DAY_MS)
  await sql
    .raw(
      `CREATE TABLE txbox.${name} (LIKE txbox.${table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
       ALTER TABLE txbox.${table} ATTACH PARTITION txbox.${name} FOR VALUES FROM ('${idBound(dayMs)}') TO ('${idBound(dayMs + DAY_MS)}')`,
    )
    .execute(db)
  return name
}

const storeInbox = (
  db: Db,
  messageId: string,
  status: "pending" | "processed" | "dead",
  processedAgo = "0",
) =>
  sql`INSERT INTO txbox.inbox (message_id, consumer, type, version, status, processed_at)
      VALUES (${messageId}, 'billing', 'part.ping', 1, ${status},
              CASE WHEN ${status} = 'processed' THEN now() - ${processedAgo}::interval END)
      ON CONFLICT (message_id, consumer) DO NOTHING`.execute(db)

const txbox = (args: ReadonlyArray<string>) => runTxbox(args)

describe("migration 0015 from the plain tables", () => {
  let t: TestDatabase
  let db: Db
  beforeAll(async () => {
    t = await createTestDatabase("partitions_upgrade")
    const { Kysely: K, PostgresDialect } = await import("kysely")
    const pg = (await import("pg")).default
    db = new K({ dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: t.url, max: 2 }) }) })
  })
  afterAll(async () => {
    await db.destroy()
    await t.drop()
  })

  test("rows written before it stay, readable and deduped, in the default partition", async () => {
    await Effect.runPromise(migrate(db, { migrations: migrations.filter((m) => m.version < 15) }))
    const v4 = crypto.randomUUID()
    const events = Array.from({ length: 50 }, (_, n) => ({ contract: Ping, payload: { n } }))
    const written = await db
      .transaction()
      .execute((trx) => Effect.runPromise(Outbox.enqueueMany(trx, events)))
    await sql`UPDATE txbox.outbox SET status = 'dead' WHERE id = ${written[0]!.id}`.execute(db)
    await storeInbox(db, v4, "processed")
    await storeInbox(db, written[1]!.id, "pending")

    const result = await Effect.runPromise(migrate(db))
    expect(result.applied.map((m) => m.version)).toEqual([15, 16, 17, 18, 19, 20])
    const counts = await sql<{ status: string; n: string }>`
      SELECT status, count(*)::text AS n FROM txbox.outbox GROUP BY status ORDER BY status`.execute(db)
    expect(counts.rows).toEqual([
      { status: "dead", n: "1" },
      { status: "pending", n: "49" },
    ])
    expect(await outboxHome(db, written[5]!.id)).toBe("txbox.outbox_default")
    // The primary key still refuses a second copy of a stored message.
    await storeInbox(db, v4, "processed")
    await storeInbox(db, written[1]!.id, "pending")
    expect(await inboxHomes(db, v4)).toEqual(["txbox.inbox_default"])
    expect(await inboxHomes(db, written[1]!.id)).toEqual(["txbox.inbox_default"])
    // On a live table only the days to come are made: today's rows keep going where they go.
    const tomorrowOn = await Effect.runPromise(
      ensurePartitions({ db, schema: "txbox" }, { aheadMs: 2 * DAY_MS, everyMs: DAY_MS }),
    )
    expect(tomorrowOn.skipped).toEqual([])
    const today = Math.floor(Date.now() / DAY_MS) * DAY_MS
    expect(tomorrowOn.created.map((c) => c.name).sort()).toEqual(
      [
        partitionName("inbox", today + DAY_MS, DAY_MS),
        partitionName("inbox", today + 2 * DAY_MS, DAY_MS),
        partitionName("outbox", today + DAY_MS, DAY_MS),
        partitionName("outbox", today + 2 * DAY_MS, DAY_MS),
      ].sort(),
    )
    // Asked for today's too, it is left to the default partition, which holds rows of today.
    const made = await Effect.runPromise(
      ensurePartitions(
        { db, schema: "txbox" },
        { aheadMs: 2 * DAY_MS, everyMs: DAY_MS, includeCurrent: true },
      ),
    )
    expect(made.skipped.map((s) => s.table)).toEqual(["outbox", "inbox"])
    expect(made.created).toEqual([])
    // A row of today still goes to the default partition, so its copies meet it there.
    const later = await db
      .transaction()
      .execute((trx) => Effect.runPromise(Outbox.enqueue(trx, Ping, { n: 99 })))
    expect(await outboxHome(db, later.id)).toBe("txbox.outbox_default")
  })
})

describe("partitions", () => {
  let t: MigratedDatabase
  const tables = () => ({ db: t.db, schema: "txbox" })
  beforeAll(async () => {
    t = await migratedDatabase("partitions")
  })
  afterAll(async () => {
    await t?.close()
  })

  test("created ahead: a new message lands in its day's partition, and so does every copy of it", async () => {
    // Nothing writes yet: today's partition may be made too (a live table gets the next days only).
    const made = await Effect.runPromise(
      ensurePartitions(tables(), { aheadMs: 2 * DAY_MS, everyMs: DAY_MS, includeCurrent: true }),
    )
    expect(made.skipped).toEqual([])
    expect(made.created.length).toBeGreaterThanOrEqual(4)
    // Idempotent: a second run makes nothing.
    const again = await Effect.runPromise(
      ensurePartitions(tables(), { aheadMs: 2 * DAY_MS, everyMs: DAY_MS }),
    )
    expect(again.created).toEqual([])

    const sent = await t.db
      .transaction()
      .execute((trx) => Effect.runPromise(Outbox.enqueue(trx, Ping, { n: 1 })))
    const today = partitionName("outbox", Math.floor(Date.now() / DAY_MS) * DAY_MS, DAY_MS)
    // Every partition, made here or by the migrations (0019), vacuums by a fixed number of dead rows.
    const options = await sql<{ name: string; reloptions: string[] | null }>`
      SELECT c.relname AS name, c.reloptions FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
      WHERE i.inhparent IN ('txbox.outbox'::regclass, 'txbox.inbox'::regclass)`.execute(t.db)
    expect(options.rows.map((r) => r.name)).toEqual(
      expect.arrayContaining(["outbox_default", "inbox_default", today, today.replace("outbox", "inbox")]),
    )
    for (const row of options.rows)
      expect({ name: row.name, options: row.reloptions }).toEqual({
        name: row.name,
        options: Object.entries(QUEUE_PARTITION_SETTINGS).map(([name, value]) => `${name}=${value}`),
      })
    expect(await outboxHome(t.db, sent.id)).toBe(`txbox.${today}`)

    // The same message stored, then redelivered after the next day's partition opened: one row.
    await storeInbox(t.db, sent.id, "processed")
    const tomorrow = Math.floor(Date.now() / DAY_MS) * DAY_MS + DAY_MS
    await storeInbox(t.db, idAt(tomorrow + 1000), "processed")
    await storeInbox(t.db, sent.id, "processed")
    expect(await inboxHomes(t.db, sent.id)).toEqual([`txbox.${today.replace("outbox", "inbox")}`])
    // Ids that are not UUIDv7 (a business key, a v4) go to the default partition.
    await storeInbox(t.db, "order-42:billing", "processed")
    await storeInbox(t.db, "order-42:billing", "processed")
    expect(await inboxHomes(t.db, "order-42:billing")).toEqual(["txbox.inbox_default"])
  })

  test("a drop is refused while a partition holds a pending row or is inside the dedupe window; dead rows go to the archive", async () => {
    const day = (n: number) => Math.floor(Date.now() / DAY_MS) * DAY_MS - n * DAY_MS
    const pendingDay = await attachDay(t.db, "outbox", day(20))
    const deadDay = await attachDay(t.db, "outbox", day(19))
    const cleanDay = await attachDay(t.db, "outbox", day(18))
    const recentInbox = await attachDay(t.db, "inbox", day(20))
    const oldInbox = await attachDay(t.db, "inbox", day(19))
    const orderedDeadInbox = await attachDay(t.db, "inbox", day(18))
    const insertOutbox = async (ms: number, status: string) => {
      const id = idAt(ms)
      await sql`INSERT INTO txbox.outbox (id, type, version, payload, status, last_error)
        VALUES (${id}, 'part.ping', 1, '{"n":7}', ${status}, 'boom')`.execute(t.db)
      return id
    }
    await insertOutbox(day(20) + 5000, "pending")
    const deadId = await insertOutbox(day(19) + 5000, "dead")
    await insertOutbox(day(19) + 6000, "sent")
    await insertOutbox(day(18) + 5000, "sent")
    // A processed copy of a non-v7 id that happens to fall in a past day's range, processed an hour ago.
    await storeInbox(t.db, idAt(day(20) + 7000), "processed", "1 hour")
    await storeInbox(t.db, idAt(day(19) + 7000), "processed", "15 days")
    const deadInbox = idAt(day(19) + 8000)
    await storeInbox(t.db, deadInbox, "dead")
    // A dead message of an ordered key: its key waits on it, so its partition stays.
    await sql`INSERT INTO txbox.inbox (message_id, consumer, type, version, status, partition_key, partition_epoch, partition_seq)
      VALUES (${idAt(day(18) + 9000)}, 'billing', 'part.ping', 1, 'dead', 'k', 1, 3)`.execute(t.db)

    const options = { olderThanMs: 7 * DAY_MS, dedupeWindowMs: 14 * DAY_MS }
    const dry = await Effect.runPromise(dropPartitions(tables(), { ...options, dryRun: true }))
    const byName = new Map(dry.map((d) => [d.name, d]))
    expect(byName.get(pendingDay)?.reason).toBe("holds pending rows")
    expect(byName.get(deadDay)).toMatchObject({ dropped: true, archived: 1 })
    expect(byName.get(cleanDay)).toMatchObject({ dropped: true, archived: 0 })
    expect(byName.get(recentInbox)?.reason).toBe("holds rows processed inside the dedupe window")
    expect(byName.get(oldInbox)).toMatchObject({ dropped: true, archived: 1 })
    expect(byName.get(orderedDeadInbox)?.reason).toContain("holds dead ordered messages")
    expect(dry.some((d) => d.name.endsWith("_default"))).toBe(false)
    // The dry run dropped and archived nothing.
    expect((await Effect.runPromise(listPartitions(tables()))).some((p) => p.name === cleanDay)).toBe(true)
    expect((await sql`SELECT 1 FROM txbox.outbox_archive`.execute(t.db)).rows.length).toBe(0)

    const done = await Effect.runPromise(dropPartitions(tables(), options))
    expect(
      done
        .filter((d) => d.dropped)
        .map((d) => d.name)
        .sort(),
    ).toEqual([cleanDay, deadDay, oldInbox].sort())
    const left = (await Effect.runPromise(listPartitions(tables()))).map((p) => p.name)
    for (const gone of [cleanDay, deadDay, oldInbox]) expect(left).not.toContain(gone)
    for (const kept of [pendingDay, recentInbox, orderedDeadInbox]) expect(left).toContain(kept)
    // The pending row is where it was; the dead ones are in the archives, every column unchanged.
    const pending = await sql<{
      n: string
    }>`SELECT count(*)::text AS n FROM txbox.outbox WHERE status = 'pending'
      AND id >= ${idBound(day(20))}::uuid AND id < ${idBound(day(18))}::uuid`.execute(t.db)
    expect(pending.rows[0]!.n).toBe("1")
    const archived = await sql<{ id: string; status: string; payload: unknown; last_error: string }>`
      SELECT id::text, status, payload, last_error FROM txbox.outbox_archive`.execute(t.db)
    expect(archived.rows).toEqual([{ id: deadId, status: "dead", payload: { n: 7 }, last_error: "boom" }])
    const inboxArchived = await sql<{
      message_id: string
    }>`SELECT message_id FROM txbox.inbox_archive`.execute(t.db)
    expect(inboxArchived.rows).toEqual([{ message_id: deadInbox }])

    // `txbox dead` lists the archived row, and a redrive brings it back, pending, with its id.
    const list = await txbox(["dead", "list", "--url", t.url])
    expect(list.code).toBe(0)
    expect(list.stdout).toContain(deadId)
    expect(list.stdout).toContain("ARCHIVED")
    const redrive = await txbox(["dead", "redrive", "--id", deadId, "--url", t.url])
    expect(redrive.code).toBe(0)
    const back = await sql<{ status: string; attempts: number; home: string }>`
      SELECT status, attempts, tableoid::regclass::text AS home FROM txbox.outbox WHERE id = ${deadId}`.execute(
      t.db,
    )
    expect(back.rows).toEqual([{ status: "pending", attempts: 0, home: "txbox.outbox_default" }])
    expect((await sql`SELECT 1 FROM txbox.outbox_archive`.execute(t.db)).rows.length).toBe(0)
  })

  test("txbox purge --archived-older-than deletes archived dead rows archived before the cutoff, and only those", async () => {
    // From empty archives (the test before left one inbox row there).
    await sql`TRUNCATE txbox.outbox_archive, txbox.inbox_archive`.execute(t.db)
    const oldOutbox = idAt(Date.now() - 40 * DAY_MS)
    const newOutbox = idAt(Date.now() - 39 * DAY_MS)
    const oldInbox = idAt(Date.now() - 38 * DAY_MS)
    const archive = async (table: "outbox" | "inbox", id: string, ago: string) =>
      table === "outbox"
        ? sql`INSERT INTO txbox.outbox_archive (id, type, version, payload, status, archived_at)
            VALUES (${id}, 'part.ping', 1, '{}', 'dead', now() - ${ago}::interval)`.execute(t.db)
        : sql`INSERT INTO txbox.inbox_archive (message_id, consumer, type, version, status, archived_at)
            VALUES (${id}, 'billing', 'part.ping', 1, 'dead', now() - ${ago}::interval)`.execute(t.db)
    await archive("outbox", oldOutbox, "31 days")
    await archive("outbox", newOutbox, "29 days")
    await archive("inbox", oldInbox, "31 days")
    // A dead row still in its table is not the archive's: never touched.
    const liveDead = idAt(Date.now() - 37 * DAY_MS)
    await sql`INSERT INTO txbox.outbox (id, type, version, payload, status)
      VALUES (${liveDead}, 'part.ping', 1, '{}', 'dead')`.execute(t.db)

    const bad = await txbox(["purge", "--older-than", "7d", "--archived-older-than", "soon", "--url", t.url])
    expect(bad.code).toBe(2)
    expect(bad.stderr).toContain("archived-older-than")

    const outboxOnly = await txbox([
      ...["purge", "--older-than", "30d", "--only", "outbox", "--archived-older-than", "30d", "--json"],
      ...["--url", t.url],
    ])
    expect(outboxOnly.code).toBe(0)
    expect(JSON.parse(outboxOnly.stdout)).toMatchObject({
      outbox_archive_deleted: 1,
      inbox_archive_deleted: null,
    })
    const ids = async (table: string, column: string) =>
      (
        await sql<{
          id: string
        }>`SELECT ${sql.ref(column)}::text AS id FROM ${sql.table(`txbox.${table}`)}`.execute(t.db)
      ).rows.map((r) => r.id)
    expect(await ids("outbox_archive", "id")).toEqual([newOutbox])
    expect(await ids("inbox_archive", "message_id")).toEqual([oldInbox])

    const both = await txbox(["purge", "--older-than", "30d", "--archived-older-than", "30d", "--url", t.url])
    expect(both.code).toBe(0)
    expect(both.stdout).toContain("inbox_archive: deleted 1 archived dead row")
    expect(await ids("inbox_archive", "message_id")).toEqual([])
    expect(await ids("outbox_archive", "id")).toEqual([newOutbox])
    const still = await sql`SELECT 1 FROM txbox.outbox WHERE id = ${liveDead} AND status = 'dead'`.execute(
      t.db,
    )
    expect(still.rows.length).toBe(1)
    await sql`DELETE FROM txbox.outbox_archive`.execute(t.db)
    await sql`DELETE FROM txbox.outbox WHERE id = ${liveDead}`.execute(t.db)
  })

  test("txbox partitions list and drop --dry-run, from the command line", async () => {
    const list = await txbox(["partitions", "list", "--url", t.url])
    expect(list.code).toBe(0)
    expect(list.stdout).toContain("outbox_default")
    expect(list.stdout).toContain("DEFAULT")
    const drop = await txbox(["partitions", "drop", "--older-than", "7d", "--dry-run", "--url", t.url])
    expect(drop.code).toBe(0)
    expect(drop.stdout).toMatch(/outbox: kept outbox_p\d{8}: holds pending rows/)
    const bad = await txbox(["partitions", "create", "--every", "5h", "--url", t.url])
    expect(bad.code).toBe(2)
    expect(bad.stderr).toContain("--every 5h")
  })
})

// Day partitions kept forever would grow by one a day, and so would the planning of every claim
// (docs/operations.md): they come with retention, which drops them again.
describe("day partitions come with retention", () => {
  const dayPartitions = async (db: Db, table: "outbox" | "inbox") =>
    (await Effect.runPromise(listPartitions({ db, schema: "txbox" })))
      .filter((p) => p.table === table && !p.isDefault)
      .map((p) => p.name)

  /** Runs `body` with a relay and an inbox of `config`s started on `t`, on RabbitMQ. */
  const running = async (
    t: MigratedDatabase,
    relay: Relay.RelayConfig,
    inbox: Pick<Inbox.InboxConfig, "retention">,
    body: () => Promise<void>,
  ) => {
    const runtime = runtimeOf(
      Layer.mergeAll(
        storeLayer(t.url),
        Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange: uniqueName("parts") })),
      ),
    )
    try {
      await runtime.runPromise(
        Effect.gen(function* () {
          yield* Inbox.make({
            consumer: "billing",
            handlers: [Inbox.handler(Ping, () => Effect.void)],
            ...inbox,
          })
          yield* Relay.make(relay)
          yield* Effect.promise(body)
        }).pipe(Effect.scoped),
      )
    } finally {
      await runtime.dispose()
    }
  }

  test("a relay and an inbox at their defaults make none: every row stays in the default partition", async () => {
    const t = await migratedDatabase("partitions_defaults")
    try {
      await running(t, { pollInterval: "100 millis" }, {}, async () => {
        const sent = await t.db
          .transaction()
          .execute((trx) => Effect.runPromise(Outbox.enqueue(trx, Ping, { n: 1 })))
        await eventually("the message handled", async () => (await inboxHomes(t.db, sent.id)).length === 1)
        expect(await outboxHome(t.db, sent.id)).toBe("txbox.outbox_default")
        expect(await inboxHomes(t.db, sent.id)).toEqual(["txbox.inbox_default"])
      })
      expect(await dayPartitions(t.db, "outbox")).toEqual([])
      expect(await dayPartitions(t.db, "inbox")).toEqual([])
    } finally {
      await t.close()
    }
  })

  test("a creator waits for another one holding the creators' lock, rather than leaving its days to the next pass", async () => {
    const t = await migratedDatabase("partitions_busy")
    try {
      // The lock ensurePartitions takes (partitions.ts: the migrator's namespace, the schema's key),
      // held by another transaction for 400 ms, as a relay's pass beside an inbox's holds it.
      let locked!: () => void
      const lockedNow = new Promise<void>((resolve) => {
        locked = resolve
      })
      const other = t.db.transaction().execute(async (trx) => {
        await sql`SELECT pg_advisory_xact_lock(${0x7478626f}, hashtext('txbox.partitions'))`.execute(trx)
        locked()
        await new Promise((resolve) => setTimeout(resolve, 400))
      })
      await lockedNow
      const made = await Effect.runPromise(
        ensurePartitions(
          { db: t.db, schema: "txbox" },
          { aheadMs: 2 * DAY_MS, everyMs: DAY_MS, tables: ["outbox"] },
        ),
      )
      await other
      expect(made.created.length).toBeGreaterThanOrEqual(2)
      expect(await dayPartitions(t.db, "outbox")).toEqual(made.created.map((c) => c.name))
    } finally {
      await t.close()
    }
  })

  test("with retention, the relay and the inbox make the next days' and drop the old ones", async () => {
    const t = await migratedDatabase("partitions_retention")
    try {
      const old = Math.floor(Date.now() / DAY_MS) * DAY_MS - 20 * DAY_MS
      const oldOutbox = await attachDay(t.db, "outbox", old)
      const oldInbox = await attachDay(t.db, "inbox", old)
      await storeInbox(t.db, idAt(old + 1000), "processed", "20 days")
      const retention = { olderThan: "7 days" } as const
      await running(t, { pollInterval: "100 millis", retention }, { retention }, async () => {
        await eventually(
          "the old days dropped and the next days made",
          async () =>
            !(await dayPartitions(t.db, "outbox")).includes(oldOutbox) &&
            !(await dayPartitions(t.db, "inbox")).includes(oldInbox) &&
            (await dayPartitions(t.db, "outbox")).length >= 3 &&
            (await dayPartitions(t.db, "inbox")).length >= 3,
        )
      })
      // The next three days' (today's stays with the default partition: the tables are live).
      const next = [1, 2, 3].map((n) => Math.floor(Date.now() / DAY_MS) * DAY_MS + n * DAY_MS)
      for (const table of ["outbox", "inbox"] as const)
        expect(await dayPartitions(t.db, table)).toEqual(
          expect.arrayContaining(next.map((day) => partitionName(table, day, DAY_MS))),
        )
    } finally {
      await t.close()
    }
  })
})
