// The PostgreSQL store through a database outage, with each driver: connections stay bounded and
// LISTEN comes back by itself. Each test runs its own PostgreSQL, which it stops and starts.
import { describe, expect, test } from "bun:test"
import { Effect, Layer, ManagedRuntime } from "effect"
import { Kysely, sql } from "kysely"
import { PostgresJSDialect } from "kysely-postgres-js"
import postgres from "postgres"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import * as Outbox from "../../src/Outbox.ts"
import * as Relay from "../../src/Relay.ts"
import { migrate } from "../../src/storage/migrator.ts"
import * as PostgresStore from "../../src/storage/PostgresStore.ts"
import * as MemoryTransport from "../../src/transport/memory/MemoryTransport.ts"
import { startLocalPostgres } from "../support/postgres.ts"
import { eventually } from "../support/txbox.ts"

const Ping = defineEvent({ type: "outage.ping", version: 1, schema: v.object({ n: v.number() }) })

describe("the PostgreSQL store through a 12 s database outage", () => {
  for (const driver of ["postgres.js", "pg"] as const) {
    test(`with ${driver}: connections stay within the pool plus one LISTEN, and LISTEN wakes the relay again`, async () => {
      const server = await startLocalPostgres({ name: `outage-${driver.replace(".", "")}` })
      // biome-ignore lint/suspicious/noExplicitAny: test database
      const admin = new Kysely<any>({
        dialect: new PostgresJSDialect({ postgres: postgres(server.url, { max: 1, onnotice: () => {} }) }),
      })
      const broker = MemoryTransport.makeBroker()
      broker.declare("c", [Ping.type])
      // A poll interval no test waits for: after the outage, only a NOTIFY can wake the relay.
      const runtime = ManagedRuntime.make(
        Relay.layer({ pollInterval: "1 hour" }).pipe(
          Layer.provide(
            Layer.mergeAll(
              Layer.orDie(PostgresStore.layer({ url: server.url, driver, poolSize: 2 })),
              MemoryTransport.layerFrom(broker),
            ),
          ),
        ),
      )
      const txboxConnections = async () =>
        Number(
          (
            await sql<{ n: string }>`
              SELECT count(*) AS n FROM pg_stat_activity WHERE application_name LIKE 'txbox/%'`.execute(admin)
          ).rows[0]!.n,
        )
      const enqueue = (n: number) =>
        admin.transaction().execute((trx) => Effect.runPromise(Outbox.enqueue(trx, Ping, { n })))
      try {
        await Effect.runPromise(migrate(admin))
        await runtime.runPromise(Effect.void)
        await enqueue(1)
        await eventually("published before the outage", async () => broker.stats().published === 1, 10_000)

        await server.outage(12_000)
        // The relay's loop backs off (at most 10 s) and the LISTEN connection retries (at most 5 s).
        await Bun.sleep(12_000)
        expect(await txboxConnections()).toBeLessThanOrEqual(2 + 1)

        await enqueue(2)
        // pg re-listens within 5 s; postgres.js on its own schedule (its reconnect backs off).
        await eventually(
          "a NOTIFY wakes the relay after the outage",
          async () => broker.stats().published === 2,
          20_000,
        )
        // Still bounded once the pool is busy again.
        expect(await txboxConnections()).toBeLessThanOrEqual(2 + 1)
      } finally {
        await runtime.dispose()
        await admin.destroy()
        await server.stop()
      }
    }, 120_000)
  }
})
