// A plain async/await service on txbox/promise: no Effect in sight, real PostgreSQL and RabbitMQ.
import { afterAll, beforeAll, expect, test } from "bun:test"
import { sql } from "kysely"
import { ValidationError } from "../../src/Errors.ts"
import { createTxbox, on } from "../../src/promise/index.ts"
import * as PgStore from "../../src/storage/drivers/pg/PgStore.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { Note } from "../fixtures/contracts.ts"
import { amqpUrl, uniqueName } from "../support/db.ts"
import { eventually, type MigratedDatabase, migratedDatabase } from "../support/txbox.ts"

let t: MigratedDatabase
beforeAll(async () => {
  t = await migratedDatabase("promise")
})
afterAll(async () => {
  await t.close()
})

test("a plain async/await service produces and consumes through txbox/promise", async () => {
  const consumer = uniqueName("plain")
  const txbox = createTxbox({
    database: PgStore.layer({ url: t.url }),
    transport: AmqpTransport.layer({ url: amqpUrl(), exchange: uniqueName("promise") }),
  })
  const relay = txbox.relay({ pollInterval: "100 millis" })
  const inbox = txbox.inbox({
    consumer,
    handlers: [
      on(Note, async ({ payload, envelope, trx }) => {
        await sql`INSERT INTO effects (consumer, message_id, note) VALUES (${consumer}, ${envelope.id}, ${payload.note})`.execute(
          trx,
        )
      }),
    ],
  })
  try {
    await inbox.start()
    await relay.start()
    const written = await t.db
      .transaction()
      .execute((trx) => txbox.enqueue(trx, Note, { note: "hello from async" }))
    // A rolled-back transaction leaves nothing behind.
    await t.db
      .transaction()
      .execute(async (trx) => {
        await txbox.enqueue(trx, Note, { note: "never" })
        throw new Error("rollback")
      })
      .catch(() => {})
    // txbox.transaction: the row goes with the COMMIT; the body's own error is what it rejects with.
    const withCommit = await txbox.transaction(t.db, (trx) =>
      txbox.enqueue(trx, Note, { note: "with the commit" }),
    )
    const outOfStock = new Error("out of stock")
    const thrown = await txbox
      .transaction(t.db, async (trx) => {
        await txbox.enqueue(trx, Note, { note: "never either" })
        throw outOfStock
      })
      .catch((e) => e)
    expect(thrown).toBe(outOfStock)
    // An invalid payload rejects with the typed error itself.
    const rejected = await txbox.enqueue(t.db, Note, { note: 42 } as never).catch((e) => e)
    expect(rejected).toBeInstanceOf(ValidationError)

    await eventually("the handler applied both events", async () => {
      const rows = await sql<{ note: string }>`SELECT note FROM effects WHERE consumer = ${consumer}`.execute(
        t.db,
      )
      return rows.rows.length === 2
    })
    const rows = await sql<{ message_id: string; note: string }>`
      SELECT message_id, note FROM effects WHERE consumer = ${consumer} ORDER BY note`.execute(t.db)
    expect(rows.rows).toEqual([
      { message_id: written.id, note: "hello from async" },
      { message_id: withCommit.id, note: "with the commit" },
    ])
    // Counted once marked, which may come with the relay's next look, after the handler's commit.
    await eventually("the relay counts it published", async () => (await relay.stats()).published >= 2)
    expect((await inbox.health()).ready).toBe(true)
  } finally {
    await relay.stop()
    await inbox.stop()
    await txbox.close()
  }
  await expect(relay.stats()).rejects.toThrow("not started")
})
