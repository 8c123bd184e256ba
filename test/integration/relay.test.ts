import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect, Exit, Layer, ManagedRuntime } from "effect"
import { CompiledQuery, Kysely, PostgresDialect, sql } from "kysely"
import pg from "pg"
import postgres from "postgres"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import * as Outbox from "../../src/Outbox.ts"
import { OutboxStore } from "../../src/ports/OutboxStore.ts"
import * as Relay from "../../src/Relay.ts"
import * as KyselyStore from "../../src/storage/drivers/kysely/KyselyStore.ts"
import { statements } from "../../src/storage/sql/SqlOutboxStore.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { collect } from "../support/amqp.ts"
import { amqpUrl, uniqueName } from "../support/db.ts"
import { startTcpProxy } from "../support/tcpProxy.ts"
import {
  eventually,
  type MigratedDatabase,
  migratedDatabase,
  outboxCounts,
  storeLayer,
} from "../support/txbox.ts"

const OrderPlaced = defineEvent({
  type: "orders.order-placed",
  version: 1,
  schema: v.object({ orderId: v.pipe(v.string(), v.uuid()), total: v.number() }),
})

let t: MigratedDatabase
beforeAll(async () => {
  t = await migratedDatabase("relay")
})
afterAll(async () => {
  await t.close()
})

const fast = {
  pollInterval: "100 millis",
  retry: { initialDelay: "50 millis", maxDelay: "200 millis", maxAttempts: 3 },
  outageRetry: { initialDelay: "50 millis", maxDelay: "500 millis" },
} as const

/** A relay on the shared test database, publishing to `exchange` (through `url` if given). */
const startRelay = (exchange: string, config: Relay.RelayConfig = {}, url = amqpUrl()) =>
  ManagedRuntime.make(
    Relay.layer({ ...fast, ...config }).pipe(
      Layer.provide(
        Layer.mergeAll(
          storeLayer(t.url),
          Layer.orDie(AmqpTransport.layer({ url, exchange, publishTimeout: "3 seconds" })),
        ),
      ),
    ),
  )

const enqueueOrders = async (count: number, options: Outbox.EnqueueOptions = {}) => {
  const ids: string[] = []
  await t.db.transaction().execute(async (trx) => {
    const events = Array.from({ length: count }, () => ({
      contract: OrderPlaced,
      payload: { orderId: crypto.randomUUID(), total: 10 },
      options,
    }))
    const written = await Effect.runPromise(Outbox.enqueueMany(trx, events))
    ids.push(...written.map((w) => w.id))
  })
  return ids
}

/** A relay publishing to a fresh exchange whose messages `seen` collects, for the length of `body`. */
const withRelay = async (
  name: string,
  config: Relay.RelayConfig,
  body: (seen: Awaited<ReturnType<typeof collect>>) => Promise<void>,
) => {
  const exchange = uniqueName(name)
  const seen = await collect(amqpUrl(), exchange)
  const relay = startRelay(exchange, config)
  await relay.runPromise(Effect.void)
  try {
    await body(seen)
  } finally {
    await relay.dispose()
    await seen.close()
  }
}

const rowsOf = async (ids: string[]) =>
  (
    await sql<{ id: string; status: string; attempts: number; last_error: string | null; visible_at: Date }>`
      SELECT id, status, attempts, last_error, visible_at FROM txbox.outbox WHERE id = ANY(${ids}::uuid[])`.execute(
      t.db,
    )
  ).rows

describe("enqueue", () => {
  test("a rolled-back transaction publishes nothing; a committed one is published as a CloudEvent", async () => {
    const exchange = uniqueName("relay-basic")
    const seen = await collect(amqpUrl(), exchange)
    const rolledBack = crypto.randomUUID()
    await t.db
      .transaction()
      .execute(async (trx) => {
        await Effect.runPromise(Outbox.enqueue(trx, OrderPlaced, { orderId: rolledBack, total: 1 }))
        throw new Error("business rule failed")
      })
      .catch(() => {})
    const orderId = crypto.randomUUID()
    let traceId = ""
    const written = await t.db.transaction().execute((trx) =>
      Effect.runPromise(
        Effect.gen(function* () {
          traceId = (yield* Effect.currentSpan).traceId
          return yield* Outbox.enqueue(
            trx,
            OrderPlaced,
            { orderId, total: 42 },
            { partitionKey: orderId, tenantId: "acme" },
          )
        }).pipe(Effect.withSpan("place-order")),
      ),
    )
    const relay = startRelay(exchange)
    await relay.runPromise(Effect.void)
    try {
      await eventually("the committed event arrives", async () => seen.events.length >= 1)
      await Bun.sleep(300)
      expect(seen.events).toHaveLength(1)
      // Sent in a batch message (the default), read as the binary-mode message it stands for.
      expect(seen.messages[0]!.properties.contentType).toBe("application/cloudevents-batch+json")
      const msg = seen.events[0]!
      expect(JSON.parse(msg.content.toString())).toEqual({ orderId, total: 42 })
      expect(msg.properties.messageId).toBe(written.id)
      expect(msg.properties.type).toBe("orders.order-placed")
      expect(msg.properties.contentType).toBe("application/json")
      expect(msg.properties.deliveryMode).toBe(2)
      const h = msg.properties.headers!
      expect(h["cloudEvents:specversion"]).toBe("1.0")
      expect(h["cloudEvents:id"]).toBe(written.id)
      expect(h["cloudEvents:type"]).toBe("orders.order-placed")
      expect(typeof h["cloudEvents:source"]).toBe("string")
      expect(Number.isNaN(Date.parse(String(h["cloudEvents:time"])))).toBe(false)
      expect(String(h.traceparent)).toMatch(new RegExp(`^00-${traceId}-[0-9a-f]{16}-0[01]$`))
      expect(h["partition-key"]).toBe(orderId)
      expect(h["tenant-id"]).toBe("acme")
      const rows = await sql<{ n: string }>`
        SELECT count(*) AS n FROM txbox.outbox WHERE payload->>'orderId' = ${rolledBack}`.execute(t.db)
      expect(Number(rows.rows[0]!.n)).toBe(0)
      // Stored as a JSON object (queryable), not as a JSON string holding the text.
      const stored = await sql<{ kind: string; total: number }>`
        SELECT jsonb_typeof(payload) AS kind, (payload->>'total')::int AS total FROM txbox.outbox WHERE id = ${written.id}::uuid`.execute(
        t.db,
      )
      expect(stored.rows[0]).toEqual({ kind: "object", total: 42 })
    } finally {
      await relay.dispose()
      await seen.close()
    }
  })

  test("an invalid payload is a ValidationError and writes nothing", async () => {
    const before = await outboxCounts(t.db)
    const exit = await t.db.transaction().execute((trx) =>
      Effect.runPromiseExit(
        Outbox.enqueueMany(trx, [
          { contract: OrderPlaced, payload: { orderId: crypto.randomUUID(), total: 1 } },
          { contract: OrderPlaced, payload: { orderId: "nope", total: 1 } },
        ]),
      ),
    )
    expect(Exit.isFailure(exit)).toBe(true)
    expect(String(Exit.isFailure(exit) && exit.cause)).toContain("ValidationError")
    expect(await outboxCounts(t.db)).toEqual(before)
  })

  test("bad options are typed errors and write nothing", async () => {
    const before = await outboxCounts(t.db)
    for (const options of [
      { messageId: "not-a-uuid" },
      { headers: { "cloudEvents:id": "x" } },
      { visibleAt: new Date(Number.NaN) },
    ]) {
      const exit = await Effect.runPromiseExit(
        Outbox.enqueue(t.db, OrderPlaced, { orderId: crypto.randomUUID(), total: 1 }, options),
      )
      expect(String(Exit.isFailure(exit) && exit.cause)).toContain("ValidationError")
    }
    expect(await outboxCounts(t.db)).toEqual(before)
  })
})

describe("relay", () => {
  test("a claim's heartbeat (extend) and release read its rows on the primary key, not the pending backlog", async () => {
    await sql`DELETE FROM txbox.outbox`.execute(t.db)
    await sql`INSERT INTO txbox.outbox (id, type, version, payload, headers)
      SELECT gen_random_uuid(), 't', 1, '{}', '{}' FROM generate_series(1, 20000)`.execute(t.db)
    await sql`ANALYZE txbox.outbox`.execute(t.db)
    try {
      const q = statements(t.db.withSchema("txbox"), "txbox")
      const ids = JSON.stringify(
        (await sql<{ id: string }>`SELECT id FROM txbox.outbox LIMIT 10`.execute(t.db)).rows.map((r) => r.id),
      )
      const token = crypto.randomUUID()
      const plan = async (compiled: { sql: string; parameters: ReadonlyArray<unknown> }) =>
        (await t.db.executeQuery(CompiledQuery.raw(`EXPLAIN ${compiled.sql}`, [...compiled.parameters]))).rows
          .map((row) => (row as Record<string, string>)["QUERY PLAN"])
          .join("\n")
      for (const compiled of [q.extend({ token, leaseMs: 1000, ids }), q.release({ token, ids })]) {
        const text = await plan(compiled)
        // A partition's primary key (outbox_default_pkey, outbox_p20261128_pkey: migration 0015).
        expect(text).toMatch(/Index Scan on outbox_\w*pkey/)
        // The backlog's partition (random v4 ids: the default one); an empty day partition may be read whole.
        expect(text).not.toContain("Seq Scan on outbox_default")
      }
    } finally {
      await sql`DELETE FROM txbox.outbox`.execute(t.db)
    }
  })

  test("a claim given up on before its answer (a timeout) hands the rows it took straight back", async () => {
    await sql`DELETE FROM txbox.outbox`.execute(t.db)
    const ids = await enqueueOrders(3)
    // Another session holds a lock the claim waits for (a held claim's row locks and a leased
    // claim's UPDATE alike): the claim is sent, and answers late.
    const blocker = new pg.Client({ connectionString: t.url })
    await blocker.connect()
    await blocker.query("BEGIN; LOCK TABLE txbox.outbox IN EXCLUSIVE MODE")
    const runtime = ManagedRuntime.make(storeLayer(t.url))
    try {
      const exit = await runtime.runPromiseExit(
        Effect.gen(function* () {
          const store = yield* OutboxStore
          return yield* store.claim(10, 30_000).pipe(Effect.timeout(300))
        }),
      )
      expect(Exit.isFailure(exit)).toBe(true)
      await blocker.query("COMMIT")
      const held = async () =>
        (
          await sql<{ held: number }>`
            SELECT count(*)::int AS held FROM txbox.outbox
            WHERE id = ANY(${ids}::uuid[]) AND (lock_token IS NOT NULL OR visible_at > now() OR id NOT IN (
              SELECT id FROM txbox.outbox WHERE id = ANY(${ids}::uuid[]) FOR UPDATE SKIP LOCKED))`.execute(
            t.db,
          )
        ).rows[0]?.held
      // The late claim took the rows (they were held a moment) and gave them back.
      await eventually("the late claim's rows released", async () => (await held()) === 0, 5_000)
      const claimed = await sql<{ n: number }>`
        SELECT count(*)::int AS n FROM txbox.outbox WHERE id = ANY(${ids}::uuid[]) AND status = 'pending'`.execute(
        t.db,
      )
      expect(claimed.rows[0]?.n).toBe(3)
    } finally {
      await blocker.end()
      await runtime.dispose()
    }
  })

  test("a delayed message is published at or after its due time, not before", () =>
    withRelay("relay-delay", {}, async (seen) => {
      const committedAt = Date.now()
      const [id] = await enqueueOrders(1, { delay: "1500 millis" })
      await Bun.sleep(1000)
      expect(seen.counts.has(id!)).toBe(false)
      await eventually("the delayed message arrives", async () => seen.counts.has(id!), 10_000)
      expect(Date.now() - committedAt).toBeGreaterThanOrEqual(1500)
      // The broker may hand the message on before the relay's mark commits.
      await eventually("the row is marked sent", async () => (await rowsOf([id!]))[0]?.status === "sent")
      const row = await sql<{ gap: number }>`
        SELECT extract(epoch FROM published_at - occurred_at) * 1000 AS gap FROM txbox.outbox WHERE id = ${id!}::uuid`.execute(
        t.db,
      )
      expect(Number(row.rows[0]!.gap)).toBeGreaterThanOrEqual(1500)
    }))

  test("enqueue wakes relays with NOTIFY only while no committed row is due and unclaimed and no relay published within 100 ms", async () => {
    // A LISTEN of our own on the outbox channel counts the wake-ups; no relay runs on this database.
    const listener = postgres(t.url, { max: 1, onnotice: () => {} })
    let wakeups = 0
    await listener.listen("txbox.outbox", () => {
      wakeups++
    })
    try {
      await sql`DELETE FROM txbox.outbox`.execute(t.db)
      const settle = () => Bun.sleep(300)
      await enqueueOrders(1) // nothing due before it: a relay may be idle, wake it
      await settle()
      expect(wakeups).toBe(1)
      await enqueueOrders(2) // the first row is due and unclaimed: a relay is due to look anyway
      await enqueueOrders(1)
      await settle()
      expect(wakeups).toBe(1)
      // Claimed rows are not due (their lease moved visible_at): the relay on them is woken again.
      await sql`UPDATE txbox.outbox SET visible_at = now() + interval '30 seconds'`.execute(t.db)
      await enqueueOrders(1)
      await settle()
      expect(wakeups).toBe(2)
      // Rows due later (a delay) do not count either.
      await sql`DELETE FROM txbox.outbox`.execute(t.db)
      await enqueueOrders(1, { delay: "1 hour" })
      await enqueueOrders(1)
      await settle()
      expect(wakeups).toBe(4)
      // A relay that published within the last 100 ms is warm and looks again by itself (0014). (A
      // publish time ahead of the clock keeps that true however slow this machine is.)
      await sql`DELETE FROM txbox.outbox`.execute(t.db)
      const justPublished = sql`clock_timestamp() + interval '1 minute'`
      await sql`INSERT INTO txbox.outbox (id, type, version, payload, status, published_at)
                VALUES (gen_random_uuid(), 'x', 1, '{}', 'sent', ${justPublished})`.execute(t.db)
      await enqueueOrders(1)
      await sql`UPDATE txbox.outbox SET status = 'sent', published_at = ${justPublished}`.execute(t.db)
      await enqueueOrders(1)
      await settle()
      expect(wakeups).toBe(4)
      // 55 ms ago is still warm (under 0013's 50 ms it woke them: two publishes of a relay looking
      // every 50 ms are often a little further apart than that).
      await sql`UPDATE txbox.outbox SET status = 'sent', published_at = clock_timestamp() - interval '55 ms'`.execute(
        t.db,
      )
      await enqueueOrders(1)
      await settle()
      expect(wakeups).toBe(4)
      // Once the last publish is older than that, a relay may have gone idle: wake it.
      await sql`UPDATE txbox.outbox SET status = 'sent', published_at = clock_timestamp() - interval '150 ms'`.execute(
        t.db,
      )
      await enqueueOrders(1)
      await settle()
      expect(wakeups).toBe(5)
      // Only enqueue wakes relays (0013 dropped the trigger): a row of your own SQL waits for a look or a poll.
      await sql`DELETE FROM txbox.outbox`.execute(t.db)
      await sql`INSERT INTO txbox.outbox (id, type, version, payload) VALUES (gen_random_uuid(), 'x', 1, '{}')`.execute(
        t.db,
      )
      await settle()
      expect(wakeups).toBe(5)
    } finally {
      await listener.end()
      await sql`DELETE FROM txbox.outbox`.execute(t.db)
    }
  })

  test("a bulk enqueue into a drained outbox wakes relays and stays linear", async () => {
    // Its own database: the planner's statistics are part of the scenario.
    const own = await migratedDatabase("relay_bulk")
    const listener = postgres(own.url, { max: 1, onnotice: () => {} })
    let wakeups = 0
    try {
      // A drained outbox whose statistics say every row is sent: with 0005's trigger the planner then
      // compared each new row with every other (a nested loop over the transition table): 20,000 rows
      // took 5.7 s, 60,000 over 20 s.
      await sql`INSERT INTO txbox.outbox (id, type, version, payload)
                SELECT gen_random_uuid(), 'x', 1, '{}' FROM generate_series(1, 30000)`.execute(own.db)
      await sql`UPDATE txbox.outbox SET status = 'sent', published_at = now()`.execute(own.db)
      await sql`VACUUM ANALYZE txbox.outbox`.execute(own.db)
      await sql`TRUNCATE txbox.outbox`.execute(own.db)
      // Listening from here on: the setup's own INSERT notified too.
      await listener.listen("txbox.outbox", () => {
        wakeups++
      })
      const events = Array.from({ length: 30_000 }, () => ({
        contract: OrderPlaced,
        payload: { orderId: crypto.randomUUID(), total: 1 },
      }))
      const written = await own.db.transaction().execute(async (trx) => {
        // Far above what the bounded check needs (≈ 0.2 s here), far below the quadratic one.
        await sql`SET LOCAL statement_timeout = '5s'`.execute(trx)
        return Effect.runPromise(Outbox.enqueueMany(trx, events))
      })
      expect(written).toHaveLength(30_000)
      const counted = await sql<{
        n: number
      }>`SELECT count(*)::int AS n FROM txbox.outbox WHERE status = 'pending'`.execute(own.db)
      expect(counted.rows[0]!.n).toBe(30_000)
      // Every due row is this statement's: nothing else will bring a relay, so it notifies.
      await eventually("the bulk insert's NOTIFY", async () => wakeups === 1, 3_000)
    } finally {
      await listener.end()
      await own.close()
    }
  })

  test("a row whose producer skipped the NOTIFY is published within moments, not at the next poll", () =>
    // A poll no test waits for: only a NOTIFY or the relay's second look can publish in time.
    withRelay("relay-relook", { pollInterval: "1 hour" }, async (seen) => {
      await sql`DELETE FROM txbox.outbox`.execute(t.db)
      for (let round = 0; round < 20; round++) {
        // Producers racing the relay's last batch: some of them see a due row and skip the NOTIFY.
        const ids = (await Promise.all([enqueueOrders(1), enqueueOrders(1), enqueueOrders(1)])).flat()
        await eventually(
          `round ${round} published`,
          async () => ids.every((id) => seen.counts.has(id)),
          3_000,
        )
      }
    }))

  test("with a 30 s poll, a row due by time (a delay, a dead relay's lease) is published within moments of coming due", () =>
    // Coming due wakes nobody: only the relay's probe of the next due row can publish it in time.
    withRelay("relay-due", { pollInterval: "30 seconds" }, async (seen) => {
      await sql`DELETE FROM txbox.outbox`.execute(t.db)
      const publishedWithin = async (id: string, dueMs: number) => {
        const since = Date.now()
        await eventually("published", async () => seen.counts.has(id), 10_000)
        expect(Date.now() - since).toBeGreaterThanOrEqual(dueMs - 250)
        expect(Date.now() - since).toBeLessThan(dueMs + 1_500)
      }
      const [delayed] = await enqueueOrders(1, { delay: "2 seconds" })
      await publishedWithin(delayed!, 2_000)
      // A relay that died holding a claim: the row comes due when its lease runs out.
      const leased = await t.db.transaction().execute(async (trx) => {
        const written = await Effect.runPromise(
          Outbox.enqueue(trx, OrderPlaced, { orderId: crypto.randomUUID(), total: 1 }),
        )
        await sql`UPDATE txbox.outbox SET lock_token = gen_random_uuid(), visible_at = now() + interval '2 seconds'
                  WHERE id = ${written.id}::uuid`.execute(trx)
        return written.id
      })
      await publishedWithin(leased, 2_000)
    }))

  test("a producer that skipped the NOTIFY and commits after the relay's second look is still published within moments", () =>
    // No poll within the test: only the relay's own looks can find the late row.
    withRelay("relay-warm", { pollInterval: "1 hour" }, async (seen) => {
      await sql`DELETE FROM txbox.outbox`.execute(t.db)
      let precondition = false
      for (let attempt = 0; attempt < 5 && !precondition; attempt++) {
        // A backlog keeps the relay busy for a while; Z is committed meanwhile, due and unclaimed.
        const backlog = await enqueueOrders(3_000)
        const [z] = await enqueueOrders(1)
        // T enqueues while Z waits: its wake-up check sees a due, unclaimed row and skips the NOTIFY.
        const trx = await t.db.startTransaction().execute()
        let late = ""
        try {
          const written = await Effect.runPromise(
            Outbox.enqueue(trx, OrderPlaced, { orderId: crypto.randomUUID(), total: 1 }),
          )
          late = written.id
          const waiting = await sql<{ unclaimed: boolean }>`
            SELECT lock_token IS NULL AND visible_at <= clock_timestamp() AS unclaimed
            FROM txbox.outbox WHERE id = ${z}`.execute(trx)
          precondition = waiting.rows[0]?.unclaimed === true
          // T stays open until the relay has published Z, looked once more, and gone idle.
          await eventually("Z published", async () => seen.counts.has(z!), 10_000)
          await eventually(
            "backlog published",
            async () => backlog.every((id) => seen.counts.has(id)),
            10_000,
          )
          await new Promise((resolve) => setTimeout(resolve, 300))
          await trx.commit().execute()
        } catch (error) {
          await trx.rollback().execute()
          throw error
        }
        await eventually("the late row published", async () => seen.counts.has(late), 3_000)
      }
      // The scenario above only tests something when T's insert really found Z unclaimed.
      expect(precondition).toBe(true)
    }))

  test("enqueue writes every column as given, for one row and for several (due times from the database clock)", async () => {
    const at = new Date(Date.now() + 3_600_000)
    for (const count of [1, 3]) {
      const delayed = await enqueueOrders(count, {
        delay: "90 seconds",
        routingKey: "orders.custom",
        tenantId: "t-1",
        headers: { "x-kind": "test" },
      })
      const scheduled = await enqueueOrders(count, { visibleAt: at })
      const rows = await sql<{
        id: string
        due_in: number
        routing_key: string
        tenant_id: string
        kind: string
      }>`
        SELECT id::text, extract(epoch FROM visible_at - now()) AS due_in, routing_key, tenant_id,
               headers->>'x-kind' AS kind
        FROM txbox.outbox WHERE id = ANY(${delayed}::uuid[])`.execute(t.db)
      expect(rows.rows.length).toBe(count)
      for (const row of rows.rows) {
        expect(Number(row.due_in)).toBeGreaterThan(80)
        expect(Number(row.due_in)).toBeLessThanOrEqual(90)
        expect([row.routing_key, row.tenant_id, row.kind]).toEqual(["orders.custom", "t-1", "test"])
      }
      const due = await sql<{ visible_at: Date }>`
        SELECT visible_at FROM txbox.outbox WHERE id = ANY(${scheduled}::uuid[])`.execute(t.db)
      expect(due.rows.map((r) => new Date(r.visible_at).getTime())).toEqual(scheduled.map(() => at.getTime()))
      await sql`DELETE FROM txbox.outbox WHERE id = ANY(${[...delayed, ...scheduled]}::uuid[])`.execute(t.db)
    }
  })

  test("an unroutable message is retried, then dead with a clear last_error; others keep flowing", async () => {
    const exchange = uniqueName("relay-unroutable")
    const seen = await collect(amqpUrl(), exchange, "orders.#")
    const routable = await enqueueOrders(5)
    const [lost] = await enqueueOrders(1, { routingKey: "nobody.listens" })
    const more = await enqueueOrders(5)
    const relay = startRelay(exchange)
    await relay.runPromise(Effect.void)
    try {
      await eventually(
        "the unroutable message is dead",
        async () => (await rowsOf([lost!]))[0]?.status === "dead",
      )
      const [row] = await rowsOf([lost!])
      expect(row!.attempts).toBe(3)
      expect(row!.last_error).toMatch(/unroutable|NO_ROUTE/i)
      await eventually("the routable messages arrive", async () =>
        [...routable, ...more].every((id) => seen.counts.has(id)),
      )
      expect((await rowsOf([...routable, ...more])).every((r) => r.status === "sent")).toBe(true)
    } finally {
      await relay.dispose()
      await seen.close()
    }
  })

  test("with the broker unreachable rows stay pending with their attempts unspent, then drain when it returns", async () => {
    const exchange = uniqueName("relay-outage")
    const seen = await collect(amqpUrl(), exchange)
    const target = new URL(amqpUrl())
    const proxy = await startTcpProxy(target.hostname, Number(target.port))
    proxy.block()
    const ids = await enqueueOrders(20)
    const relay = startRelay(exchange, {}, proxy.urlFor(amqpUrl()))
    await relay.runPromise(Effect.void)
    try {
      // Several outage back-offs of the relay's loop (50 → 500 ms) pass.
      await Bun.sleep(2500)
      const during = await rowsOf(ids)
      // An outage is not the message's fault: no attempt spent, nothing dead, nothing left claimed.
      expect(during.every((r) => r.status === "pending" && r.attempts === 0)).toBe(true)
      proxy.unblock()
      await eventually("every message arrives after the outage", async () =>
        ids.every((id) => seen.counts.has(id)),
      )
      await eventually("every row is sent", async () => (await rowsOf(ids)).every((r) => r.status === "sent"))
    } finally {
      await relay.dispose()
      await proxy.close()
      await seen.close()
    }
  })
})

test("in-process retention deletes old sent rows only, and never pending or dead ones", async () => {
  const insert = (status: string, publishedDaysAgo: number | null) =>
    sql<{ id: string }>`
      INSERT INTO txbox.outbox (id, type, version, payload, status, published_at, visible_at)
      VALUES (gen_random_uuid(), 'retention.test', 1, '{}'::jsonb, ${status},
              CASE WHEN ${publishedDaysAgo}::int IS NULL THEN NULL ELSE now() - ${publishedDaysAgo}::int * interval '1 day' END,
              now() + interval '1 day')
      RETURNING id`
      .execute(t.db)
      .then((r) => r.rows[0]!.id)
  const oldSent = await Promise.all([insert("sent", 10), insert("sent", 9)])
  const recentSent = await insert("sent", 1)
  const pending = await insert("pending", null)
  const dead = await insert("dead", null)
  const relay = startRelay(uniqueName("relay-retention"), {
    retention: { olderThan: "7 days", every: "200 millis", batchSize: 1 },
  })
  await relay.runPromise(Effect.void)
  try {
    await eventually("the old sent rows are gone", async () => (await rowsOf(oldSent)).length === 0)
    expect((await rowsOf([recentSent, pending, dead])).map((r) => r.status).sort()).toEqual([
      "dead",
      "pending",
      "sent",
    ])
  } finally {
    await relay.dispose()
  }
})

test("a row a driver hands back with a field of another type (a timestamp as text): each attempt fails, then it is dead; the relay goes on", async () => {
  // The app's own pool, whose type parser leaves timestamptz (OID 1184) as text: the relay's
  // encoder finds no Date in occurredAt.
  const pool = new pg.Pool({
    connectionString: t.url,
    max: 2,
    types: {
      getTypeParser: ((oid: number, format?: "text" | "binary") =>
        oid === 1184
          ? (value: string) => value
          : pg.types.getTypeParser(oid, format)) as typeof pg.types.getTypeParser,
    },
  })
  const app = new Kysely<unknown>({ dialect: new PostgresDialect({ pool }) })
  const exchange = uniqueName("relay-text-time")
  const seen = await collect(amqpUrl(), exchange)
  const relay = ManagedRuntime.make(
    Relay.layer({ ...fast }).pipe(
      Layer.provide(
        Layer.mergeAll(
          Layer.orDie(KyselyStore.layer({ db: app, commitRefusesAborted: false })),
          Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange, publishTimeout: "3 seconds" })),
        ),
      ),
    ),
  )
  const ids = await enqueueOrders(1)
  await relay.runPromise(Effect.void)
  try {
    await eventually("dead", async () => (await rowsOf(ids))[0]?.status === "dead")
    const [row] = await rowsOf(ids)
    expect(row?.attempts).toBe(3)
    expect(row?.last_error).toContain("could not encode message")
    expect(seen.messages).toHaveLength(0)
  } finally {
    await relay.dispose()
    await seen.close()
    await app.destroy()
  }
})
