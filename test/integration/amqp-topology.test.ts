// Topology ahead of time, on real PostgreSQL and RabbitMQ: a producer deployed before its consumer.
// Without it the relay's first messages come back unroutable and end dead after maxAttempts; with
// `declareTopology` (or `txbox topology declare`) they wait in the consumer's queue until its inbox
// starts. Declaring is idempotent, and an inbox subscribing afterwards meets no 406.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import amqp from "amqplib"
import { Effect, Layer, Logger, ManagedRuntime } from "effect"
import { sql } from "kysely"
import * as Inbox from "../../src/Inbox.ts"
import * as Outbox from "../../src/Outbox.ts"
import * as Relay from "../../src/Relay.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { resolveConfig } from "../../src/transport/amqp/config.ts"
import {
  consumerQueueArguments,
  deadQueueName,
  declareTopology,
  queueName,
} from "../../src/transport/amqp/topology.ts"
import { Note } from "../fixtures/contracts.ts"
import { type CliRun, runTxbox } from "../support/cli.ts"
import { amqpUrl, uniqueName } from "../support/db.ts"
import { eventually, type MigratedDatabase, migratedDatabase, storeLayer } from "../support/txbox.ts"

let t: MigratedDatabase
let broker: amqp.ChannelModel
beforeAll(async () => {
  t = await migratedDatabase("topology")
  broker = await amqp.connect(amqpUrl())
  broker.on("error", () => {})
})
afterAll(async () => {
  await broker.close().catch(() => {})
  await t.close()
})

/** A throwaway channel (a refused declaration closes it) for one check against the broker. */
const withChannel = async <A>(use: (channel: amqp.Channel) => Promise<A>): Promise<A> => {
  const channel = await broker.createChannel()
  channel.on("error", () => {})
  try {
    return await use(channel)
  } finally {
    await channel.close().catch(() => {})
  }
}

/** Messages ready in `queue` (passive: fails if the queue does not exist). */
const ready = (queue: string) => withChannel(async (c) => (await c.checkQueue(queue)).messageCount)

/** Whether declaring `queue` with `args` is refused (406: it exists with other arguments). */
const refused = (queue: string, args: Record<string, unknown>) =>
  withChannel(async (c) => {
    try {
      await c.assertQueue(queue, { durable: true, arguments: args })
      return false
    } catch (error) {
      return (error as { code?: number }).code === 406
    }
  })

const deleteQueues = (consumer: string) =>
  withChannel(async (c) => {
    await c.deleteQueue(queueName(consumer))
    await c.deleteQueue(deadQueueName(consumer))
  })

/** The relay alone, as in a producer deployed before any consumer. */
const startRelay = (exchange: string) =>
  ManagedRuntime.make(
    Layer.effectDiscard(
      Relay.make({
        pollInterval: "50 millis",
        retry: { initialDelay: "100 millis", maxDelay: "200 millis", maxAttempts: 3 },
      }),
    ).pipe(
      Layer.provide(
        Layer.mergeAll(storeLayer(t.url), Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange }))),
      ),
      Layer.orDie,
    ),
  )

/** Every message the inbox's runtime logs (its warnings among them). */
const logged: string[] = []
const recordLogs = Logger.layer([Logger.make(({ message }) => logged.push(String(message)))])

const startInbox = (exchange: string, consumer: string, queueType: "quorum" | "classic" = "quorum") =>
  ManagedRuntime.make(
    Layer.effectDiscard(
      Inbox.make({
        consumer,
        handlers: [
          Inbox.handler(Note, ({ payload, envelope, trx }) =>
            Effect.promise(() =>
              sql`INSERT INTO effects (consumer, message_id, note) VALUES (${consumer}, ${envelope.id}, ${payload.note})`.execute(
                trx,
              ),
            ),
          ),
        ],
      }),
    ).pipe(
      Layer.provide(
        Layer.mergeAll(
          storeLayer(t.url),
          Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange, queueType })),
        ),
      ),
      Layer.provide(recordLogs),
      Layer.orDie,
    ),
  )

const enqueue = (note: string) =>
  t.db.transaction().execute((trx) => Effect.runPromise(Outbox.enqueue(trx, Note, { note })))

const outboxRow = async (id: string) =>
  (
    await sql<{
      status: string
      attempts: number
      last_error: string | null
    }>`SELECT status, attempts, last_error FROM txbox.outbox WHERE id = ${id}`.execute(t.db)
  ).rows[0]!

const effectsOf = async (consumer: string) =>
  Number(
    (await sql<{ n: string }>`SELECT count(*) AS n FROM effects WHERE consumer = ${consumer}`.execute(t.db))
      .rows[0]!.n,
  )

describe("producer first", () => {
  test("without the topology declared, the relay's message comes back unroutable and ends dead after maxAttempts", async () => {
    // An exchange of its own: no queue is bound to it.
    const relay = startRelay(uniqueName("topo-none"))
    await relay.runPromise(Effect.void)
    try {
      const { id } = await enqueue("lost")
      await eventually("the row is dead", async () => (await outboxRow(id)).status === "dead")
      const row = await outboxRow(id)
      expect(row.attempts).toBe(3)
      expect(row.last_error).toContain("unroutable")
    } finally {
      await relay.dispose()
    }
  })

  test("declared ahead with declareTopology, the message waits in the consumer's queue until its inbox starts and handles it", async () => {
    const exchange = uniqueName("topo-ahead")
    const consumer = uniqueName("billing")
    const declared = await Effect.runPromise(
      declareTopology({ url: amqpUrl(), exchange, consumer, types: [Note.type] }),
    )
    expect(declared).toMatchObject({
      exchange,
      queue: `txbox.${consumer}`,
      deadQueue: `txbox.${consumer}.dead`,
      queueType: "quorum",
      bindings: [Note.type],
      legacyQueue: false,
    })
    expect(declared.queueArguments).toMatchObject({
      "x-queue-type": "quorum",
      "x-delivery-limit": 20,
      "x-dead-letter-exchange": "",
      "x-dead-letter-routing-key": `txbox.${consumer}.dead`,
    })

    const relay = startRelay(exchange)
    await relay.runPromise(Effect.void)
    try {
      const { id } = await enqueue("waits")
      await eventually("the row is sent", async () => (await outboxRow(id)).status === "sent")
      // Sent on the first attempt: the broker routed it, nothing came back.
      expect(await outboxRow(id)).toMatchObject({ status: "sent", attempts: 0, last_error: null })
      await eventually("the message waits in the queue", async () => (await ready(queueName(consumer))) === 1)
      expect(await ready(deadQueueName(consumer))).toBe(0)
      expect(await effectsOf(consumer)).toBe(0)

      const inbox = startInbox(exchange, consumer)
      await inbox.runPromise(Effect.void)
      try {
        await eventually("the inbox handled it", async () => (await effectsOf(consumer)) === 1)
        await eventually("the queue is empty", async () => (await ready(queueName(consumer))) === 0)
      } finally {
        await inbox.dispose()
      }
    } finally {
      await relay.dispose()
      await deleteQueues(consumer)
    }
  })
})

test.each(["quorum", "classic"] as const)(
  "declaring twice, then an inbox subscribing, is idempotent: the same %s queue, no 406",
  async (queueType) => {
    const exchange = uniqueName("topo-idem")
    const consumer = uniqueName("idem")
    const options = { url: amqpUrl(), exchange, consumer, types: [Note.type, "other.type"], queueType }
    const first = await Effect.runPromise(declareTopology(options))
    const second = await Effect.runPromise(declareTopology(options))
    expect(second).toEqual(first)
    expect(second.legacyQueue).toBe(false)

    // The queue carries exactly the inbox's arguments: redeclaring with them is accepted, with any
    // other delivery limit refused.
    const config = await Effect.runPromise(resolveConfig({ url: amqpUrl(), exchange, queueType }))
    const args = consumerQueueArguments(consumer, config)
    expect(first.queueArguments).toEqual(args)
    expect(await refused(queueName(consumer), args)).toBe(false)
    expect(args["x-queue-type"]).toBe(queueType)
    expect(await refused(queueName(consumer), { ...args, "x-dead-letter-routing-key": "elsewhere" })).toBe(
      true,
    )

    const inbox = startInbox(exchange, consumer, queueType)
    try {
      await inbox.runPromise(Effect.void)
      const { id } = await enqueue("after-declare")
      const relay = startRelay(exchange)
      await relay.runPromise(Effect.void)
      try {
        await eventually("handled", async () => (await effectsOf(consumer)) === 1)
        // The handler may commit before the relay marks the row (the mark follows the confirm).
        await eventually("the row is sent", async () => (await outboxRow(id)).status === "sent")
      } finally {
        await relay.dispose()
      }
    } finally {
      await inbox.dispose()
    }
    // The inbox declared the same queue: no 406, so no "exists without txbox's arguments" warning.
    expect(logged.filter((m) => m.includes(queueName(consumer)))).toEqual([])
    // Declaring again after the inbox subscribed is still accepted as it is.
    expect((await Effect.runPromise(declareTopology(options))).legacyQueue).toBe(false)
    await deleteQueues(consumer)
  },
)

test("a queue declared by hand without txbox's arguments: declareTopology reports it, the inbox warns once and consumes it", async () => {
  const exchange = uniqueName("topo-legacy")
  const consumer = uniqueName("legacy")
  await withChannel((c) => c.assertQueue(queueName(consumer), { durable: true }))
  const declared = await Effect.runPromise(
    declareTopology({ url: amqpUrl(), exchange, consumer, types: [Note.type] }),
  )
  expect(declared.legacyQueue).toBe(true)
  // Bound all the same: the relay's message is routed into it.
  const relay = startRelay(exchange)
  await relay.runPromise(Effect.void)
  const inbox = startInbox(exchange, consumer)
  try {
    await enqueue("legacy")
    await inbox.runPromise(Effect.void)
    await eventually("handled", async () => (await effectsOf(consumer)) === 1)
    const warnings = logged.filter((m) => m.includes(`queue ${queueName(consumer)} exists without`))
    expect(warnings).toHaveLength(1)
  } finally {
    await inbox.dispose()
    await relay.dispose()
    await deleteQueues(consumer)
  }
})

test("queues an earlier txbox declared without x-queue-leader-locator are redeclared as they are: not legacy, no warning", async () => {
  const exchange = uniqueName("topo-locator")
  const consumer = uniqueName("locator")
  const config = await Effect.runPromise(resolveConfig({ url: amqpUrl(), exchange }))
  const args = consumerQueueArguments(consumer, config)
  const { "x-queue-leader-locator": locator, ...withoutLocator } = args
  expect(locator).toBe("balanced")
  // As txbox declared them before it set the locator.
  await withChannel(async (c) => {
    await c.assertQueue(queueName(consumer), { durable: true, arguments: withoutLocator })
    await c.assertQueue(deadQueueName(consumer), {
      durable: true,
      arguments: { "x-queue-type": "quorum", "x-delivery-limit": 1_000_000 },
    })
  })
  // RabbitMQ compares the locator of a quorum queue like its other arguments.
  expect(await refused(queueName(consumer), args)).toBe(true)
  const declared = await Effect.runPromise(
    declareTopology({ url: amqpUrl(), exchange, consumer, types: [Note.type] }),
  )
  expect(declared.legacyQueue).toBe(false)

  const inbox = startInbox(exchange, consumer)
  const relay = startRelay(exchange)
  try {
    await inbox.runPromise(Effect.void)
    await relay.runPromise(Effect.void)
    await enqueue("before-the-locator")
    await eventually("handled", async () => (await effectsOf(consumer)) === 1)
  } finally {
    await relay.dispose()
    await inbox.dispose()
  }
  expect(logged.filter((m) => m.includes(queueName(consumer)))).toEqual([])
  await deleteQueues(consumer)
})

type Run = CliRun

/** `bun src/cli/main.ts ...args`, with no AMQP_URL inherited unless `env` gives one. */
const txbox = (args: ReadonlyArray<string>, env: Record<string, string> = {}): Promise<Run> =>
  runTxbox(args, { env, unset: ["AMQP_URL"] })

describe("txbox topology declare", () => {
  test("declares the queue, dead queue and bindings; twice is fine; the relay then routes into the queue", async () => {
    const exchange = uniqueName("topo-cli")
    const consumer = uniqueName("cli")
    const args = ["topology", "declare", "--exchange", exchange, "--consumer", consumer]
    const run = await txbox([...args, "--type", Note.type, "--type", "orders.order-paid"], {
      AMQP_URL: amqpUrl(),
    })
    expect(run.stderr).toBe("")
    expect(run.code).toBe(0)
    expect(run.stdout).toContain(`exchange ${exchange} (topic, durable)`)
    expect(run.stdout).toContain(`queue txbox.${consumer} (durable): x-queue-type=quorum x-delivery-limit=20`)
    expect(run.stdout).toContain(`x-dead-letter-routing-key=txbox.${consumer}.dead`)
    expect(run.stdout).toContain(`bound txbox.${consumer} to ${exchange}: ${Note.type}, orders.order-paid`)

    // Again, with --url and one type fewer: the existing binding stays (declaring never unbinds).
    const again = await txbox([...args, "--url", amqpUrl(), "--type", Note.type, "--json"])
    expect(again.code).toBe(0)
    const json = JSON.parse(again.stdout)
    expect(json).toMatchObject({ queue: `txbox.${consumer}`, legacyQueue: false, bindings: [Note.type] })

    // A cluster's URLs, one node down: repeated --url, and AMQP_URL as a comma-separated list.
    const dead = "amqp://guest:guest@127.0.0.1:1"
    const cluster = await txbox([...args, "--url", dead, "--url", amqpUrl(), "--type", Note.type, "--json"])
    expect(cluster.stderr).toBe("")
    expect(cluster.code).toBe(0)
    expect(JSON.parse(cluster.stdout)).toMatchObject({ queue: `txbox.${consumer}`, legacyQueue: false })
    const fromEnv = await txbox([...args, "--type", Note.type, "--json"], {
      AMQP_URL: `${dead}, ${amqpUrl()}`,
    })
    expect(fromEnv.code).toBe(0)
    expect(JSON.parse(fromEnv.stdout)).toMatchObject({ queue: `txbox.${consumer}` })

    const relay = startRelay(exchange)
    await relay.runPromise(Effect.void)
    try {
      const { id } = await enqueue("cli-declared")
      await eventually("the row is sent", async () => (await outboxRow(id)).status === "sent")
      expect(await outboxRow(id)).toMatchObject({ status: "sent", attempts: 0, last_error: null })
      await eventually("the message waits in the queue", async () => (await ready(queueName(consumer))) === 1)
    } finally {
      await relay.dispose()
      await deleteQueues(consumer)
    }
  })

  test("is listed by --help; a missing --consumer or --type is a usage error (exit 2)", async () => {
    const help = await txbox(["--help"])
    expect(help.code).toBe(0)
    expect(help.stdout).toMatch(/^ {2}topology\s/m)
    const [noConsumer, noType] = await Promise.all([
      txbox(["topology", "declare", "--type", "t"], { AMQP_URL: amqpUrl() }),
      txbox(["topology", "declare", "--consumer", "c"], { AMQP_URL: amqpUrl() }),
    ])
    expect(noConsumer.code).toBe(2)
    expect(noConsumer.stderr.trim()).toStartWith("txbox: Missing required flag: --consumer")
    expect(noType.code).toBe(2)
    expect(noType.stderr.trim()).toStartWith("txbox: ")
    expect(noType.stderr).toContain("--type")
  })

  test("fails in one line: no URL (exit 2), an unreachable broker (exit 1, no credentials)", async () => {
    const noUrl = await txbox(["topology", "declare", "--consumer", "c", "--type", "t"])
    expect(noUrl.code).toBe(2)
    expect(noUrl.stderr.trim()).toBe("txbox: no broker URL: pass --url or set AMQP_URL")

    const down = await txbox([
      "topology",
      "declare",
      "--url",
      "amqp://app:s3cret@127.0.0.1:1/",
      "--consumer",
      "c",
      "--type",
      "t",
    ])
    expect(down.code).toBe(1)
    expect(down.stdout).toBe("")
    const lines = down.stderr.trimEnd().split("\n")
    expect(lines).toHaveLength(1)
    expect(lines[0]).toStartWith("txbox: cannot connect to the broker:")
    expect(down.stderr).not.toContain("s3cret")
  })
})
