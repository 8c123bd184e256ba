// The relay under crashes and restarts, each relay in a process of its own.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect } from "effect"
import { Kysely, sql } from "kysely"
import { PostgresJSDialect } from "kysely-postgres-js"
import postgres from "postgres"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import * as Outbox from "../../src/Outbox.ts"
import { migrate } from "../../src/storage/sql/migrator.ts"
import { collect } from "../support/amqp.ts"
import { amqpUrl, uniqueName } from "../support/db.ts"
import { startLocalPostgres } from "../support/postgres.ts"
import { startFixture } from "../support/processes.ts"
import { eventually, type MigratedDatabase, migratedDatabase, outboxCounts } from "../support/txbox.ts"

const Ping = defineEvent({ type: "faults.ping", version: 1, schema: v.object({ n: v.number() }) })

// biome-ignore lint/suspicious/noExplicitAny: test database
const enqueuePings = async (db: Kysely<any>, from: number, count: number, chunk = 1000) => {
  const ids: string[] = []
  for (let start = from; start < from + count; start += chunk) {
    const size = Math.min(chunk, from + count - start)
    const events = Array.from({ length: size }, (_, i) => ({ contract: Ping, payload: { n: start + i } }))
    const written = await db
      .transaction()
      .execute((trx) => Effect.runPromise(Outbox.enqueueMany(trx, events)))
    ids.push(...written.map((w) => w.id))
  }
  return ids
}

/** Records every transition out of `pending` so a test can show no row was marked twice. */
// biome-ignore lint/suspicious/noExplicitAny: test database
const installMarkLog = async (db: Kysely<any>) => {
  await sql`CREATE TABLE IF NOT EXISTS mark_log (id uuid NOT NULL, status text NOT NULL)`.execute(db)
  await sql`
    CREATE OR REPLACE FUNCTION log_mark() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN INSERT INTO mark_log VALUES (NEW.id, NEW.status); RETURN NULL; END $$`.execute(db)
  await sql`
    CREATE OR REPLACE TRIGGER log_mark AFTER UPDATE ON txbox.outbox FOR EACH ROW
    WHEN (OLD.status = 'pending' AND NEW.status <> 'pending') EXECUTE FUNCTION log_mark()`.execute(db)
}

// biome-ignore lint/suspicious/noExplicitAny: test database
const markedTwice = async (db: Kysely<any>) =>
  Number(
    (
      await sql<{ n: string }>`
        SELECT count(*) AS n FROM (SELECT id FROM mark_log GROUP BY id HAVING count(*) > 1) twice`.execute(db)
    ).rows[0]!.n,
  )

const relayEnv = (dbUrl: string, exchange: string, extra: Record<string, string> = {}) => ({
  DB_URL: dbUrl,
  AMQP_URL: amqpUrl(),
  EXCHANGE: exchange,
  ...extra,
})

let t: MigratedDatabase
beforeAll(async () => {
  t = await migratedDatabase("relay_faults")
  await installMarkLog(t.db)
})
afterAll(async () => {
  await t.close()
})

describe("relay under faults", () => {
  test("3 relay processes over 10,000 messages: each arrives, none pending, none marked twice", async () => {
    await sql`TRUNCATE txbox.outbox, mark_log`.execute(t.db)
    const exchange = uniqueName("faults-three")
    const seen = await collect(amqpUrl(), exchange)
    const ids = await enqueuePings(t.db, 0, 10_000)
    const relays = await Promise.all(
      [1, 2, 3].map(() =>
        startFixture("test/fixtures/relay.ts", relayEnv(t.url, exchange, { BATCH: "200" })),
      ),
    )
    try {
      await eventually(
        "every message is sent",
        async () => (await outboxCounts(t.db)).sent === 10_000,
        90_000,
      )
      await eventually("every message arrives", async () => ids.every((id) => seen.counts.has(id)), 30_000)
      expect(await outboxCounts(t.db)).toEqual({ pending: 0, sent: 10_000, dead: 0 })
      expect(await markedTwice(t.db)).toBe(0)
      // All three took part (SKIP LOCKED spreads the work instead of serialising it).
      const tokens = await sql<{ n: string }>`SELECT count(*) AS n FROM mark_log`.execute(t.db)
      expect(Number(tokens.rows[0]!.n)).toBe(10_000)
    } finally {
      await Promise.all(relays.map((r) => r.kill("SIGTERM")))
      await seen.close()
    }
  })

  test("a relay killed with SIGKILL mid-run loses no message", async () => {
    await sql`TRUNCATE txbox.outbox, mark_log`.execute(t.db)
    const exchange = uniqueName("faults-kill")
    const seen = await collect(amqpUrl(), exchange)
    const ids = await enqueuePings(t.db, 0, 20_000)
    const first = await startFixture(
      "test/fixtures/relay.ts",
      relayEnv(t.url, exchange, { BATCH: "100", LEASE_MS: "2000" }),
    )
    await eventually("the first relay is under way", async () => (await outboxCounts(t.db)).sent > 0)
    await first.kill("SIGKILL")
    const afterKill = await outboxCounts(t.db)
    expect(afterKill.pending).toBeGreaterThan(0) // it really died mid-run
    const second = await startFixture(
      "test/fixtures/relay.ts",
      relayEnv(t.url, exchange, { BATCH: "500", LEASE_MS: "2000" }),
    )
    try {
      await eventually(
        "the second relay drains everything",
        async () => (await outboxCounts(t.db)).sent === 20_000,
        90_000,
      )
      await eventually("every message arrives", async () => ids.every((id) => seen.counts.has(id)), 30_000)
      expect(await markedTwice(t.db)).toBe(0)
    } finally {
      await second.kill("SIGTERM")
      await seen.close()
    }
  })

  test("SIGTERM stops a relay gracefully: it exits 0 and leaves no row claimed", async () => {
    await sql`TRUNCATE txbox.outbox, mark_log`.execute(t.db)
    const exchange = uniqueName("faults-term")
    const seen = await collect(amqpUrl(), exchange)
    await enqueuePings(t.db, 0, 20_000)
    const relay = await startFixture(
      "test/fixtures/relay.ts",
      relayEnv(t.url, exchange, { BATCH: "500", LEASE_MS: "60000" }),
    )
    try {
      await eventually("the relay is under way", async () => (await outboxCounts(t.db)).sent > 0)
      expect(await relay.kill("SIGTERM")).toBe(0)
      const claimed = await sql<{ n: string }>`
        SELECT count(*) AS n FROM txbox.outbox WHERE status = 'pending' AND lock_token IS NOT NULL`.execute(
        t.db,
      )
      expect(Number(claimed.rows[0]!.n)).toBe(0)
      // Every row it marked sent really went out.
      const sent = (await outboxCounts(t.db)).sent
      await eventually("the sent messages are on the queue", async () => seen.events.length >= sent)
    } finally {
      await relay.kill("SIGKILL")
      await seen.close()
    }
  })

  for (const driver of ["pg", "postgres.js"] as const) {
    test(`PostgreSQL restarted mid-run with ${driver}: the relay resumes by itself and loses nothing`, async () => {
      const server = await startLocalPostgres({ name: `restart-${driver.replace(".", "")}` })
      // biome-ignore lint/suspicious/noExplicitAny: test database
      const db = new Kysely<any>({
        dialect: new PostgresJSDialect({ postgres: postgres(server.url, { max: 2, onnotice: () => {} }) }),
      })
      const exchange = uniqueName(`faults-restart-${driver}`)
      const seen = await collect(amqpUrl(), exchange)
      await Effect.runPromise(migrate(db, {}))
      const relay = await startFixture(
        "test/fixtures/relay.ts",
        relayEnv(server.url, exchange, { DRIVER: driver, BATCH: "50", LEASE_MS: "3000" }),
      )
      try {
        relay.process.on("exit", (code, signal) =>
          console.error(`relay (${driver}) exited: ${code ?? signal}\n${relay.output()}`),
        )
        const ids = await enqueuePings(db, 0, 3000, 100)
        await eventually("the relay is under way", async () => seen.counts.size > 0)
        await server.restart()
        const more = await enqueuePings(db, 3000, 2000, 100)
        await eventually(
          "every message, before and after the restart, arrives",
          async () => [...ids, ...more].every((id) => seen.counts.has(id)),
          60_000,
        )
        await eventually("every row is sent", async () => (await outboxCounts(db)).sent === 5000, 30_000)
        expect(relay.process.exitCode).toBeNull() // it survived, and did the work itself
      } finally {
        await relay.kill("SIGKILL")
        await db.destroy()
        await seen.close()
        await server.stop()
      }
    })
  }
})
