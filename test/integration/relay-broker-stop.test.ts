// A broker that stops gracefully (`rabbitmqctl stop_app`) may have confirmed messages that a queue
// stopping meanwhile never took (rabbitmq-server#1877; the soak lost one batch at one of three
// consumers this way, through the relay's confirm or that of the consumer's retry copies). The
// relay publishes again what it marked sent in the STOP_RESEND_MS before the broker closed the
// connection for its shutdown. Real PostgreSQL and a RabbitMQ of the test's own, stopped and
// started; outcomes read from the outbox table and a durable queue.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import amqp from "amqplib"
import { Effect, Exit, Layer, ManagedRuntime, Scope } from "effect"
import { sql } from "kysely"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import * as Outbox from "../../src/Outbox.ts"
import * as Relay from "../../src/Relay.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { eventsOf } from "../support/amqp.ts"
import { uniqueName } from "../support/db.ts"
import { type LocalRabbit, startLocalRabbit } from "../support/rabbitmq.ts"
import { eventually, type MigratedDatabase, migratedDatabase, storeLayer } from "../support/txbox.ts"

const Noted = defineEvent({ type: "broker-stop.noted", version: 1, schema: v.object({ n: v.number() }) })

let t: MigratedDatabase
let rabbit: LocalRabbit
beforeAll(async () => {
  ;[t, rabbit] = await Promise.all([migratedDatabase("relay_broker_stop"), startLocalRabbit()])
}, 120_000)
afterAll(async () => {
  await Promise.all([t.close(), rabbit.stop()])
})

/** Every event id in `queue` now, with how many copies (read with basic.get, acked). */
const drain = async (queue: string): Promise<Map<string, number>> => {
  const connection = await amqp.connect(rabbit.url)
  try {
    const channel = await connection.createChannel()
    const counts = new Map<string, number>()
    for (let msg = await channel.get(queue); msg !== false; msg = await channel.get(queue)) {
      // A got message as a consumed one (eventsOf reads its content and properties).
      for (const event of eventsOf({ ...msg, fields: { ...msg.fields, consumerTag: "" } })) {
        const id = String(event.properties.messageId)
        counts.set(id, (counts.get(id) ?? 0) + 1)
      }
      channel.ack(msg)
    }
    return counts
  } finally {
    await connection.close().catch(() => {})
  }
}

describe("relay, broker stopped", () => {
  test("what the broker confirmed shortly before it stopped is published again once it is back, once however many relays", async () => {
    const exchange = uniqueName("broker-stop")
    const queue = `${exchange}.all`
    const setup = await amqp.connect(rabbit.url)
    const channel = await setup.createChannel()
    await channel.assertExchange(exchange, "topic", { durable: true })
    await channel.assertQueue(queue, { durable: true, arguments: { "x-queue-type": "quorum" } })
    await channel.bindQueue(queue, exchange, "#")
    await setup.close()

    // Two relay processes' worth: each answers the stop, and still each message goes out once more.
    const relays = await Promise.all(
      [0, 1].map(async () => {
        const runtime = ManagedRuntime.make(
          Layer.mergeAll(
            storeLayer(t.url),
            Layer.orDie(AmqpTransport.layer({ url: rabbit.url, exchange, publishTimeout: "3 seconds" })),
          ),
        )
        const scope = await runtime.runPromise(Scope.make())
        await runtime.runPromise(
          Relay.make({ outageRetry: { initialDelay: "50 millis", maxDelay: "500 millis" } }).pipe(
            Scope.provide(scope),
          ),
        )
        return { runtime, scope }
      }),
    )
    try {
      const written = await t.db.transaction().execute((trx) =>
        Effect.runPromise(
          Outbox.enqueueMany(
            trx,
            Array.from({ length: 20 }, (_, n) => ({ contract: Noted, payload: { n } })),
          ),
        ),
      )
      const ids = written.map((m) => m.id).sort()
      const sent = async () =>
        Number(
          (
            await sql<{ n: string }>`SELECT count(*) AS n FROM txbox.outbox
              WHERE status = 'sent' AND id = ANY(${ids}::uuid[])`.execute(t.db)
          ).rows[0]!.n,
        )
      await eventually("the 20 messages sent", async () => (await sent()) === 20)
      const first = await drain(queue)
      expect([...first.keys()].sort()).toEqual(ids)

      const stoppedAt = new Date()
      await rabbit.ctl(["stop_app"], 120_000)
      await rabbit.ctl(["start_app"], 120_000)

      // Back: the relay set them pending and published them again (their marks after the stop).
      await eventually(
        "the 20 messages sent again after the stop",
        async () =>
          Number(
            (
              await sql<{ n: string }>`SELECT count(*) AS n FROM txbox.outbox
                WHERE status = 'sent' AND published_at > ${stoppedAt} AND id = ANY(${ids}::uuid[])`.execute(
                t.db,
              )
            ).rows[0]!.n,
          ) === 20,
        60_000,
      )
      // A moment for a second resend, were there one.
      await new Promise((resolve) => setTimeout(resolve, 1_000))
      const again = await drain(queue)
      expect([...again.keys()].sort()).toEqual(ids)
      expect([...again.values()].every((copies) => copies === 1)).toBe(true)
    } finally {
      for (const { runtime, scope } of relays) {
        await runtime.runPromise(Scope.close(scope, Exit.void))
        await runtime.dispose()
      }
    }
  }, 240_000)
})
