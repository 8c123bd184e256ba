// The relay's WAL source (issue #27): a PostgreSQL of its own with wal_level = logical, real
// RabbitMQ; outcomes read from the outbox table, the slot's catalog row and the broker.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect, Exit, Layer, ManagedRuntime, Scope } from "effect"
import { Kysely, sql } from "kysely"
import { PostgresJSDialect } from "kysely-postgres-js"
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
import { amqpUrl, databaseUrl, uniqueName } from "../support/db.ts"
import { type LocalPostgres, startLocalPostgres } from "../support/postgres.ts"
import { eventually, outboxCounts } from "../support/txbox.ts"

const OrderPlaced = defineEvent({
  type: "orders.order-placed",
  version: 1,
  schema: v.object({ orderId: v.string(), n: v.number() }),
})

let server: LocalPostgres
// biome-ignore lint/suspicious/noExplicitAny: tests read txbox's tables freely
let db: Kysely<any>
let client: postgres.Sql
beforeAll(async () => {
  server = await startLocalPostgres({
    name: "wal",
    settings: ["wal_level = logical", "max_replication_slots = 20"],
  })
  client = postgres(server.url, { max: 4, onnotice: () => {} })
  db = new Kysely({ dialect: new PostgresJSDialect({ postgres: client }) })
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

describe("WalLog.layer's checks", () => {
  test("a server without wal_level = logical is a ConfigError that says what to set", async () => {
    const exit = await Effect.runPromiseExit(Effect.scoped(WalLog.make({ url: databaseUrl() })))
    expect(Exit.isFailure(exit)).toBe(true)
    const error = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
    const failure = error !== undefined && "error" in error ? error.error : undefined
    expect(failure).toBeInstanceOf(ConfigError)
    expect(String((failure as ConfigError).message)).toContain("wal_level = logical")
  })
})
