// What RabbitMQ itself gives up on ends as an inbox dead row, never dropped: consumer queues carry a
// delivery limit and a dead-letter target, a queue declared without them (an earlier version) is
// still consumed, and a retry whose delay queue is unusable still counts its attempt.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import amqp from "amqplib"
import { Effect, Layer, ManagedRuntime } from "effect"
import { sql } from "kysely"
import * as Inbox from "../../src/Inbox.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { deadQueueName, delayQueueName, queueName } from "../../src/transport/amqp/subscriber.ts"
import { Note, noteMessage } from "../fixtures/contracts.ts"
import { amqpUrl, uniqueName } from "../support/db.ts"
import {
  eventually,
  type MigratedDatabase,
  migratedDatabase,
  publishConfirmed,
  storeLayer,
} from "../support/txbox.ts"

let t: MigratedDatabase
let broker: amqp.ChannelModel
beforeAll(async () => {
  t = await migratedDatabase("dead_letter")
  broker = await amqp.connect(amqpUrl())
})
afterAll(async () => {
  await broker.close()
  await t.close()
})

const note = noteMessage

const publish = publishConfirmed

const startInbox = (
  exchange: string,
  consumer: string,
  options: { deliveryLimit?: number; fail?: boolean } = {},
) =>
  ManagedRuntime.make(
    Inbox.layer({
      consumer,
      pollInterval: "100 millis",
      retry: { initialDelay: "100 millis", maxDelay: "300 millis", maxAttempts: 3 },
      handlers: [
        Inbox.handler(Note, ({ payload, envelope, trx }) =>
          options.fail === true
            ? Effect.fail(new Error(`refusing ${payload.note} on attempt ${envelope.attempt}`))
            : Effect.promise(() =>
                sql`INSERT INTO effects (consumer, message_id, note) VALUES (${consumer}, ${envelope.id}, ${payload.note})`.execute(
                  trx,
                ),
              ),
        ),
      ],
    }).pipe(
      Layer.provide(
        Layer.mergeAll(
          storeLayer(t.url),
          Layer.orDie(
            AmqpTransport.layer({
              url: amqpUrl(),
              exchange,
              ...(options.deliveryLimit === undefined ? {} : { deliveryLimit: options.deliveryLimit }),
            }),
          ),
        ),
      ),
    ),
  )

const inboxRow = async (consumer: string, messageId: string) =>
  (
    await sql<{ status: string; attempts: number; last_error: string | null }>`
      SELECT status, attempts, last_error FROM txbox.inbox
      WHERE consumer = ${consumer} AND message_id = ${messageId}`.execute(t.db)
  ).rows[0]

const effectsOf = async (consumer: string) =>
  Number(
    (await sql<{ n: string }>`SELECT count(*) AS n FROM effects WHERE consumer = ${consumer}`.execute(t.db))
      .rows[0]!.n,
  )

describe("consumer queues and what the broker gives up on", () => {
  test("a message returned to its queue past the delivery limit becomes an inbox dead row with the broker's reason", async () => {
    const exchange = uniqueName("dl-limit")
    const consumer = uniqueName("dl-limit")
    // Declare the topology with txbox (limit 2), then stop consuming.
    const first = startInbox(exchange, consumer, { deliveryLimit: 2 })
    await first.runPromise(Effect.void)
    await first.dispose()

    const message = note("keeps coming back")
    await publish(exchange, [message])
    // A consumer that dies holding it, again and again: each return counts a delivery.
    const channel = await broker.createChannel()
    let returned = 0
    try {
      for (let i = 0; i < 10; i++) {
        const got = await channel.get(queueName(consumer), { noAck: false })
        if (got === false) break
        channel.nack(got, false, true)
        returned++
        await Bun.sleep(50)
      }
      expect(returned).toBe(3) // delivered 3 times: the third return is past the limit of 2
      expect((await channel.checkQueue(queueName(consumer))).messageCount).toBe(0)
      expect((await channel.checkQueue(deadQueueName(consumer))).messageCount).toBe(1)
    } finally {
      await channel.close()
    }

    const second = startInbox(exchange, consumer, { deliveryLimit: 2 })
    try {
      await second.runPromise(Effect.void)
      await eventually("the dead row", async () => (await inboxRow(consumer, message.id))?.status === "dead")
      expect((await inboxRow(consumer, message.id))?.last_error).toContain(
        `dead-lettered by the broker: delivery_limit in ${queueName(consumer)}`,
      )
      expect(await effectsOf(consumer)).toBe(0)
    } finally {
      await second.dispose()
    }
  })

  test("a queue declared without a dead-letter target (an earlier version) is still consumed", async () => {
    const exchange = uniqueName("dl-legacy")
    const consumer = uniqueName("dl-legacy")
    const channel = await broker.createChannel()
    await channel.assertQueue(queueName(consumer), { durable: true, arguments: { "x-queue-type": "quorum" } })
    await channel.close()

    const runtime = startInbox(exchange, consumer)
    try {
      await runtime.runPromise(Effect.void)
      const message = note("still served")
      await publish(exchange, [message])
      await eventually(
        "processed",
        async () => (await inboxRow(consumer, message.id))?.status === "processed",
      )
      expect(await effectsOf(consumer)).toBe(1)
    } finally {
      await runtime.dispose()
    }
  })

  test("a retry whose delay queue cannot be declared still counts its attempt, so the message ends dead", async () => {
    const exchange = uniqueName("dl-fallback")
    const consumer = uniqueName("dl-fallback")
    // The first retry's delay queue exists with other arguments: txbox's declaration is refused (406).
    const channel = await broker.createChannel()
    await channel.assertQueue(delayQueueName(consumer, 1), { durable: true })
    await channel.close()

    const runtime = startInbox(exchange, consumer, { fail: true })
    try {
      await runtime.runPromise(Effect.void)
      const message = note("always fails")
      await publish(exchange, [message])
      await eventually(
        "dead after 3 attempts",
        async () => (await inboxRow(consumer, message.id))?.status === "dead",
      )
      const row = await inboxRow(consumer, message.id)
      expect(row?.attempts).toBe(3)
      expect(row?.last_error).toContain("refusing always fails on attempt 3")
    } finally {
      await runtime.dispose()
    }
  })
})
