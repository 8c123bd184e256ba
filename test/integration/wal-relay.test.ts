// The relay's WAL source (issue #27): a PostgreSQL of its own with wal_level = logical, real
// RabbitMQ; outcomes read from the outbox table, the slot's catalog row and the broker.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect, Exit, Layer, ManagedRuntime, Scope } from "effect"
import { Kysely, PostgresDialect, sql } from "kysely"
import { PostgresJSDialect } from "kysely-postgres-js"
import pg from "pg"
import postgres from "postgres"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import { ConfigError } from "../../src/Errors.ts"
import * as Outbox from "../../src/Outbox.ts"
import * as Relay from "../../src/Relay.ts"
import * as PgStore from "../../src/storage/drivers/pg/PgStore.ts"
import * as WalLog from "../../src/storage/drivers/pg/walLog.ts"
import { migrate } from "../../src/storage/sql/migrator.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { collect } from "../support/amqp.ts"
import { runTxbox } from "../support/cli.ts"
import { amqpUrl, databaseUrl, uniqueName } from "../support/db.ts"
import { type LocalPostgres, startLocalPostgres } from "../support/postgres.ts"
import { startFixture } from "../support/processes.ts"
import { eventually, migratedDatabase, outboxCounts } from "../support/txbox.ts"

const OrderPlaced = defineEvent({
  type: "orders.order-placed",
  version: 1,
  schema: v.object({ orderId: v.string(), n: v.number() }),
})

let server: LocalPostgres
// biome-ignore lint/suspicious/noExplicitAny: tests read txbox's tables freely
let db: Kysely<any>
// node-postgres for the test's own statements: it rides out the restart test (postgres.js can throw
// from a timer on a connection the restart cut: docs/drivers-under-faults.md).
let pool: pg.Pool
beforeAll(async () => {
  server = await startLocalPostgres({
    name: "wal",
    settings: ["wal_level = logical", "max_replication_slots = 20"],
  })
  pool = new pg.Pool({ connectionString: server.url, max: 4 })
  // An idle client, or one checked out, whose backend the restart ends emits 'error': the statement
  // in flight fails with it; unheard, the event would end the test process.
  pool.on("error", () => {})
  pool.on("connect", (c) => c.on("error", () => {}))
  db = new Kysely({ dialect: new PostgresDialect({ pool }) })
  await Effect.runPromise(migrate(db, { schema: "txbox" }))
})
afterAll(async () => {
  await db?.destroy()
  await server?.stop()
})

const fast = {
  retry: { initialDelay: "200 millis", maxDelay: "1 second", maxAttempts: 1000 },
  outageRetry: { initialDelay: "50 millis", maxDelay: "500 millis" },
} as const

/** A WAL relay with a store and a log of its own, publishing to `exchange`. */
const startRelay = async (
  exchange: string,
  config: Relay.RelayConfig = {},
  wal: Partial<WalLog.WalLogConfig> = {},
) => {
  const runtime = ManagedRuntime.make(
    Layer.mergeAll(
      Layer.orDie(PgStore.layer({ url: server.url, poolSize: 4 })),
      Layer.orDie(
        WalLog.layer({ url: server.url, heartbeat: "300 millis", standbyRetry: "200 millis", ...wal }),
      ),
      Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange, publishTimeout: "3 seconds" })),
    ),
  )
  const scope = await runtime.runPromise(Scope.make())
  const handle = await runtime.runPromise(
    Relay.make({ source: "wal", sweepAfter: "1 second", ...fast, ...config }).pipe(Scope.provide(scope)),
  )
  return {
    stats: () => Effect.runPromise(handle.stats),
    health: () => Effect.runPromise(handle.health),
    dispose: async () => {
      await runtime.runPromise(Scope.close(scope, Exit.void))
      await runtime.dispose()
    },
  }
}

const enqueue = (count: number, options: (i: number) => Outbox.EnqueueOptions = () => ({})) =>
  db.transaction().execute((trx) =>
    Effect.runPromise(
      Outbox.enqueueMany(
        trx,
        Array.from({ length: count }, (_, i) => ({
          contract: OrderPlaced,
          payload: { orderId: crypto.randomUUID(), n: i },
          options: options(i),
        })),
      ),
    ),
  )

const slotRow = async (slot = "txbox_outbox") =>
  (
    await sql<{ active: boolean; behind: string | null }>`
      SELECT active, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::text AS behind
      FROM pg_replication_slots WHERE slot_name = ${slot}`.execute(db)
  ).rows[0]

const resetOutbox = () => sql`TRUNCATE txbox.outbox`.execute(db)

describe("a relay with source: wal", () => {
  test("publishes each committed row once, from the log, and marks it sent", async () => {
    await resetOutbox()
    const exchange = uniqueName("wal_basic")
    const wire = await collect(amqpUrl(), exchange)
    const relay = await startRelay(exchange)
    try {
      const ids: string[] = []
      for (let t = 0; t < 20; t++) ids.push(...(await enqueue(10)).map((r) => r.id))
      await eventually("every row sent", async () => (await outboxCounts(db)).sent === 200, 20_000)
      await eventually("every row on the wire", async () => wire.counts.size === 200, 10_000)
      // Once each: the sweep (after 1 s) found nothing of the log's left pending.
      expect([...wire.counts.values()].every((n) => n === 1)).toBe(true)
      expect(new Set(ids)).toEqual(new Set(wire.counts.keys()))
      const health = await relay.health()
      expect(health.wal?.reading).toBe(true)
      expect(health.wal?.slot).toBe("txbox_outbox")
      expect((await slotRow())?.active).toBe(true)
    } finally {
      await relay.dispose()
      await wire.close()
    }
  }, 60_000)
})

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

const statusOf = async (id: string) =>
  (
    await sql<{
      status: string
      attempts: number
    }>`SELECT status, attempts FROM txbox.outbox WHERE id = ${id}`.execute(db)
  ).rows[0]

/** Ends the slot's reader's connection and drops the slot, as a failover to a replica without it would. */
const dropSlot = async (slot = "txbox_outbox") => {
  await eventually(
    "the slot dropped",
    async () => {
      await sql`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = ${slot} AND active`.execute(
        db,
      )
      return sql`SELECT pg_drop_replication_slot(${slot})`.execute(db).then(
        () => true,
        () => false,
      )
    },
    10_000,
  )
}

describe("what the log's relay leaves to its sweep", () => {
  test("a delayed message is published by the sweep once due, not by the log at commit", async () => {
    await resetOutbox()
    const exchange = uniqueName("wal_delay")
    const wire = await collect(amqpUrl(), exchange)
    const relay = await startRelay(exchange)
    try {
      const [delayed] = await enqueue(1, () => ({ delay: "2 seconds" }))
      const [fresh] = await enqueue(1)
      await eventually(
        "the fresh one sent",
        async () => (await statusOf(fresh!.id))?.status === "sent",
        5_000,
      )
      expect((await statusOf(delayed!.id))?.status).toBe("pending")
      await eventually(
        "the delayed one sent",
        async () => (await statusOf(delayed!.id))?.status === "sent",
        10_000,
      )
      await eventually("both on the wire", async () => wire.counts.size === 2, 5_000)
      expect(wire.counts.get(delayed!.id)).toBe(1)
    } finally {
      await relay.dispose()
      await wire.close()
    }
  }, 60_000)

  test("a message the broker returns follows the retry rule through the sweep, and ends dead", async () => {
    await resetOutbox()
    // No queue bound: every publish comes back unroutable (mandatory), an attempt spent each time.
    const exchange = uniqueName("wal_unroutable")
    const relay = await startRelay(exchange, {
      retry: { initialDelay: "100 millis", maxDelay: "200 millis", maxAttempts: 3 },
    })
    try {
      const [message] = await enqueue(1)
      await eventually(
        "dead after 3 attempts",
        async () => (await statusOf(message!.id))?.status === "dead",
        20_000,
      )
      expect((await statusOf(message!.id))?.attempts).toBe(3)
      // The relay counts a verdict once its mark's answer is back, a moment after the mark's commit
      // shows in the table (a held claim's mark rides in the next claim's round trip).
      await eventually("the relay counts it dead", async () => (await relay.stats()).dead === 1, 5_000)
      const stats = await relay.stats()
      expect(stats.dead).toBe(1)
      expect(stats.retried).toBe(2)
    } finally {
      await relay.dispose()
    }
  }, 60_000)

  test("a slot lost (dropped, with its reader cut off) is created anew; rows committed meanwhile are swept, none skipped", async () => {
    await resetOutbox()
    const exchange = uniqueName("wal_lost_slot")
    const wire = await collect(amqpUrl(), exchange)
    // Lost while no relay ran: the new slot starts after these rows.
    let relay = await startRelay(exchange)
    await relay.dispose()
    await dropSlot()
    const ids: string[] = []
    for (let i = 0; i < 5; i++) ids.push(...(await enqueue(10)).map((r) => r.id))
    relay = await startRelay(exchange)
    try {
      // And under a running relay, with rows committed around the drop.
      await dropSlot()
      for (let i = 0; i < 5; i++) ids.push(...(await enqueue(10)).map((r) => r.id))
      await eventually("every row sent", async () => (await outboxCounts(db)).sent === 100, 20_000)
      await eventually("every row on the wire", async () => ids.every((id) => wire.counts.has(id)), 10_000)
      expect(await outboxCounts(db)).toEqual({ pending: 0, sent: 100, dead: 0 })
      await eventually(
        "reading the new slot",
        async () => (await relay.health()).wal?.reading === true,
        10_000,
      )
    } finally {
      await relay.dispose()
      await wire.close()
    }
  }, 60_000)
})

describe("one reader per slot", () => {
  test("a second relay stands by, and takes over when the reader is gone", async () => {
    await resetOutbox()
    const exchange = uniqueName("wal_standby")
    const wire = await collect(amqpUrl(), exchange)
    const first = await startRelay(exchange)
    const second = await startRelay(exchange)
    const disposed = new Set<unknown>()
    try {
      await eventually("one reads", async () => {
        const [a, b] = [(await first.health()).wal?.reading, (await second.health()).wal?.reading]
        return a !== b
      })
      // Held for a while: the standby keeps trying and keeps being refused.
      await sleep(1_000)
      const readerIsFirst = (await first.health()).wal?.reading === true
      expect((await second.health()).wal?.reading).toBe(!readerIsFirst)
      const [reader, standby] = readerIsFirst ? [first, second] : [second, first]
      const before = await enqueue(20)
      await eventually("sent by the reader", async () => (await outboxCounts(db)).sent === 20, 10_000)
      await reader.dispose()
      disposed.add(reader)
      await eventually(
        "the standby reads",
        async () => (await standby.health()).wal?.reading === true,
        10_000,
      )
      const after = await enqueue(20)
      await eventually("sent by the new reader", async () => (await outboxCounts(db)).sent === 40, 10_000)
      await eventually(
        "all on the wire",
        async () => [...before, ...after].every((r) => wire.counts.has(r.id)),
        5_000,
      )
      // Counted once the settle's answer is back, a moment after the table shows it.
      await eventually("the standby counts them", async () => (await standby.stats()).published >= 20, 5_000)
      expect((await standby.stats()).published).toBeGreaterThanOrEqual(20)
    } finally {
      for (const relay of [first, second]) if (!disposed.has(relay)) await relay.dispose()
      await wire.close()
    }
  }, 60_000)
})

describe("the slot holds no WAL for an idle outbox", () => {
  test("while other tables write megabytes of WAL, the slot's confirmed position keeps up", async () => {
    await resetOutbox()
    const exchange = uniqueName("wal_idle")
    const relay = await startRelay(exchange)
    try {
      await eventually("reading", async () => (await relay.health()).wal?.reading === true, 10_000)
      await sql`CREATE TABLE IF NOT EXISTS noise (id bigserial PRIMARY KEY, filler text)`.execute(db)
      const start = await sql<{ lsn: string }>`SELECT pg_current_wal_lsn()::text AS lsn`.execute(db)
      for (let i = 0; i < 10; i++) {
        await sql`INSERT INTO noise (filler) SELECT repeat('x', 200) FROM generate_series(1, 5000)`.execute(
          db,
        )
      }
      const written = await sql<{ bytes: string }>`
        SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), ${start.rows[0]!.lsn}::pg_lsn)::text AS bytes`.execute(
        db,
      )
      expect(Number(written.rows[0]!.bytes)).toBeGreaterThan(5_000_000)
      // Behind by no more than a heartbeat's worth once the heartbeats carry the WAL end.
      await eventually("the slot caught up", async () => Number((await slotRow())?.behind) < 100_000, 15_000)
    } finally {
      await relay.dispose()
    }
  }, 60_000)
})

describe("per-key order", () => {
  test("each key's messages go out in their enqueue order (commit order), however the transactions interleave", async () => {
    await resetOutbox()
    const exchange = uniqueName("wal_order")
    const wire = await collect(amqpUrl(), exchange)
    const relay = await startRelay(exchange)
    try {
      const keys = ["k1", "k2", "k3"]
      await Promise.all(
        Array.from({ length: 8 }, async (_, worker) => {
          for (let i = 0; i < 15; i++) {
            await enqueue(2, (j) => ({ partitionKey: keys[(worker + i + j) % keys.length]! }))
          }
        }),
      )
      await eventually("all 240 on the wire", async () => wire.counts.size === 240, 20_000)
      const seqs = new Map<string, number[]>()
      for (const event of wire.events) {
        const headers = event.properties.headers as Record<string, unknown>
        const key = String(headers["partition-key"])
        const seq = Number(headers["txbox-partition-seq"])
        seqs.set(key, [...(seqs.get(key) ?? []), seq])
      }
      expect([...seqs.keys()].sort()).toEqual(keys)
      for (const [, list] of seqs) {
        expect(list).toEqual([...list].sort((a, b) => a - b))
        expect(list).toEqual(Array.from({ length: list.length }, (_, i) => i + 1))
      }
    } finally {
      await relay.dispose()
      await wire.close()
    }
  }, 60_000)
})

describe("faults", () => {
  const fixtureEnv = (exchange: string, more: Record<string, string> = {}) => ({
    DB_URL: server.url,
    AMQP_URL: amqpUrl(),
    EXCHANGE: exchange,
    WAL: "1",
    BATCH: "100",
    // Far off: what the new reader publishes again is the log's unconfirmed window, not a sweep's.
    SWEEP_MS: "60000",
    ...more,
  })

  test("a relay SIGKILLed mid-batch: nothing lost, duplicates only inside the unconfirmed window", async () => {
    await resetOutbox()
    const exchange = uniqueName("wal_kill")
    const wire = await collect(amqpUrl(), exchange)
    const ids: string[] = []
    for (let i = 0; i < 100; i++) ids.push(...(await enqueue(20)).map((r) => r.id))
    const first = await startFixture("test/fixtures/relay.ts", fixtureEnv(exchange))
    await eventually("under way", async () => (await outboxCounts(db)).sent > 0, 20_000)
    await first.kill("SIGKILL")
    const afterKill = await outboxCounts(db)
    expect(afterKill.pending).toBeGreaterThan(0)
    const second = await startFixture("test/fixtures/relay.ts", fixtureEnv(exchange))
    try {
      await eventually("every row sent", async () => (await outboxCounts(db)).sent === 2000, 60_000)
      await eventually("every row on the wire", async () => ids.every((id) => wire.counts.has(id)), 10_000)
      const twice = [...wire.counts.values()].filter((n) => n > 1).length
      // The killed relay's unconfirmed batches: at most its batch in flight and the one before
      // (BATCH 100 rows, whole transactions of 20).
      expect(twice).toBeLessThanOrEqual(200)
      expect(await outboxCounts(db)).toEqual({ pending: 0, sent: 2000, dead: 0 })
    } finally {
      await second.kill()
      await wire.close()
    }
  }, 120_000)

  test("PostgreSQL restarted under a running relay: every row published", async () => {
    await resetOutbox()
    const exchange = uniqueName("wal_restart")
    const wire = await collect(amqpUrl(), exchange)
    const relay = await startFixture("test/fixtures/relay.ts", fixtureEnv(exchange, { SWEEP_MS: "3000" }))
    const ids: string[] = []
    try {
      const writing = (async () => {
        for (let i = 0; i < 60; i++) {
          try {
            ids.push(...(await enqueue(5)).map((r) => r.id))
          } catch {
            // The restart cut this transaction: not committed, nothing owed.
          }
          await sleep(50)
        }
      })()
      await sleep(1_000)
      await server.restart()
      await writing
      await eventually(
        "every committed row sent",
        async () => (await outboxCounts(db)).sent === ids.length,
        60_000,
      )
      await eventually("every row on the wire", async () => ids.every((id) => wire.counts.has(id)), 10_000)
      expect((await outboxCounts(db)).pending).toBe(0)
    } finally {
      await relay.kill()
      await wire.close()
    }
  }, 120_000)
})

describe("txbox wal and txbox status", () => {
  const txbox = (args: ReadonlyArray<string>) =>
    runTxbox([...args, "--url", server.url], { unset: ["DATABASE_URL"] })

  test("create, status and drop a slot and its publication; status shows what the slot keeps", async () => {
    const created = await txbox(["wal", "create", "--slot", "cli_slot"])
    expect(created.stderr).toBe("")
    expect(created.code).toBe(0)
    expect(created.stdout).toContain("publication cli_slot and slot cli_slot are ready")
    // Idempotent.
    expect((await txbox(["wal", "create", "--slot", "cli_slot"])).code).toBe(0)
    const slots = JSON.parse((await txbox(["wal", "status", "--json"])).stdout) as Array<
      Record<string, unknown>
    >
    expect(slots.find((s) => s.slot === "cli_slot")).toMatchObject({ plugin: "pgoutput", active: false })
    const status = await txbox(["status"])
    expect(status.code).toBe(0)
    expect(status.stdout).toContain("WAL SLOT")
    expect(status.stdout).toContain("cli_slot")
    const publications = await sql<{ n: string }>`
      SELECT count(*) AS n FROM pg_publication_tables WHERE pubname = 'cli_slot' AND schemaname = 'txbox' AND tablename = 'outbox'`.execute(
      db,
    )
    expect(Number(publications.rows[0]!.n)).toBe(1)

    const dropped = await txbox(["wal", "drop", "--slot", "cli_slot"])
    expect(dropped.code).toBe(0)
    expect(dropped.stdout).toContain("slot cli_slot: dropped; publication cli_slot: dropped")
    expect(await slotRow("cli_slot")).toBeUndefined()
    expect((await txbox(["wal", "drop", "--slot", "cli_slot"])).stdout).toContain("not found")
  }, 60_000)

  test("a bad slot name is a usage error; a server without wal_level = logical says what to set", async () => {
    const bad = await txbox(["wal", "create", "--slot", "Bad-Name"])
    expect(bad.code).toBe(2)
    expect(bad.stderr).toContain("--slot Bad-Name")
    // The suite's shared server runs with wal_level = replica.
    const plain = await migratedDatabase("wal_cli")
    try {
      const replica = await runTxbox(["wal", "create", "--url", plain.url], { unset: ["DATABASE_URL"] })
      expect(replica.code).toBe(2)
      expect(replica.stderr).toContain("wal_level = logical")
    } finally {
      await plain.close()
    }
  }, 60_000)
})

describe("WalLog.layer's checks", () => {
  test("a slot name another database's outbox holds is a ConfigError: slot names are the cluster's", async () => {
    // This database's slot (made here if no test before made it).
    await Effect.runPromise(Effect.scoped(WalLog.make({ url: server.url })))
    await sql`CREATE DATABASE other_app`.execute(db)
    const url = new URL(server.url)
    url.pathname = "/other_app"
    const other = postgres(url.toString(), { max: 1, onnotice: () => {} })
    try {
      await Effect.runPromise(
        migrate(new Kysely({ dialect: new PostgresJSDialect({ postgres: other }) }), {}),
      )
      const exit = await Effect.runPromiseExit(Effect.scoped(WalLog.make({ url: url.toString() })))
      const reason = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
      const failure = reason !== undefined && "error" in reason ? reason.error : undefined
      expect(failure).toBeInstanceOf(ConfigError)
      expect(String((failure as ConfigError).message)).toContain("belongs to database postgres")
      // With a name of its own it is set up.
      const own = await Effect.runPromiseExit(
        Effect.scoped(WalLog.make({ url: url.toString(), slot: "other_app_outbox" })),
      )
      expect(Exit.isSuccess(own)).toBe(true)
    } finally {
      await other.end({ timeout: 2 })
      await sql`SELECT pg_drop_replication_slot('other_app_outbox')`.execute(db).catch(() => undefined)
      await sql`DROP DATABASE other_app WITH (FORCE)`.execute(db)
    }
  })

  test("a server without wal_level = logical is a ConfigError that says what to set", async () => {
    const exit = await Effect.runPromiseExit(Effect.scoped(WalLog.make({ url: databaseUrl() })))
    expect(Exit.isFailure(exit)).toBe(true)
    const error = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
    const failure = error !== undefined && "error" in error ? error.error : undefined
    expect(failure).toBeInstanceOf(ConfigError)
    expect(String((failure as ConfigError).message)).toContain("wal_level = logical")
  })
})
