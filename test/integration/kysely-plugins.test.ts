// The app's Kysely with plugins (here CamelCasePlugin, which renames result columns): txbox's own
// statements must return what they always do, while a handler's `trx` keeps the app's plugins.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect, Layer, ManagedRuntime } from "effect"
import { CamelCasePlugin, type Generated, type Kysely, sql } from "kysely"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import * as Inbox from "../../src/Inbox.ts"
import * as Outbox from "../../src/Outbox.ts"
import { OutboxStore } from "../../src/ports/OutboxStore.ts"
import * as Relay from "../../src/Relay.ts"
import * as KyselyStore from "../../src/storage/drivers/kysely/KyselyStore.ts"
import * as MemoryTransport from "../../src/transport/memory/MemoryTransport.ts"
import { eventually, type MigratedDatabase, migratedDatabase } from "../support/txbox.ts"

const Ping = defineEvent({ type: "test.ping", version: 1, schema: v.object({ n: v.number() }) })

interface AppTables {
  appEffects: { id: Generated<number>; consumerName: string; messageId: string; partitionSeq: number | null }
}

let database: MigratedDatabase
/** The app's Kysely: snake_case tables, camelCase in code. */
let app: Kysely<AppTables>

beforeAll(async () => {
  database = await migratedDatabase("kysely_plugins")
  await sql`CREATE TABLE app_effects (id bigserial PRIMARY KEY, consumer_name text NOT NULL, message_id text NOT NULL, partition_seq int)`.execute(
    database.db,
  )
  app = database.db.withPlugin(new CamelCasePlugin()) as Kysely<AppTables>
})
afterAll(async () => {
  await database.close()
})

const run = <A, E>(effect: Effect.Effect<A, E>) => Effect.runPromise(effect)

/** Two keyed and one unkeyed event in the app's transaction, one keyed and one unkeyed on the pool. */
const enqueueAll = async () => {
  await app.transaction().execute(async (trx) => {
    await run(Outbox.enqueue(trx, Ping, { n: 1 }, { partitionKey: "order-1" }))
    await run(Outbox.enqueue(trx, Ping, { n: 2 }))
    await run(Outbox.enqueue(trx, Ping, { n: 3 }, { partitionKey: "order-1" }))
  })
  await run(Outbox.enqueue(app, Ping, { n: 4 }, { partitionKey: "order-1" }))
  await run(Outbox.enqueue(app, Ping, { n: 5 }))
}

/** A handler writing through its `trx` in the app's camelCase names: it only works with the plugin. */
const recording = (consumer: string) =>
  Inbox.handler(Ping, ({ envelope, trx }) =>
    Effect.promise(async () => {
      const appTrx = trx as typeof app
      await appTrx
        .insertInto("appEffects")
        .values({
          consumerName: consumer,
          messageId: envelope.id,
          partitionSeq: envelope.position?.seq ?? null,
        })
        .execute()
      const [row] = await appTrx
        .selectFrom("appEffects")
        .select(["messageId"])
        .where("messageId", "=", envelope.id)
        .execute()
      if (row?.messageId !== envelope.id) throw new Error(`the handler's trx lost the app's plugins: ${row}`)
    }),
  )

const effectsOf = (consumer: string) =>
  app
    .selectFrom("appEffects")
    .select(["partitionSeq"])
    .where("consumerName", "=", consumer)
    .orderBy("id")
    .execute()

describe("KyselyStore over an app Kysely with CamelCasePlugin", () => {
  test("keyed and unkeyed enqueues succeed, and the relay claims them with every field", async () => {
    await enqueueAll()
    const claimed = await run(
      Effect.gen(function* () {
        return yield* (yield* OutboxStore).claim(10, 30_000)
      }).pipe(Effect.provide(Layer.orDie(KyselyStore.layer({ db: app })))),
    )
    const rows = claimed.rows.map((r) => ({ partitionKey: r.partitionKey, seq: r.position?.seq }))
    expect(rows).toEqual([
      { partitionKey: "order-1", seq: 1 },
      { partitionKey: null, seq: undefined },
      { partitionKey: "order-1", seq: 2 },
      { partitionKey: "order-1", seq: 3 },
      { partitionKey: null, seq: undefined },
    ])
    await sql`DELETE FROM txbox.outbox`.execute(database.db)
    await sql`DELETE FROM txbox.partition_counters`.execute(database.db)
  })

  test("the relay publishes them, and inbox handlers get a trx with the app's plugins", async () => {
    const broker = MemoryTransport.makeBroker()
    broker.declare("idem", [Ping.type])
    broker.declare("stored", [Ping.type])
    const infra = Layer.mergeAll(
      Layer.orDie(KyselyStore.layer({ db: app })),
      MemoryTransport.layerFrom(broker),
    )
    const runtime = ManagedRuntime.make(
      Layer.mergeAll(
        Relay.layer({ pollInterval: "100 millis" }),
        Inbox.layer({ consumer: "idem", handlers: [recording("idem")], pollInterval: "100 millis" }),
        Inbox.layer({
          consumer: "stored",
          mode: "store-then-process",
          handlers: [recording("stored")],
          pollInterval: "100 millis",
        }),
      ).pipe(Layer.provide(infra)),
    )
    try {
      await runtime.runPromise(Effect.void)
      await enqueueAll()
      for (const consumer of ["idem", "stored"]) {
        await eventually(`${consumer} handled all five`, async () => (await effectsOf(consumer)).length === 5)
        const seqs = (await effectsOf(consumer)).map((r) => r.partitionSeq).filter((s) => s !== null)
        expect(seqs).toEqual([1, 2, 3])
      }
      expect(broker.stats().published).toBe(5)
    } finally {
      await runtime.dispose()
    }
  })
})
