// Through PgBouncer 1.18 in `pool_mode = transaction` with a pool smaller than the clients: what
// most production PostgreSQL sits behind. Producers, the relay and both inbox modes run through it,
// with each driver; counts come from the tables. LISTEN through a transaction pooler hears NOTIFY
// by chance: the store's self-test says so, and a `listenUrl` (a direct connection) fixes it.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect, Layer, Logger, ManagedRuntime } from "effect"
import { Kysely, PostgresDialect, sql } from "kysely"
import pg from "pg"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import * as Inbox from "../../src/Inbox.ts"
import * as Outbox from "../../src/Outbox.ts"
import * as Relay from "../../src/Relay.ts"
import { SELF_TEST_WITHIN_MS } from "../../src/storage/drivers/shared/listenSelfTest.ts"
import { migrate } from "../../src/storage/sql/migrator.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { runTxbox } from "../support/cli.ts"
import { amqpUrl, uniqueName } from "../support/db.ts"
import { type LocalPgBouncer, startPgBouncer } from "../support/pgbouncer.ts"
import {
  type Driver,
  eventually,
  type MigratedDatabase,
  migratedDatabase,
  storeOf,
} from "../support/txbox.ts"

const Note = defineEvent({ type: "pgb.note", version: 1, schema: v.object({ n: v.number() }) })

let t: MigratedDatabase
let bouncer: LocalPgBouncer
beforeAll(async () => {
  t = await migratedDatabase("pgbouncer")
  bouncer = await startPgBouncer(t.url, { poolSize: 3 })
})
afterAll(async () => {
  await bouncer?.stop()
  await t?.close()
})

const logged: string[] = []
const recordLogs = Logger.layer([Logger.make(({ message }) => logged.push(String(message)))])
const deafWarnings = () => logged.filter((line) => line.includes("heard no NOTIFY"))

/** A store through PgBouncer, LISTEN through `listenUrl` when given. */
const store = (driver: Driver, listenUrl: string | undefined) =>
  Layer.orDie(
    storeOf(driver).layer({
      url: bouncer.url,
      poolSize: 4,
      ...(listenUrl === undefined ? {} : { listenUrl }),
    }),
  )

const recordingHandler = (consumer: string) =>
  Inbox.handler(Note, ({ envelope, trx }) =>
    Effect.promise(() =>
      sql`INSERT INTO effects (consumer, message_id) VALUES (${consumer}, ${envelope.id})`.execute(trx),
    ),
  )

/** Four producer loops through PgBouncer, `count` messages in all, each in a transaction of its own. */
const produce = async (count: number) => {
  const db = new Kysely<unknown>({
    dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: bouncer.url, max: 4 }) }),
  })
  const pool = new pg.Pool({ connectionString: bouncer.url, max: 4 })
  try {
    let next = 0
    const loop = async () => {
      while (next < count) {
        const n = next++
        // A third in Outbox.transaction on a Kysely (the row with the COMMIT, one text), a third on a
        // node-postgres pool (the BEGIN also in the write of the body's first statement, a
        // parameterized one: Parse/Bind/Execute of BEGIN ahead of its messages), a third in a
        // transaction of their own.
        if (n % 3 === 0)
          await Effect.runPromise(Outbox.transaction(db, (trx) => Outbox.enqueue(trx, Note, { n })))
        else if (n % 3 === 1)
          await Effect.runPromise(
            Outbox.transaction(pool, (client) =>
              Effect.andThen(
                Effect.tryPromise(() => client.query("SELECT $1::int AS n", [n])),
                Outbox.enqueue(client, Note, { n }),
              ),
            ),
          )
        else await db.transaction().execute((trx) => Effect.runPromise(Outbox.enqueue(trx, Note, { n })))
      }
    }
    await Promise.all([loop(), loop(), loop(), loop()])
  } finally {
    await db.destroy()
    await pool.end()
  }
}

const effectsOf = async (consumer: string) => {
  const rows = await sql<{ message_id: string; n: string }>`
    SELECT message_id, count(*) AS n FROM effects WHERE consumer = ${consumer} GROUP BY message_id`.execute(
    t.db,
  )
  return rows.rows.map((row) => Number(row.n))
}

/** A relay and one consumer per inbox mode, each its own runtime (its own pool) through PgBouncer. */
const runPipeline = async (
  driver: Driver,
  listenUrl: string | undefined,
  count: number,
  holdMs: number,
  /** What every loop's `health.listening` says after `holdMs`. */
  listening: boolean,
) => {
  const exchange = uniqueName(`pgb-${driver}`)
  // Each loop's health, read once everything is delivered.
  const healths: Array<Effect.Effect<{ readonly listening: boolean }>> = []
  const keep = (handle: { readonly health: Effect.Effect<{ readonly listening: boolean }> }) =>
    Effect.sync(() => {
      healths.push(handle.health)
    })
  const consumers = { idempotent: uniqueName("pgb-idem"), "store-then-process": uniqueName("pgb-stp") }
  const transport = Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange }))
  const runtimes = [
    ...Object.entries(consumers).map(([mode, consumer]) =>
      ManagedRuntime.make(
        Layer.effectDiscard(
          Effect.tap(
            Inbox.make({
              consumer,
              mode: mode as "idempotent" | "store-then-process",
              handlers: [recordingHandler(consumer)],
              pollInterval: "1 second",
            }),
            keep,
          ),
        ).pipe(Layer.provide(Layer.mergeAll(store(driver, listenUrl), transport)), Layer.provide(recordLogs)),
      ),
    ),
    ManagedRuntime.make(
      Layer.effectDiscard(Effect.tap(Relay.make({ pollInterval: "1 second" }), keep)).pipe(
        Layer.provide(Layer.mergeAll(store(driver, listenUrl), transport)),
        Layer.provide(recordLogs),
      ),
    ),
  ]
  for (const runtime of runtimes) await runtime.runPromise(Effect.void)
  try {
    await produce(count)
    for (const consumer of Object.values(consumers)) {
      await eventually(
        `${count} effects of ${consumer}`,
        async () => (await effectsOf(consumer)).length === count,
        60_000,
      )
    }
    await Bun.sleep(holdMs) // room for a late duplicate to (wrongly) apply, and for the LISTEN self-tests
    for (const consumer of Object.values(consumers)) {
      const effects = await effectsOf(consumer)
      expect(effects.length).toBe(count)
      expect(effects.every((n) => n === 1)).toBe(true)
      const dead = await sql<{ n: string }>`
        SELECT count(*) AS n FROM txbox.inbox WHERE consumer = ${consumer} AND status = 'dead'`.execute(t.db)
      expect(Number(dead.rows[0]?.n)).toBe(0)
    }
    const outbox = await sql<{ status: string; n: string }>`
      SELECT status, count(*) AS n FROM txbox.outbox GROUP BY status`.execute(t.db)
    expect(outbox.rows.filter((row) => row.status !== "sent")).toEqual([])
    // The relay's and both consumers' health say whether wake-ups reach them.
    expect(healths).toHaveLength(3)
    for (const health of healths) expect((await Effect.runPromise(health)).listening).toBe(listening)
  } finally {
    for (const runtime of runtimes) await runtime.dispose()
    await sql`DELETE FROM txbox.outbox`.execute(t.db)
  }
}

describe("through PgBouncer in transaction mode (pool of 3, 16 clients)", () => {
  test("migrations run through it (their lock is transaction-scoped)", async () => {
    const db = new Kysely<unknown>({
      dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: bouncer.url, max: 2 }) }),
    })
    try {
      await Effect.runPromise(migrate(db, { schema: "txbox_via_pgbouncer" }))
      const tables = await sql<{ n: string }>`
        SELECT count(*) AS n FROM information_schema.tables WHERE table_schema = 'txbox_via_pgbouncer'`.execute(
        db,
      )
      expect(Number(tables.rows[0]?.n)).toBeGreaterThanOrEqual(5)
    } finally {
      await db.destroy()
    }
  })

  for (const driver of ["pg", "postgres.js"] as const satisfies ReadonlyArray<Driver>) {
    test(`${driver}: producers, relay and both inbox modes, LISTEN on a direct listenUrl: every message applied once, none dead`, async () => {
      logged.length = 0
      await runPipeline(driver, t.url, 200, SELF_TEST_WITHIN_MS + 1_000, true)
      expect(deafWarnings()).toEqual([])
      // No statement failed on its way (a loop logs each failure it backs off from).
      expect(logged.filter((line) => /prepared statement|failed/i.test(line))).toEqual([])
    }, 120_000)
  }

  test("pg without listenUrl: LISTEN through the pooler is found deaf, said once per channel and in health; polling still delivers everything", async () => {
    logged.length = 0
    await runPipeline("pg", undefined, 100, SELF_TEST_WITHIN_MS + 1_000, false)
    const warnings = deafWarnings()
    // A LISTEN through the pooler is idle, linked to no server connection, so it hears nothing:
    // said once per LISTEN (the relay's and each consumer's), not again on every reconnect.
    expect(warnings.length).toBeGreaterThanOrEqual(1)
    expect(warnings.length).toBeLessThanOrEqual(3)
    expect(warnings[0]).toContain("listenUrl")
  }, 120_000)

  for (const [driver, application] of [
    ["pg", "txbox/pg-listen"],
    ["postgres.js", "txbox/postgres.js-listen"],
  ] as const) {
    test(`${driver}: one store under a relay and two consumers holds one LISTEN connection, and every loop is woken through it`, async () => {
      const exchange = uniqueName("pgb-one-listen")
      const consumers = [uniqueName("pgb-one-a"), uniqueName("pgb-one-b")]
      const stores = store(driver, t.url)
      const runtime = ManagedRuntime.make(
        Layer.mergeAll(
          // A poll too slow to pass this test: only NOTIFY brings the messages in time.
          Relay.layer({ pollInterval: "1 minute" }),
          ...consumers.map((consumer) =>
            Inbox.layer({ consumer, handlers: [recordingHandler(consumer)], pollInterval: "1 minute" }),
          ),
        ).pipe(
          Layer.provide(
            Layer.mergeAll(stores, Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange }))),
          ),
        ),
      )
      await runtime.runPromise(Effect.void)
      try {
        const listeners = await sql<{ n: number }>`
        SELECT count(*)::int AS n FROM pg_stat_activity
        WHERE application_name = ${application} AND datname = current_database()`.execute(t.db)
        expect(listeners.rows[0]?.n).toBe(1)
        await Bun.sleep(200)
        await produce(20)
        for (const consumer of consumers) {
          await eventually(
            `20 effects of ${consumer}`,
            async () => (await effectsOf(consumer)).length === 20,
            20_000,
          )
        }
      } finally {
        await runtime.dispose()
        await sql`DELETE FROM txbox.outbox`.execute(t.db)
      }
    }, 60_000)
  }

  test("postgres.js without listenUrl: its watchdog finds LISTEN through the pooler deaf and says so once per LISTEN and in health; polling still delivers everything", async () => {
    logged.length = 0
    // The watchdog pings every 5 s and waits 5 s: deaf is said after two unheard pings.
    await runPipeline("postgres.js", undefined, 100, 25_000, false)
    const warnings = deafWarnings()
    expect(warnings.length).toBeGreaterThanOrEqual(1)
    expect(warnings.length).toBeLessThanOrEqual(3)
    expect(warnings[0]).toContain("listenUrl")
  }, 120_000)
  // The operator's commands through the pooler too (not `txbox wal`: the WAL relay reads on a direct
  // URL). Counts come from rows written here and from the tables after.
  for (const driver of ["pg", "postgres.js"] as const satisfies ReadonlyArray<Driver>) {
    test(`${driver}: the CLI through it: migrate, status and dead redrive`, async () => {
      const schema = `cli_pgb_${driver === "pg" ? "pg" : "pgjs"}`
      const through = ["--url", bouncer.url, "--schema", schema, "--driver", driver]
      // No DATABASE_URL from the environment: the URL given is the pooler's.
      const txbox = (...args: string[]) => runTxbox([...args, ...through], { unset: ["DATABASE_URL"] })
      const migrated = await txbox("migrate")
      expect(migrated.stderr).toBe("")
      expect(migrated.code).toBe(0)
      const ins = (status: string, n: number) =>
        sql`INSERT INTO ${sql.id(schema, "outbox")} (id, type, version, payload, status, visible_at, published_at)
            SELECT gen_random_uuid(), 'pgb.cli', 1, '{}', ${status}, now() - interval '1 minute',
                   CASE WHEN ${status} = 'sent' THEN now() END
            FROM generate_series(1, ${n})`.execute(t.db)
      await ins("pending", 3)
      await ins("sent", 2)
      await ins("dead", 4)

      const status = await txbox("status", "--json")
      expect(status.stderr).toBe("")
      expect(status.code).toBe(0)
      const { lag_seconds: _, ...total } = JSON.parse(status.stdout).outbox.total
      expect(total).toEqual({ pending: 3, due: 3, in_flight: 0, dead: 4, sent: 2 })

      const redrive = await txbox("dead", "redrive", "--json")
      expect(redrive.stderr).toBe("")
      expect(JSON.parse(redrive.stdout)).toMatchObject({ table: "outbox", matched: 4, redriven: 4 })
      const counts = await sql<{ status: string; n: number }>`
        SELECT status, count(*)::int AS n FROM ${sql.id(schema, "outbox")} GROUP BY status ORDER BY status`.execute(
        t.db,
      )
      expect(counts.rows).toEqual([
        { status: "pending", n: 7 },
        { status: "sent", n: 2 },
      ])
    }, 60_000)
  }
})
