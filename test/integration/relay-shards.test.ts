// Relays that take a share of the outbox (`RelayConfig.shard`, issue #28): by tenant, on their own
// index, so another tenant's backlog and poison never delay them; by a hash of the partition key,
// so every row goes to exactly one share and a key to one relay. Real PostgreSQL and RabbitMQ;
// outcomes read from the outbox table and the broker.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect, Exit, Layer, ManagedRuntime, Scope } from "effect"
import { CompiledQuery, sql } from "kysely"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import * as Outbox from "../../src/Outbox.ts"
import * as Relay from "../../src/Relay.ts"
import { statements } from "../../src/storage/sql/SqlOutboxStore.ts"
import { shardParams } from "../../src/storage/sql/shard.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { collect } from "../support/amqp.ts"
import { amqpUrl, uniqueName } from "../support/db.ts"
import { eventually, type MigratedDatabase, migratedDatabase, storeLayer } from "../support/txbox.ts"

const OrderPlaced = defineEvent({
  type: "orders.order-placed",
  version: 1,
  schema: v.object({ orderId: v.string(), total: v.number() }),
})

let t: MigratedDatabase
beforeAll(async () => {
  t = await migratedDatabase("relay_shards")
})
afterAll(async () => {
  await t.close()
})

const fast = {
  retry: { initialDelay: "200 millis", maxDelay: "1 second", maxAttempts: 1000 },
  outageRetry: { initialDelay: "50 millis", maxDelay: "500 millis" },
} as const

/** A relay with a store of its own (its own claim tokens), publishing to `exchange`. */
const startRelay = async (exchange: string, config: Relay.RelayConfig) => {
  const runtime = ManagedRuntime.make(
    Layer.mergeAll(
      storeLayer(t.url),
      Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange, publishTimeout: "3 seconds" })),
    ),
  )
  const scope = await runtime.runPromise(Scope.make())
  const handle = await runtime.runPromise(Relay.make({ ...fast, ...config }).pipe(Scope.provide(scope)))
  return {
    stats: () => Effect.runPromise(handle.stats),
    dispose: async () => {
      await runtime.runPromise(Scope.close(scope, Exit.void))
      await runtime.dispose()
    },
  }
}

const enqueue = (count: number, options: (i: number) => Outbox.EnqueueOptions) =>
  t.db.transaction().execute((trx) =>
    Effect.runPromise(
      Outbox.enqueueMany(
        trx,
        Array.from({ length: count }, (_, i) => ({
          contract: OrderPlaced,
          payload: { orderId: `o-${i}`, total: i },
          options: options(i),
        })),
      ),
    ),
  )

const pendingOf = async (tenant: string) =>
  Number(
    (
      await sql<{ n: string }>`SELECT count(*) AS n FROM txbox.outbox
        WHERE status = 'pending' AND tenant_id = ${tenant}`.execute(t.db)
    ).rows[0]!.n,
  )

describe("relay shards", () => {
  test("by tenant: another tenant's backlog of 50,000 and its poison message never delay a tenant's message", async () => {
    const exchange = uniqueName("shards-tenant")
    // Bound to orders.# only: the poison message's routing key reaches no queue (returned, retried).
    const seen = await collect(amqpUrl(), exchange, "orders.#")
    await enqueue(1, () => ({ tenantId: "acme", routingKey: "poison.nowhere" }))
    const [template] = await enqueue(1, () => ({ tenantId: "acme" }))
    // The backlog: copies of one enqueued row under fresh ids, due now.
    await sql`INSERT INTO txbox.outbox (id, type, version, payload, headers, routing_key, partition_key,
                  tenant_id, occurred_at, status, attempts, visible_at)
                SELECT gen_random_uuid(), type, version, payload, headers, routing_key, partition_key,
                  tenant_id, occurred_at, status, attempts, now()
                FROM txbox.outbox, generate_series(1, 50000) WHERE id = ${template!.id}`.execute(t.db)
    await sql`ANALYZE txbox.outbox`.execute(t.db)

    // The tenant's claim reads its own entries of outbox_tenant_due (migration 0018), not acme's:
    // one tenant (an equality) and several (= ANY).
    const q = statements(t.db.withSchema("txbox"), "txbox")
    const planOf = (tenants: ReadonlyArray<string>) => {
      const claim = q.claimHeld({
        limit: 1000,
        idleMs: "30000ms",
        sinceMs: 3_600_000,
        shard: shardParams({ tenants }),
      })
      return t.db.transaction().execute(async (trx) => {
        const { rows } = await trx.executeQuery(
          CompiledQuery.raw(`EXPLAIN ${claim.sql}`, [...claim.parameters]) as CompiledQuery<{
            "QUERY PLAN": string
          }>,
        )
        return rows.map((r) => r["QUERY PLAN"]).join("\n")
      })
    }
    for (const tenants of [["globex"], ["globex", "initech"]]) {
      expect(await planOf(tenants)).toMatch(
        /Index (Only )?Scan using outbox_default_tenant_id_visible_at_idx/,
      )
    }

    const acme = await startRelay(exchange, { shard: { tenants: ["acme"] }, batchSize: 200 })
    const globex = await startRelay(exchange, { shard: { tenants: ["globex"] } })
    try {
      await eventually("acme's relay is busy with its backlog", async () => seen.events.length >= 1000)
      const started = Date.now()
      const [mine] = await enqueue(1, () => ({ tenantId: "globex" }))
      await eventually("globex's message is published", async () =>
        seen.events.some((e) => e.properties.messageId === mine!.id),
      )
      const tookMs = Date.now() - started
      const acmeLeft = await pendingOf("acme")
      console.error(`globex's message published in ${tookMs} ms; acme's pending then: ${acmeLeft}`)
      // Its poll is 100 ms; published while acme still had most of its backlog waiting.
      expect(tookMs).toBeLessThan(2000)
      expect(acmeLeft).toBeGreaterThan(10_000)
      // Each relay took only its own tenant's rows; the poison one is still pending, retried. (A
      // confirmed batch is marked, and counted, with the relay's next look: within MARK_WAIT_MS.)
      await eventually(
        "globex's message is marked sent",
        async () => (await pendingOf("globex")) === 0 && (await globex.stats()).published >= 1,
      )
      expect((await globex.stats()).published).toBe(1)
      expect((await acme.stats()).retried).toBeGreaterThan(0)
    } finally {
      await Promise.all([acme.dispose(), globex.dispose()])
      await seen.close()
    }
  }, 120_000)

  test("beside a tenant's relay, a relay without shard takes every row, a tenant's in no share included", async () => {
    await sql`DELETE FROM txbox.outbox`.execute(t.db)
    const exchange = uniqueName("shards-mixed")
    const seen = await collect(amqpUrl(), exchange)
    const written = await enqueue(300, (i) => ({ tenantId: ["acme", "globex", "initech"][i % 3]! }))
    const acme = await startRelay(exchange, { shard: { tenants: ["acme"] }, batchSize: 20 })
    const all = await startRelay(exchange, { batchSize: 20 })
    try {
      await eventually("the broker delivered every row", async () => seen.counts.size >= 300)
      expect(written.every((w) => seen.counts.get(w.id) === 1)).toBe(true)
      // The last batches are counted once marked, with each relay's next look (MARK_WAIT_MS at most).
      await eventually("every row is marked sent", async () => {
        const [mine, every] = await Promise.all([acme.stats(), all.stats()])
        return mine.published + every.published >= 300
      })
      const [mine, every] = await Promise.all([acme.stats(), all.stats()])
      expect(mine.published + every.published).toBe(300)
      // Only the unsharded relay could take globex's and initech's 200.
      expect(every.published).toBeGreaterThanOrEqual(200)
      const { rows } = await sql<{ tenant_id: string; relays: string }>`
        SELECT tenant_id, count(DISTINCT right(lock_token::text, 8)) AS relays FROM txbox.outbox
        WHERE status = 'sent' GROUP BY tenant_id ORDER BY tenant_id`.execute(t.db)
      expect(rows.map((r) => [r.tenant_id, Number(r.relays) >= 1])).toEqual([
        ["acme", true],
        ["globex", true],
        ["initech", true],
      ])
    } finally {
      await Promise.all([acme.dispose(), all.dispose()])
      await seen.close()
    }
  }, 60_000)

  test("by hash: three shares publish every row once, and each key through one relay", async () => {
    await sql`DELETE FROM txbox.outbox`.execute(t.db)
    const exchange = uniqueName("shards-hash")
    const seen = await collect(amqpUrl(), exchange)
    const written = await enqueue(600, (i) => (i % 3 === 0 ? {} : { partitionKey: `key-${i % 40}` }))
    const relays = await Promise.all(
      [0, 1, 2].map((index) => startRelay(exchange, { shard: { of: 3, index }, batchSize: 50 })),
    )
    try {
      await eventually("every row is published", async () => {
        const { rows } = await sql<{ n: string }>`
          SELECT count(*) AS n FROM txbox.outbox WHERE status = 'sent'`.execute(t.db)
        return Number(rows[0]!.n) >= 600
      })
      // The relays count a batch once its mark's answer is back, a moment after the table shows it.
      await eventually(
        "the relays count every row",
        async () =>
          (await Promise.all(relays.map((r) => r.stats()))).reduce((n, s) => n + s.published, 0) >= 600,
        5_000,
      )
      const stats = await Promise.all(relays.map((r) => r.stats()))
      // Every share got some rows, and together exactly the 600.
      expect(stats.map((s) => s.published > 0)).toEqual([true, true, true])
      expect(stats.reduce((sum, s) => sum + s.published, 0)).toBe(600)
      const ids = new Set(written.map((w) => w.id))
      await eventually("the broker delivered every row", async () => seen.counts.size >= 600)
      expect([...seen.counts.keys()].filter((id) => ids.has(id))).toHaveLength(600)
      expect([...seen.counts.values()].every((n) => n === 1)).toBe(true)
      // A sent row keeps its claim's token, whose last 8 hex digits name the relay's store.
      const { rows } = await sql<{ partition_key: string; relays: string }>`
        SELECT partition_key, count(DISTINCT right(lock_token::text, 8)) AS relays FROM txbox.outbox
        WHERE partition_key IS NOT NULL GROUP BY partition_key`.execute(t.db)
      expect(rows).toHaveLength(40)
      expect(rows.filter((r) => Number(r.relays) !== 1)).toEqual([])
    } finally {
      await Promise.all(relays.map((r) => r.dispose()))
      await seen.close()
    }
  }, 120_000)
})
