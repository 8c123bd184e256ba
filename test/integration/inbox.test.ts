// The inbox on real PostgreSQL and RabbitMQ. Effects are counted in a business table (`effects`),
// written by the handlers through the inbox's transaction.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import amqp from "amqplib"
import { Effect, Layer, ManagedRuntime } from "effect"
import type { StandardSchemaV1 } from "effect/StandardSchema"
import { CompiledQuery, Kysely, sql } from "kysely"
import { PostgresJSDialect } from "kysely-postgres-js"
import postgres from "postgres"
import { defineEvent } from "../../src/Contract.ts"
import { uuidv7 } from "../../src/core/uuid.ts"
import * as Inbox from "../../src/Inbox.ts"
import { Database } from "../../src/ports/Database.ts"
import { InboxStore } from "../../src/ports/InboxStore.ts"
import { Transport } from "../../src/ports/Transport.ts"
import { redriveDead } from "../../src/storage/sql/operations.ts"
import * as SqlInboxStore from "../../src/storage/sql/SqlInboxStore.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { encodeBatches } from "../../src/transport/amqp/batch.ts"
import { Note, noteMessage } from "../fixtures/contracts.ts"
import { amqpUrl, uniqueName } from "../support/db.ts"
import { startFixture } from "../support/processes.ts"
import { inboxRow as storedRow } from "../support/storeContract.ts"
import {
  eventually,
  type MigratedDatabase,
  migratedDatabase,
  publishConfirmed,
  storeLayer,
} from "../support/txbox.ts"

let t: MigratedDatabase
beforeAll(async () => {
  t = await migratedDatabase("inbox")
})
afterAll(async () => {
  await t.close()
})

type Mode = "idempotent" | "store-then-process"

const note = noteMessage

const publish = publishConfirmed

/** The same handler as the fixture's, in this process: one `effects` row per applied message. */
const recordingHandler = (consumer: string, failUntilAttempt = 0) =>
  Inbox.handler(Note, ({ payload, envelope, trx }) =>
    envelope.attempt <= failUntilAttempt || payload.note.startsWith("poison")
      ? Effect.fail(new Error(`refusing ${payload.note} on attempt ${envelope.attempt}`))
      : Effect.promise(() =>
          sql`INSERT INTO effects (consumer, message_id, note) VALUES (${consumer}, ${envelope.id}, ${payload.note})`.execute(
            trx,
          ),
        ),
  )

const startInbox = (
  exchange: string,
  // `handlers`: instead of the recording handler.
  config: Omit<Inbox.InboxConfig, "handlers"> & {
    failUntilAttempt?: number
    handlers?: Inbox.InboxConfig["handlers"]
  },
) => {
  const runtime = ManagedRuntime.make(
    Inbox.layer({
      pollInterval: "100 millis",
      retry: { initialDelay: "100 millis", maxDelay: "300 millis", maxAttempts: 3 },
      handlers: [recordingHandler(config.consumer, config.failUntilAttempt)],
      ...config,
    }).pipe(
      Layer.provide(
        Layer.mergeAll(storeLayer(t.url), Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange }))),
      ),
    ),
  )
  return runtime
}

const effectsOf = async (consumer: string) => {
  const rows = await sql<{ message_id: string; n: string }>`
    SELECT message_id, count(*) AS n FROM effects WHERE consumer = ${consumer} GROUP BY message_id`.execute(
    t.db,
  )
  return new Map(rows.rows.map((r) => [r.message_id, Number(r.n)]))
}

const inboxRow = async (consumer: string, messageId: string) =>
  (
    await sql<{ status: string; attempts: number; last_error: string | null; raw: string | null }>`
      SELECT status, attempts, last_error, raw FROM txbox.inbox WHERE consumer = ${consumer} AND message_id = ${messageId}`.execute(
      t.db,
    )
  ).rows[0]

const deadRows = async (consumer: string) =>
  (
    await sql<{ message_id: string; last_error: string; raw: string | null }>`
      SELECT message_id, last_error, raw FROM txbox.inbox WHERE consumer = ${consumer} AND status = 'dead'`.execute(
      t.db,
    )
  ).rows

for (const mode of ["idempotent", "store-then-process"] as const satisfies ReadonlyArray<Mode>) {
  describe(`inbox, ${mode} mode`, () => {
    test("every message delivered 3 times: each handler effect is applied once", async () => {
      const exchange = uniqueName(`inbox-dup-${mode}`)
      const consumer = uniqueName(`dup-${mode}`)
      const runtime = startInbox(exchange, { consumer, mode })
      await runtime.runPromise(Effect.void)
      try {
        const messages = Array.from({ length: 200 }, (_, i) => note(`n${i}`))
        await publish(exchange, [...messages, ...messages, ...messages])
        await eventually("all 200 effects", async () => (await effectsOf(consumer)).size === 200)
        await Bun.sleep(500) // leave time for any late duplicate to (wrongly) apply
        const effects = await effectsOf(consumer)
        expect(effects.size).toBe(200)
        expect([...effects.values()].every((n) => n === 1)).toBe(true)
      } finally {
        await runtime.dispose()
      }
    })

    test("a consumer killed between commit and ack: the redelivery is a no-op", async () => {
      const exchange = uniqueName(`inbox-crash-${mode}`)
      const consumer = uniqueName(`crash-${mode}`)
      // Store-then-process: the killed process's processor may have claimed the stored rows in
      // the moment before its SIGKILL; they come back to the next process when that lease ends.
      const env = {
        DB_URL: t.url,
        AMQP_URL: amqpUrl(),
        EXCHANGE: exchange,
        CONSUMER: consumer,
        MODE: mode,
        LEASE: "2 seconds",
      }
      const first = await startFixture("test/fixtures/consumer.ts", { ...env, CRASH_ON: "boom" })
      const messages = [note("before"), note("boom"), note("after")]
      await publish(exchange, messages)
      expect(await first.exited).toBeNull() // killed by its own SIGKILL after the commit
      expect(first.process.signalCode).toBe("SIGKILL")
      const second = await startFixture("test/fixtures/consumer.ts", env)
      try {
        await eventually("all three effects", async () => (await effectsOf(consumer)).size === 3)
        await Bun.sleep(500)
        const effects = await effectsOf(consumer)
        expect([...effects.values()]).toEqual([1, 1, 1])
        expect(effects.get(messages[1]!.id)).toBe(1)
      } finally {
        await second.kill("SIGTERM")
      }
    }, 20_000)

    test("a handler that fails twice then succeeds: one effect, attempts recorded", async () => {
      const exchange = uniqueName(`inbox-flaky-${mode}`)
      const consumer = uniqueName(`flaky-${mode}`)
      const runtime = startInbox(exchange, { consumer, mode, failUntilAttempt: 2 })
      await runtime.runPromise(Effect.void)
      try {
        const message = note("flaky")
        await publish(exchange, [message])
        await eventually("the effect", async () => (await effectsOf(consumer)).size === 1)
        await Bun.sleep(300)
        expect((await effectsOf(consumer)).get(message.id)).toBe(1)
        const row = await inboxRow(consumer, message.id)
        expect(row?.status).toBe("processed")
        expect(row?.attempts).toBe(3)
      } finally {
        await runtime.dispose()
      }
    })

    test("under load, deliveries share transactions; one that fails its shared transaction is retried alone; every effect applied once", async () => {
      const exchange = uniqueName(`inbox-shared-${mode}`)
      const consumer = uniqueName(`shared-${mode}`)
      await sql`CREATE TABLE IF NOT EXISTS effect_txids (consumer text, message_id text, txid bigint)`.execute(
        t.db,
      )
      // The default configuration, with a handler that records its transaction's id beside the
      // effect, and fails the first try of every fortieth message. Each handler takes 5 ms, so the
      // broker's deliveries find every transaction busy on a fast machine as on a slow one. (With
      // one in ten failing, a failure halving how many share, a slow run shared too little to
      // tell: 315 transactions of 400 on CI. One in forty shares ~60 here.)
      const handler = Inbox.handler(Note, ({ payload, envelope, trx }) =>
        payload.note.startsWith("flaky") && envelope.attempt === 1
          ? Effect.fail(new Error(`refusing ${payload.note} once`))
          : Effect.promise(async () => {
              await sql`SELECT pg_sleep(0.005)`.execute(trx)
              await sql`INSERT INTO effects (consumer, message_id, note) VALUES (${consumer}, ${envelope.id}, ${payload.note})`.execute(
                trx,
              )
              await sql`INSERT INTO effect_txids VALUES (${consumer}, ${envelope.id}, txid_current())`.execute(
                trx,
              )
            }),
      )
      const runtime = ManagedRuntime.make(
        Inbox.layer({ consumer, mode, handlers: [handler], retry: { initialDelay: "100 millis" } }).pipe(
          Layer.provide(
            Layer.mergeAll(storeLayer(t.url), Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange }))),
          ),
        ),
      )
      await runtime.runPromise(Effect.void)
      try {
        const messages = Array.from({ length: 400 }, (_, i) => note(i % 40 === 0 ? `flaky${i}` : `n${i}`))
        await publish(exchange, messages)
        await eventually("all 400 effects", async () => (await effectsOf(consumer)).size === 400)
        await Bun.sleep(300)
        const effects = await effectsOf(consumer)
        expect([...effects.values()].every((n) => n === 1)).toBe(true)
        const { rows } = await sql<{ transactions: string }>`
          SELECT count(DISTINCT txid) AS transactions FROM effect_txids WHERE consumer = ${consumer}`.execute(
          t.db,
        )
        const transactions = Number(rows[0]?.transactions)
        // A transaction per message would be 400.
        expect(transactions).toBeLessThan(300)
        // Attempts: the flaky ones spent one; the others, whose shared transaction a flaky one
        // rolled back, spent none.
        const attempts = await sql<{ flaky: boolean; attempts: number; n: string }>`
          SELECT e.note LIKE 'flaky%' AS flaky, i.attempts, count(*) AS n
          FROM effects e JOIN txbox.inbox i ON i.consumer = e.consumer AND i.message_id = e.message_id
          WHERE e.consumer = ${consumer} GROUP BY 1, 2 ORDER BY 1, 2`.execute(t.db)
        expect(attempts.rows.map((r) => [r.flaky, r.attempts, Number(r.n)])).toEqual([
          [false, 1, 390],
          [true, 2, 10],
        ])
      } finally {
        await runtime.dispose()
      }
    })

    test("a poison message ends dead after maxAttempts with its error; messages behind it keep flowing", async () => {
      const exchange = uniqueName(`inbox-poison-${mode}`)
      const consumer = uniqueName(`poison-${mode}`)
      const runtime = startInbox(exchange, { consumer, mode, prefetch: 1 })
      await runtime.runPromise(Effect.void)
      try {
        const poison = note("poison-pill")
        const behind = Array.from({ length: 20 }, (_, i) => note(`behind${i}`))
        await publish(exchange, [poison, ...behind])
        await eventually("the messages behind it", async () => (await effectsOf(consumer)).size === 20)
        await eventually(
          "the poison message is dead",
          async () => (await inboxRow(consumer, poison.id))?.status === "dead",
        )
        const row = await inboxRow(consumer, poison.id)
        expect(row?.last_error).toContain("refusing poison-pill on attempt 3")
        expect(row?.attempts).toBe(3)
        expect((await effectsOf(consumer)).has(poison.id)).toBe(false)
      } finally {
        await runtime.dispose()
      }
    })

    test("malformed JSON, a schema-invalid payload, an unknown version and a missing id become dead rows; the consumer keeps running", async () => {
      const exchange = uniqueName(`inbox-bad-${mode}`)
      const consumer = uniqueName(`bad-${mode}`)
      const runtime = startInbox(exchange, { consumer, mode })
      await runtime.runPromise(Effect.void)
      const connection = await amqp.connect(amqpUrl())
      const channel = await connection.createConfirmChannel()
      try {
        const send = (body: string, options: amqp.Options.Publish) =>
          new Promise<void>((resolve, reject) =>
            channel.publish(exchange, Note.type, Buffer.from(body), options, (err) =>
              err ? reject(err) : resolve(),
            ),
          )
        const ids = { malformed: uuidv7(), invalid: uuidv7(), version: uuidv7() }
        await send("{not json", {
          messageId: ids.malformed,
          type: Note.type,
          headers: { "txbox-version": 1 },
        })
        await send('{"note":42}', {
          messageId: ids.invalid,
          type: Note.type,
          headers: { "txbox-version": 1 },
        })
        await send('{"note":"v9"}', {
          messageId: ids.version,
          type: Note.type,
          headers: { "txbox-version": 9 },
        })
        await send('{"note":"anonymous"}', { type: Note.type, headers: { "txbox-version": 1 } })
        await eventually("four dead rows", async () => (await deadRows(consumer)).length === 4)
        const dead = new Map((await deadRows(consumer)).map((r) => [r.message_id, r]))
        expect(dead.get(ids.malformed)?.last_error).toContain("malformed JSON")
        expect(dead.get(ids.malformed)?.raw).toBe("{not json")
        expect(dead.get(ids.invalid)?.last_error).toContain("invalid payload")
        expect(dead.get(ids.version)?.last_error).toContain(
          "test.note@9 is newer than this consumer handles (@1)",
        )
        const anonymous = [...dead.values()].find((r) => r.message_id.startsWith("missing-id:"))
        expect(anonymous?.last_error).toContain("no message id")
        expect(anonymous?.raw).toBe('{"note":"anonymous"}')
        // Still consuming.
        const good = note("still alive")
        await publish(exchange, [good])
        await eventually("a good message after the bad ones", async () =>
          (await effectsOf(consumer)).has(good.id),
        )
      } finally {
        await channel.close()
        await connection.close()
        await runtime.dispose()
      }
    })

    test("two consumer processes on one queue apply every effect exactly once", async () => {
      const exchange = uniqueName(`inbox-two-${mode}`)
      const consumer = uniqueName(`two-${mode}`)
      const env = { DB_URL: t.url, AMQP_URL: amqpUrl(), EXCHANGE: exchange, CONSUMER: consumer, MODE: mode }
      const a = await startFixture("test/fixtures/consumer.ts", env)
      const b = await startFixture("test/fixtures/consumer.ts", env)
      try {
        const messages = Array.from({ length: 500 }, (_, i) => note(`m${i}`))
        await publish(exchange, [...messages, ...messages])
        await eventually("all 500 effects", async () => (await effectsOf(consumer)).size === 500)
        await Bun.sleep(500)
        expect([...(await effectsOf(consumer)).values()].every((n) => n === 1)).toBe(true)
      } finally {
        await Promise.all([a.kill("SIGTERM"), b.kill("SIGTERM")])
      }
    })

    // With each driver: the probe before COMMIT must see the aborted transaction on both.
    for (const driver of ["pg", "postgres.js"] as const) {
      test(`${driver}: a handler that catches a failed statement is retried, then dead with a clear reason, never acked as done`, async () => {
        const exchange = uniqueName(`inbox-swallow-${mode}`)
        const consumer = uniqueName(`swallow-${mode}`)
        // The common habit: try { await trx.insertInto(...) } catch {} — the statement failed, the
        // transaction is aborted, and COMMIT would silently roll back.
        const swallowing = Inbox.handler(Note, ({ payload, envelope, trx }) =>
          Effect.promise(async () => {
            await sql`INSERT INTO effects (consumer, message_id, note) VALUES (${consumer}, ${envelope.id}, ${payload.note})`.execute(
              trx,
            )
            try {
              await sql`INSERT INTO no_such_table VALUES (1)`.execute(trx)
            } catch {}
          }),
        )
        const runtime = ManagedRuntime.make(
          Inbox.layer({
            consumer,
            mode,
            pollInterval: "100 millis",
            retry: { initialDelay: "100 millis", maxDelay: "300 millis", maxAttempts: 3 },
            handlers: [swallowing],
          }).pipe(
            Layer.provide(
              Layer.mergeAll(
                storeLayer(t.url, { driver }),
                Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange })),
              ),
            ),
          ),
        )
        await runtime.runPromise(Effect.void)
        try {
          const message = note("swallowed")
          await publish(exchange, [message])
          await eventually(
            "the message is dead",
            async () => (await inboxRow(consumer, message.id))?.status === "dead",
          )
          const row = await inboxRow(consumer, message.id)
          expect(row?.attempts).toBe(3)
          expect(row?.last_error).toContain("its error was caught")
          expect(row?.last_error).toContain("(after 3 attempts)")
          expect((await effectsOf(consumer)).size).toBe(0) // nothing half-applied
        } finally {
          await runtime.dispose()
        }
      })
    }

    test("a body and a header with NUL bytes, and a payload with a \\u0000 escape, become dead rows with the bytes kept", async () => {
      const exchange = uniqueName(`inbox-nul-${mode}`)
      const consumer = uniqueName(`nul-${mode}`)
      const runtime = startInbox(exchange, { consumer, mode })
      await runtime.runPromise(Effect.void)
      const connection = await amqp.connect(amqpUrl())
      const channel = await connection.createConfirmChannel()
      try {
        const send = (body: Buffer, options: amqp.Options.Publish) =>
          new Promise<void>((resolve, reject) =>
            channel.publish(exchange, Note.type, body, options, (err) => (err ? reject(err) : resolve())),
          )
        const ids = { binary: uuidv7(), header: uuidv7(), escape: uuidv7(), fine: uuidv7() }
        const binary = Buffer.from([0x00, 0xff, 0xfe, 0x41, 0x00])
        await send(binary, { messageId: ids.binary, type: Note.type, headers: { "txbox-version": 1 } })
        await send(Buffer.from('{"note":"nul in a header"}'), {
          messageId: ids.header,
          type: Note.type,
          headers: { "txbox-version": 1, "x-odd": "a\u0000b" },
        })
        await send(Buffer.from('{"note":"a\\u0000b"}'), {
          messageId: ids.escape,
          type: Note.type,
          headers: { "txbox-version": 1 },
        })
        await send(Buffer.from('{"note":"fine"}'), {
          messageId: ids.fine,
          type: Note.type,
          headers: { "txbox-version": 1 },
        })
        await eventually("the fine message behind them is applied", async () =>
          (await effectsOf(consumer)).has(ids.fine),
        )
        await eventually(
          "the binary body is dead",
          async () => (await inboxRow(consumer, ids.binary))?.status === "dead",
        )
        expect((await inboxRow(consumer, ids.binary))?.raw).toBe(`base64:${binary.toString("base64")}`)
        // A NUL in a header is stored as base64; the message itself is fine and is applied.
        await eventually("the header message is applied", async () =>
          (await effectsOf(consumer)).has(ids.header),
        )
        const headers = (
          await sql<{ headers: Record<string, string> }>`
            SELECT headers FROM txbox.inbox WHERE consumer = ${consumer} AND message_id = ${ids.header}`.execute(
            t.db,
          )
        ).rows[0]?.headers
        // Stored before it ran (store-then-process), its headers are kept; an idempotent consumer's
        // processed row is the dedupe record alone.
        if (mode === "idempotent") expect(headers).toEqual({})
        else expect(headers?.["x-odd"]).toBe(`base64:${Buffer.from("a\u0000b").toString("base64")}`)
        // jsonb refuses \u0000: stored (store-then-process), it is dead at once. An idempotent
        // consumer stores no payload: the handler gets it and its own text column refuses the NUL,
        // so it is dead after its attempts. Either way the text is kept in raw.
        await eventually(
          "the escape payload is dead",
          async () => (await inboxRow(consumer, ids.escape))?.status === "dead",
          10_000,
        )
        const escaped = await inboxRow(consumer, ids.escape)
        expect(escaped?.raw).toBe('{"note":"a\\u0000b"}')
        expect(escaped?.last_error).toContain(mode === "idempotent" ? "0x00 (after 3 attempts)" : "(data)")
        expect((await effectsOf(consumer)).has(ids.escape)).toBe(false)
      } finally {
        await channel.close().catch(() => {})
        await connection.close().catch(() => {})
        await runtime.dispose()
      }
    })

    /** One message to an inbox of `handlers` (maxAttempts 3): it ends dead after 3 attempts; its row. */
    const deadAfterThree = async (name: string, handlers: Inbox.InboxConfig["handlers"]) => {
      const exchange = uniqueName(`inbox-${name}-${mode}`)
      const consumer = uniqueName(`${name}-${mode}`)
      const runtime = ManagedRuntime.make(
        Inbox.layer({
          consumer,
          mode,
          pollInterval: "100 millis",
          retry: { initialDelay: "100 millis", maxDelay: "300 millis", maxAttempts: 3 },
          handlers,
        }).pipe(
          Layer.provide(
            Layer.mergeAll(storeLayer(t.url), Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange }))),
          ),
        ),
      )
      await runtime.runPromise(Effect.void)
      try {
        const message = note("fine payload")
        await publish(exchange, [message])
        await eventually(
          "dead after 3 attempts",
          async () => (await inboxRow(consumer, message.id))?.status === "dead",
        )
        return await inboxRow(consumer, message.id)
      } finally {
        await runtime.dispose()
      }
    }

    test("a handler whose error text holds a NUL and half a character: retried, then dead, the text stored", async () => {
      const row = await deadAfterThree("errtext", [
        Inbox.handler(Note, () => Effect.fail(new Error("bad\u0000byte, half \ud800 a character"))),
      ])
      expect(row?.attempts).toBe(3)
      expect(row?.last_error).toContain("bad\\u0000byte, half \ufffd a character")
    })

    test("a handler stuck on a row lock another session holds: cancelled on the server at handlerTimeout, attempts spent, dead after maxAttempts; no connection kept", async () => {
      const exchange = uniqueName(`inbox-lock-${mode}`)
      const consumer = uniqueName(`lock-${mode}`)
      const lockedId = crypto.randomUUID()
      await sql`INSERT INTO orders (id, total) VALUES (${lockedId}, 1)`.execute(t.db)
      // Another session holds the row for the whole test.
      const holder = postgres(t.url, { max: 1, onnotice: () => {} })
      let release = () => {}
      const held = new Promise<void>((resolve) => {
        release = resolve
      })
      let locked = () => {}
      const lockTaken = new Promise<void>((resolve) => {
        locked = resolve
      })
      const holding = holder.begin(async (tx) => {
        await tx`SELECT id FROM orders WHERE id = ${lockedId} FOR UPDATE`
        locked()
        await held
      })
      await lockTaken
      const handler = Inbox.handler(Note, ({ payload, envelope, trx }) =>
        Effect.promise(() =>
          payload.note === "blocked"
            ? sql`UPDATE orders SET total = total + 1 WHERE id = ${lockedId}`.execute(trx)
            : sql`INSERT INTO effects (consumer, message_id, note) VALUES (${consumer}, ${envelope.id}, ${payload.note})`.execute(
                trx,
              ),
        ),
      )
      const runtime = ManagedRuntime.make(
        Inbox.layer({
          consumer,
          mode,
          pollInterval: "100 millis",
          handlerTimeout: "1 second",
          retry: { initialDelay: "100 millis", maxDelay: "300 millis", maxAttempts: 2 },
          handlers: [handler],
        }).pipe(
          Layer.provide(
            Layer.mergeAll(
              storeLayer(t.url, { poolSize: 3 }),
              Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange })),
            ),
          ),
        ),
      )
      await runtime.runPromise(Effect.void)
      try {
        const blocked = note("blocked")
        const others = Array.from({ length: 5 }, (_, i) => note(`free ${i}`))
        await publish(exchange, [blocked, ...others])
        await eventually(
          "the blocked message dead",
          async () => (await inboxRow(consumer, blocked.id))?.status === "dead",
          20_000,
        )
        expect((await inboxRow(consumer, blocked.id))?.attempts).toBe(2)
        await eventually("the others applied", async () => (await effectsOf(consumer)).size === 5)
        // Nothing of the inbox's is left waiting on the lock or holding a transaction open.
        const stuck = await sql<{ n: string }>`
          SELECT count(*) AS n FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = 'txbox/pg'
            AND (wait_event_type = 'Lock' OR state LIKE 'idle in transaction%')`.execute(t.db)
        expect(Number(stuck.rows[0]?.n)).toBe(0)
      } finally {
        release()
        await holding.catch(() => undefined)
        await holder.end()
        await runtime.dispose()
      }
    })

    test("a validator that fails (an async schema whose promise rejects: a registry away): retried, then dead", async () => {
      // The same type and version as Note, with a validator that cannot answer.
      const RegistryAway = defineEvent({
        type: Note.type,
        version: Note.version,
        schema: {
          "~standard": {
            version: 1,
            vendor: "test",
            validate: () => Promise.reject(new Error("schema registry unreachable")),
          },
        } as StandardSchemaV1<unknown, { note: string }>,
      })
      const row = await deadAfterThree("validator", [Inbox.handler(RegistryAway, () => Effect.void)])
      expect(row?.attempts).toBe(3)
      expect(row?.last_error).toContain("validator failed: schema registry unreachable")
    })
  })
}

// An idle processor whose NOTIFY is heard polls ten times less often than `pollInterval` (Inbox.ts,
// HEARD_POLL_FACTOR: 10 s here). Neither a retry due by time (the probe for the next due row) nor a
// redriven row (redrive notifies) may wait for that poll.
test("store-then-process, idle and heard: a retry runs when it is due and a redrive at once, not at the next 10 s poll", async () => {
  const exchange = uniqueName("inbox-heard")
  const consumer = uniqueName("heard")
  const accepted = new Set<string>()
  const firstFailure = new Map<string, number>()
  const handler = Inbox.handler(Note, ({ payload, envelope, trx }) => {
    if (!accepted.has(payload.note)) {
      if (!firstFailure.has(payload.note)) firstFailure.set(payload.note, Date.now())
      return Effect.fail(new Error(`not yet: ${payload.note}`))
    }
    return Effect.promise(() =>
      sql`INSERT INTO effects (consumer, message_id, note) VALUES (${consumer}, ${envelope.id}, ${payload.note})`.execute(
        trx,
      ),
    )
  })
  const runtime = startInbox(exchange, {
    consumer,
    mode: "store-then-process",
    pollInterval: "1 second",
    retry: { initialDelay: "4 seconds", maxDelay: "4 seconds", maxAttempts: 2 },
    handlers: [handler],
  })
  await runtime.runPromise(Effect.void)
  try {
    // A retry 4 s after the first attempt: the processor polls once (1 s after a cycle that
    // claimed a row), finds nothing due, and waits for the row rather than for 10 s.
    const retried = note("heard-retry")
    await publish(exchange, [retried])
    await eventually("the first attempt", async () => firstFailure.has("heard-retry"), 15_000)
    accepted.add("heard-retry")
    await eventually("the retry", async () => (await effectsOf(consumer)).has(retried.id), 20_000)
    const retryAfter = Date.now() - firstFailure.get("heard-retry")!
    expect(retryAfter).toBeGreaterThan(2_500)
    expect(retryAfter).toBeLessThan(8_000)

    // Dead after its two attempts; then the processor is idle, nothing pending: a long wait.
    const redriven = note("heard-redrive")
    await publish(exchange, [redriven])
    await eventually("dead", async () => (await inboxRow(consumer, redriven.id))?.status === "dead", 20_000)
    await Bun.sleep(1_500)
    accepted.add("heard-redrive")
    const ops = ManagedRuntime.make(storeLayer(t.url))
    const count = await ops
      .runPromise(
        Effect.gen(function* () {
          return yield* redriveDead(yield* Database, { table: "inbox", consumer }, 10)
        }),
      )
      .finally(() => ops.dispose())
    expect(count).toBe(1)
    const redrivenAt = Date.now()
    await eventually("the redriven row", async () => (await effectsOf(consumer)).has(redriven.id), 20_000)
    expect(Date.now() - redrivenAt).toBeLessThan(4_000)
    expect((await effectsOf(consumer)).get(redriven.id)).toBe(1)
  } finally {
    await runtime.dispose()
  }
}, 90_000)

test("the same message to two different consumers runs each consumer's handler once", async () => {
  const exchange = uniqueName("inbox-fanout")
  const billing = uniqueName("billing")
  const shipping = uniqueName("shipping")
  const a = startInbox(exchange, { consumer: billing })
  const b = startInbox(exchange, { consumer: shipping, mode: "store-then-process" })
  await Promise.all([a.runPromise(Effect.void), b.runPromise(Effect.void)])
  try {
    const message = note("fan-out")
    await publish(exchange, [message, message])
    await eventually(
      "both consumers applied it",
      async () => (await effectsOf(billing)).has(message.id) && (await effectsOf(shipping)).has(message.id),
    )
    await Bun.sleep(300)
    expect((await effectsOf(billing)).get(message.id)).toBe(1)
    expect((await effectsOf(shipping)).get(message.id)).toBe(1)
  } finally {
    await Promise.all([a.dispose(), b.dispose()])
  }
})

test("an inbox started while the broker is away subscribes by itself once it returns", async () => {
  const { startTcpProxy } = await import("../support/tcpProxy.ts")
  const target = new URL(amqpUrl())
  const proxy = await startTcpProxy(target.hostname, Number(target.port))
  proxy.block()
  const exchange = uniqueName("inbox-late")
  const consumer = uniqueName("late")
  const runtime = ManagedRuntime.make(
    Inbox.layer({ consumer, handlers: [recordingHandler(consumer)] }).pipe(
      Layer.provide(
        Layer.mergeAll(
          storeLayer(t.url),
          Layer.orDie(
            AmqpTransport.layer({ url: proxy.urlFor(amqpUrl()), exchange, connectTimeout: "1 second" }),
          ),
        ),
      ),
    ),
  )
  try {
    await runtime.runPromise(Effect.void) // starts although the broker is unreachable
    proxy.unblock()
    const message = note("late")
    // Until the background subscription declares the queue, a publish comes back unroutable.
    await eventually("the queue exists", async () => {
      const transport = ManagedRuntime.make(Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange })))
      try {
        const [outcome] = await transport.runPromise(
          Effect.gen(function* () {
            return yield* (yield* Transport).publish([message])
          }),
        )
        return outcome?._tag === "Confirmed"
      } finally {
        await transport.dispose()
      }
    })
    await eventually("the effect", async () => (await effectsOf(consumer)).has(message.id))
  } finally {
    await runtime.dispose()
    await proxy.close()
  }
})

for (const mode of ["idempotent", "store-then-process"] as const) {
  test(`${mode}: a dead message redriven after the handler is fixed is applied once`, async () => {
    const exchange = uniqueName(`inbox-redrive-${mode}`)
    const consumer = uniqueName(`redrive-${mode}`)
    let broken = true
    const runtime = ManagedRuntime.make(
      Inbox.layer({
        consumer,
        mode,
        pollInterval: "100 millis",
        retry: { initialDelay: "50 millis", maxDelay: "100 millis", maxAttempts: 2 },
        handlers: [
          Inbox.handler(Note, ({ payload, envelope, trx }) =>
            broken
              ? Effect.fail(new Error("bug in handler"))
              : Effect.promise(() =>
                  sql`INSERT INTO effects (consumer, message_id, note) VALUES (${consumer}, ${envelope.id}, ${payload.note})`.execute(
                    trx,
                  ),
                ),
          ),
        ],
      }).pipe(
        Layer.provide(
          Layer.mergeAll(storeLayer(t.url), Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange }))),
        ),
      ),
    )
    await runtime.runPromise(Effect.void)
    try {
      const message = note("redrive me")
      await publish(exchange, [message])
      await eventually(
        "the message is dead",
        async () => (await inboxRow(consumer, message.id))?.status === "dead",
      )
      broken = false
      // What `txbox dead redrive` does.
      await sql`
        UPDATE txbox.inbox SET status = 'pending', attempts = 0, visible_at = now(), lock_token = NULL
        WHERE consumer = ${consumer} AND message_id = ${message.id}`.execute(t.db)
      await eventually(
        "the redriven message is processed",
        async () => (await inboxRow(consumer, message.id))?.status === "processed",
      )
      await Bun.sleep(300)
      expect((await effectsOf(consumer)).get(message.id)).toBe(1)
    } finally {
      await runtime.dispose()
    }
  })
}

describe("inbox wake-ups", () => {
  test("a pending row wakes its own consumer's processors, not every consumer's (one channel per consumer)", async () => {
    const runtime = ManagedRuntime.make(storeLayer(t.url))
    const row = (consumer: string) => storedRow(uuidv7(), consumer)
    const [mine, other] = [uniqueName("wake-mine"), uniqueName("wake-other")]
    let wakes = 0
    try {
      await runtime.runPromise(
        Effect.scoped(
          Effect.gen(function* () {
            const store = yield* InboxStore
            yield* store.wakeups(mine, () => wakes++)
            yield* store.insertPending([row(other), row(other)])
            yield* Effect.sleep("500 millis")
            expect(wakes).toBe(0)
            yield* store.insertPending([row(mine)])
            yield* Effect.promise(() =>
              eventually("the consumer's own row wakes it", async () => wakes === 1, 5_000),
            )
          }),
        ),
      )
    } finally {
      await runtime.dispose()
    }
  })
})

describe("inbox leases", () => {
  test("a claim's heartbeat (extend) and the hand-back of some of its rows read them on the primary key, not the consumer's pending rows", async () => {
    const consumer = uniqueName("lease-plan")
    await sql`INSERT INTO txbox.inbox (message_id, consumer, type, version, payload, headers, status)
      SELECT gen_random_uuid()::text, ${consumer}, 'note', 1, '{}', '{}', 'pending' FROM generate_series(1, 20000)`.execute(
      t.db,
    )
    await sql`ANALYZE txbox.inbox`.execute(t.db)
    try {
      const q = SqlInboxStore.statements(t.db.withSchema("txbox"))
      const keys = JSON.stringify(
        (
          await sql<{
            k: string
          }>`SELECT message_id AS k FROM txbox.inbox WHERE consumer = ${consumer} LIMIT 10`.execute(t.db)
        ).rows.map((r) => r.k),
      )
      const token = crypto.randomUUID()
      for (const compiled of [
        q.extend({ consumer, token, leaseMs: 1000, keys }),
        q.releaseSome({ consumer, token, keys }),
      ]) {
        const plan = (
          await t.db.executeQuery(CompiledQuery.raw(`EXPLAIN ${compiled.sql}`, [...compiled.parameters]))
        ).rows
          .map((row) => (row as Record<string, string>)["QUERY PLAN"])
          .join("\n")
        // A partition's primary key (inbox_default_pkey, inbox_p20261128_pkey: migration 0015).
        expect(plan).toMatch(/Index Scan on inbox_\w*pkey/)
      }
    } finally {
      await sql`DELETE FROM txbox.inbox WHERE consumer = ${consumer}`.execute(t.db)
    }
  })
})

describe("the processor's claim after one that found nothing", () => {
  test("asks whether anything is due (one probe) instead of running the claim; a row due is claimed, and the claim after that goes straight", async () => {
    const consumer = uniqueName("probe")
    const ran: string[] = []
    const client = postgres(t.url, { max: 2, onnotice: () => {} })
    // biome-ignore lint/suspicious/noExplicitAny: txbox's tables only
    const db = new Kysely<any>({
      dialect: new PostgresJSDialect({ postgres: client }),
      log: (event) => {
        if (event.level === "query") ran.push(event.query.sql)
      },
    })
    const store = await Effect.runPromise(
      SqlInboxStore.make.pipe(
        // The store on a Kysely of the test's own (its log is what this test reads); no wake-ups here.
        Effect.provideService(Database, { db, schema: "txbox", listen: () => Effect.void }),
      ),
    )
    const claim = () => Effect.runPromise(store.claim(consumer, 10, 30_000))
    const claims = () => ran.filter((text) => /with recursive/i.test(text)).length
    const probes = () => ran.filter((text) => /^select exists/i.test(text)).length
    try {
      expect((await claim()).rows).toEqual([])
      expect([claims(), probes()]).toEqual([1, 0])
      // Nothing came since: the probe alone.
      expect((await claim()).rows).toEqual([])
      expect((await claim()).rows).toEqual([])
      expect([claims(), probes()]).toEqual([1, 2])
      const key = uuidv7()
      await sql`INSERT INTO txbox.inbox (message_id, consumer, type, version, payload, headers, status)
        VALUES (${key}, ${consumer}, 'note', 1, '{}', '{}', 'pending')`.execute(t.db)
      // The probe finds it due; the claim takes it.
      expect((await claim()).rows.map((row) => row.key)).toEqual([key])
      expect([claims(), probes()]).toEqual([2, 3])
      // A claim that found rows is followed by a claim, not a probe.
      expect((await claim()).rows).toEqual([])
      expect([claims(), probes()]).toEqual([3, 3])
    } finally {
      await sql`DELETE FROM txbox.inbox WHERE consumer = ${consumer}`.execute(t.db)
      await db.destroy()
    }
  })
})

describe("a batch message (the relay's default wire format)", () => {
  test("each event gets its own outcome in one go: applied, retried alone, dead, duplicate; the message is acked once all are settled", async () => {
    const exchange = uniqueName("inbox-batch")
    const consumer = uniqueName("batched")
    // "b" fails its first attempt: it alone comes back through the delay queue.
    const runtime = startInbox(exchange, {
      consumer,
      handlers: [
        Inbox.handler(Note, ({ payload, envelope, trx }) =>
          payload.note === "b" && envelope.attempt === 1
            ? Effect.fail(new Error("b fails once"))
            : Effect.promise(() =>
                sql`INSERT INTO effects (consumer, message_id, note) VALUES (${consumer}, ${envelope.id}, ${payload.note})`.execute(
                  trx,
                ),
              ),
        ),
      ],
    })
    await runtime.runPromise(Effect.void)
    const a = note("a")
    const b = note("b")
    const invalid = note("x", { body: JSON.stringify({ note: 42 }) })
    const { items } = encodeBatches([a, b, invalid, a], "test", { messages: 100, bytes: 1 << 20 })
    const item = items[0]!
    if (item._tag !== "Encoded") throw new Error("expected one encoded batch")
    // An event with no id, as a foreign producer might write one.
    const events = JSON.parse(item.message.content.toString("utf8")) as unknown[]
    events.push({ specversion: "1.0", source: "elsewhere", type: Note.type, data: { note: "anonymous" } })
    const connection = await amqp.connect(amqpUrl())
    try {
      const channel = await connection.createConfirmChannel()
      channel.publish(exchange, Note.type, Buffer.from(JSON.stringify(events)), item.message.options)
      await channel.waitForConfirms()
      await eventually("a and b applied", async () => (await effectsOf(consumer)).size === 2, 15_000)
      await eventually("two dead rows", async () => (await deadRows(consumer)).length === 2, 15_000)
      expect(await effectsOf(consumer)).toEqual(
        new Map([
          [a.id, 1],
          [b.id, 1],
        ]),
      )
      expect((await inboxRow(consumer, b.id))?.status).toBe("processed")
      const dead = new Map((await deadRows(consumer)).map((r) => [r.message_id, r.last_error]))
      expect(dead.get(invalid.id)).toStartWith("invalid payload")
      expect([...dead.values()]).toContain("message has no message id")
      // Settled: nothing left on the consumer queue or in flight.
      await eventually(
        "the batch acked",
        async () => {
          const queue = await channel.checkQueue(`txbox.${consumer}`)
          return queue.messageCount === 0
        },
        10_000,
      )
      await channel.close()
    } finally {
      await connection.close()
      await runtime.dispose()
    }
  })
})
