// The inbox's "external" mode (issue #28, seed 004's dedupe for effects outside the database) on real
// PostgreSQL and RabbitMQ. The handlers write their effect rows through a connection of their own,
// outside any inbox transaction, as an HTTP call or an e-mail would be made; outcomes are counted
// from those rows and the inbox table.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect, Exit, Layer, ManagedRuntime } from "effect"
import { sql } from "kysely"
import * as Inbox from "../../src/Inbox.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { Note, noteMessage } from "../fixtures/contracts.ts"
import { amqpUrl, uniqueName } from "../support/db.ts"
import { startFixture } from "../support/processes.ts"
import {
  eventually,
  type MigratedDatabase,
  migratedDatabase,
  publishConfirmed,
  storeLayer,
} from "../support/txbox.ts"

let t: MigratedDatabase
beforeAll(async () => {
  t = await migratedDatabase("inbox_external")
})
afterAll(async () => {
  await t.close()
})

const note = noteMessage

/** An effect row written outside the inbox's transaction (t.db is a pool of its own). */
const effect = (consumer: string, id: string, text: string) =>
  Effect.promise(() =>
    sql`INSERT INTO effects (consumer, message_id, note) VALUES (${consumer}, ${id}, ${text})`.execute(t.db),
  )

const effectsOf = async (consumer: string) => {
  const rows = await sql<{ message_id: string; n: string }>`
    SELECT message_id, count(*) AS n FROM effects WHERE consumer = ${consumer} GROUP BY message_id`.execute(
    t.db,
  )
  return new Map(rows.rows.map((r) => [r.message_id, Number(r.n)]))
}

const inboxStatuses = async (consumer: string) => {
  const rows = await sql<{ status: string; n: string }>`
    SELECT status, count(*) AS n FROM txbox.inbox WHERE consumer = ${consumer} GROUP BY status`.execute(t.db)
  return Object.fromEntries(rows.rows.map((r) => [r.status, Number(r.n)]))
}

const startInbox = (exchange: string, config: Inbox.InboxConfig) =>
  ManagedRuntime.make(
    Inbox.layer({
      pollInterval: "100 millis",
      retry: { initialDelay: "100 millis", maxDelay: "300 millis", maxAttempts: 2 },
      ...config,
    }).pipe(
      Layer.provide(
        Layer.mergeAll(storeLayer(t.url), Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange }))),
      ),
    ),
  )

describe('inbox, "external" mode', () => {
  test("each message delivered 3 times, the copies arriving while its handler runs: one effect each", async () => {
    const exchange = uniqueName("external-dup")
    const consumer = uniqueName("external-dup")
    let running = 0
    let most = 0
    const slow = Inbox.handler(Note, ({ payload, envelope }) =>
      Effect.gen(function* () {
        most = Math.max(most, ++running)
        yield* Effect.sleep("150 millis")
        yield* effect(consumer, envelope.id, payload.note)
        running--
      }),
    )
    const runtime = startInbox(exchange, { consumer, mode: "external", handlers: [slow] })
    await runtime.runPromise(Effect.void)
    try {
      const messages = Array.from({ length: 20 }, (_, i) => note(`n${i}`))
      await publishConfirmed(exchange, messages)
      // The copies come while the first ones' handlers sleep.
      await Bun.sleep(100)
      await publishConfirmed(exchange, [...messages, ...messages])
      await eventually("all 20 processed", async () => (await inboxStatuses(consumer)).processed === 20)
      await Bun.sleep(500) // time for a late copy to (wrongly) run again
      const effects = await effectsOf(consumer)
      expect(effects.size).toBe(20)
      expect([...effects.values()].every((n) => n === 1)).toBe(true)
      expect(await inboxStatuses(consumer)).toEqual({ processed: 20 })
      expect(most).toBeGreaterThan(1) // the processor ran several handlers at once
    } finally {
      await runtime.dispose()
    }
  }, 60_000)

  test("the handler gets no transaction: using one fails its message with an error that says so", async () => {
    const exchange = uniqueName("external-trx")
    const consumer = uniqueName("external-trx")
    const usesTrx = Inbox.handler(Note, ({ trx }) =>
      Effect.promise(() => sql`SELECT 1`.execute(trx)).pipe(Effect.asVoid),
    )
    const runtime = startInbox(exchange, { consumer, mode: "external", handlers: [usesTrx] })
    await runtime.runPromise(Effect.void)
    try {
      await publishConfirmed(exchange, [note("x")])
      await eventually("the message is dead", async () => (await inboxStatuses(consumer)).dead === 1)
      const { rows } = await sql<{ last_error: string; attempts: number }>`
        SELECT last_error, attempts FROM txbox.inbox WHERE consumer = ${consumer}`.execute(t.db)
      expect(rows[0]!.last_error).toContain('inbox mode "external": the handler gets no transaction')
      expect(rows[0]!.attempts).toBe(2)
    } finally {
      await runtime.dispose()
    }
  }, 60_000)

  test("a consumer killed between the effect and the mark: after its lease the row runs once more; the others once", async () => {
    const exchange = uniqueName("external-crash")
    const consumer = uniqueName("external-crash")
    const env = {
      DB_URL: t.url,
      AMQP_URL: amqpUrl(),
      EXCHANGE: exchange,
      CONSUMER: consumer,
      MODE: "external",
      LEASE: "2 seconds",
      // One row at a time: the one before the crash is marked before it runs (with several at once,
      // a row whose effect was done and whose mark was not yet is run again too, as it may be).
      PROCESSOR_CONCURRENCY: "1",
    }
    const first = await startFixture("test/fixtures/consumer.ts", { ...env, CRASH_ON: "boom" })
    const messages = [note("before"), note("boom"), note("after")]
    await publishConfirmed(exchange, messages)
    expect(await first.exited).toBeNull() // killed by its own SIGKILL right after the effect
    expect(first.process.signalCode).toBe("SIGKILL")
    // The "consuming" record: the row is stored, pending, held by the dead process's lease.
    const { rows } = await sql<{ status: string; held: boolean }>`
      SELECT status, lock_token IS NOT NULL AND visible_at > now() AS held FROM txbox.inbox
      WHERE consumer = ${consumer} AND message_id = ${messages[1]!.id}`.execute(t.db)
    expect(rows).toEqual([{ status: "pending", held: true }])
    expect((await effectsOf(consumer)).get(messages[1]!.id)).toBe(1)
    const second = await startFixture("test/fixtures/consumer.ts", env)
    try {
      await eventually("all three processed", async () => (await inboxStatuses(consumer)).processed === 3)
      await Bun.sleep(500)
      const effects = await effectsOf(consumer)
      // The crashed one's effect ran again (its lease lapsed with the process): at least once, and
      // here exactly twice; the others once.
      expect(messages.map((m) => effects.get(m.id))).toEqual([1, 2, 1])
      expect(await inboxStatuses(consumer)).toEqual({ processed: 3 })
    } finally {
      await second.kill("SIGTERM")
    }
  }, 60_000)

  test("a mode that does not exist is a ConfigError naming the three", async () => {
    const exit = await Effect.runPromiseExit(
      Inbox.resolveConfig({
        consumer: "c",
        handlers: [Inbox.handler(Note, () => Effect.void)],
        mode: "exactly-once" as never,
      }),
    )
    expect(Exit.isFailure(exit)).toBe(true)
    expect(String(Exit.isFailure(exit) ? exit.cause : "")).toContain(
      'inbox mode must be one of "idempotent", "store-then-process", "external"',
    )
  })
})
