// Contracts across services on real PostgreSQL and RabbitMQ: producers on different contract versions
// feeding one consumer, messages from producers that are not txbox (the CloudEvents SDK, plain
// amqplib), txbox's messages read by the CloudEvents SDK, and the `txbox contracts check` /
// `txbox asyncapi` commands. Effects are counted in the `effects` table, written by the handler
// through the inbox's transaction.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { DiagnosticSeverity, Parser } from "@asyncapi/parser"
import amqp from "amqplib"
import { CloudEvent, HTTP } from "cloudevents"
import { Effect, Layer, ManagedRuntime } from "effect"
import { sql } from "kysely"
import * as v from "valibot"
import { type AnyContract, defineEvent, type InputOf } from "../../src/Contract.ts"
import * as Inbox from "../../src/Inbox.ts"
import * as Outbox from "../../src/Outbox.ts"
import * as Relay from "../../src/Relay.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { OrderPlaced as OrderPlacedV1 } from "../fixtures/orders-v1.ts"
import { OrderPlaced as OrderPlacedV2 } from "../fixtures/orders-v2.ts"
import { collect } from "../support/amqp.ts"
import { amqpUrl, uniqueName } from "../support/db.ts"
import { eventually, type MigratedDatabase, migratedDatabase, storeLayer } from "../support/txbox.ts"

/** A producer that has moved on past the consumer: version 3, upcasting from 2. */
const OrderPlacedV3 = defineEvent({
  type: "orders.order-placed",
  version: 3,
  schema: v.object({
    orderId: v.string(),
    total: v.object({ amount: v.number(), currency: v.picklist(["EUR", "USD"]) }),
    channel: v.picklist(["web", "store"]),
  }),
  upcast: { from: OrderPlacedV2, to: (v2) => ({ ...v2, channel: "web" as const }) },
})

const TYPE = OrderPlacedV2.type
const FIXTURES = fileURLToPath(new URL("../fixtures/", import.meta.url))
const MAIN = fileURLToPath(new URL("../../src/cli/main.ts", import.meta.url))

let t: MigratedDatabase
beforeAll(async () => {
  t = await migratedDatabase("contracts")
})
afterAll(async () => {
  await t.close()
})

const fast = {
  pollInterval: "100 millis",
  retry: { initialDelay: "100 millis", maxDelay: "300 millis", maxAttempts: 3 },
} as const

/** The consumer's one handler, for the newest version it knows (@2): records what it was given. */
const startConsumer = async (
  exchange: string,
  consumer: string,
  mode: Inbox.InboxConfig["mode"] = "idempotent",
) => {
  const runtime = ManagedRuntime.make(
    Inbox.layer({
      ...fast,
      consumer,
      mode,
      handlers: [
        Inbox.handler(OrderPlacedV2, ({ payload, envelope, trx }) =>
          Effect.promise(() =>
            sql`INSERT INTO effects (consumer, message_id, note)
                VALUES (${consumer}, ${envelope.id}, ${JSON.stringify({ version: envelope.version, payload })})`.execute(
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
  return runtime
}

const startRelay = async (exchange: string, source = "orders-service") => {
  const runtime = ManagedRuntime.make(
    Relay.layer({ ...fast, outageRetry: { initialDelay: "50 millis", maxDelay: "500 millis" } }).pipe(
      Layer.provide(
        Layer.mergeAll(
          storeLayer(t.url),
          Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange, source })),
        ),
      ),
    ),
  )
  await runtime.runPromise(Effect.void)
  return runtime
}

/** A producer on `contract`'s module: enqueues in its own transaction; the relay publishes it. */
const produce = async <C extends AnyContract>(contract: C, payload: InputOf<C>) => {
  const written = await t.db
    .transaction()
    .execute((trx) => Effect.runPromise(Outbox.enqueue(trx, contract, payload)))
  return written.id
}

const effectsOf = async (consumer: string) =>
  (
    await sql<{ message_id: string; note: string }>`
      SELECT message_id, note FROM effects WHERE consumer = ${consumer} ORDER BY id`.execute(t.db)
  ).rows.map((r) => ({ id: r.message_id, ...(JSON.parse(r.note) as { version: number; payload: unknown }) }))

const inboxRows = async (consumer: string) =>
  (
    await sql<{
      message_id: string
      status: string
      version: number | null
      last_error: string | null
      headers: Record<string, string>
    }>`SELECT message_id, status, version, last_error, headers FROM txbox.inbox WHERE consumer = ${consumer}`.execute(
      t.db,
    )
  ).rows

/** A plain amqplib publisher with confirms: what a service without txbox does. */
const foreignPublisher = async (exchange: string) => {
  const connection = await amqp.connect(amqpUrl())
  const channel = await connection.createConfirmChannel()
  await channel.assertExchange(exchange, "topic", { durable: true })
  return {
    publish: (body: string | Buffer, options: amqp.Options.Publish, routingKey = TYPE) =>
      new Promise<void>((resolve, reject) =>
        channel.publish(exchange, routingKey, Buffer.from(body), options, (err) =>
          err ? reject(err) : resolve(),
        ),
      ),
    close: async () => {
      await channel.close().catch(() => {})
      await connection.close().catch(() => {})
    },
  }
}

/** Lets a late duplicate (wrongly) apply before the counts are taken. */
/** A consumer and a relay on a fresh exchange for `body`, disposed after it. */
const withPipeline = async (
  exchangePrefix: string,
  consumerPrefix: string,
  mode: Inbox.InboxConfig["mode"],
  body: (names: { readonly exchange: string; readonly consumer: string }) => Promise<void>,
) => {
  const exchange = uniqueName(exchangePrefix)
  const consumer = uniqueName(consumerPrefix)
  const inbox = await startConsumer(exchange, consumer, mode)
  const relay = await startRelay(exchange)
  try {
    await body({ exchange, consumer })
  } finally {
    await relay.dispose()
    await inbox.dispose()
  }
}

const settle = () => Bun.sleep(500)

describe("producers and a consumer on different versions", () => {
  for (const mode of ["idempotent", "store-then-process"] as const) {
    test(`${mode}: a v1 producer's message reaches the v2 handler upcast, once`, async () => {
      await withPipeline(`contracts-v1-${mode}`, `v1-${mode}`, mode, async ({ consumer }) => {
        const id = await produce(OrderPlacedV1, { orderId: "o-1", total: 12.5, currency: "USD" })
        await eventually("the v2 handler ran", async () => (await effectsOf(consumer)).length === 1)
        await settle()
        expect(await effectsOf(consumer)).toEqual([
          { id, version: 2, payload: { orderId: "o-1", total: { amount: 12.5, currency: "USD" } } },
        ])
        // The inbox keeps the message as it was sent: version 1.
        expect((await inboxRows(consumer)).map((r) => [r.status, r.version])).toEqual([["processed", 1]])
      })
    })
  }

  test("a v2 producer's message reaches the v2 handler as it is", async () => {
    await withPipeline("contracts-v2", "v2", "idempotent", async ({ consumer }) => {
      const id = await produce(OrderPlacedV2, { orderId: "o-2", total: { amount: 3, currency: "EUR" } })
      await eventually("the v2 handler ran", async () => (await effectsOf(consumer)).length === 1)
      expect(await effectsOf(consumer)).toEqual([
        { id, version: 2, payload: { orderId: "o-2", total: { amount: 3, currency: "EUR" } } },
      ])
      expect((await inboxRows(consumer)).map((r) => [r.status, r.version])).toEqual([["processed", 2]])
    })
  })

  test("a v3 producer's message is refused by the v2 consumer: a dead row saying to upgrade it; v1 and v2 still flow", async () => {
    await withPipeline("contracts-v3", "v3", "idempotent", async ({ consumer }) => {
      const newer = await produce(OrderPlacedV3, {
        orderId: "o-3",
        total: { amount: 1, currency: "EUR" },
        channel: "store",
      })
      const older = await produce(OrderPlacedV1, { orderId: "o-4", total: 4, currency: "EUR" })
      await eventually("a dead row and an effect", async () => {
        const rows = await inboxRows(consumer)
        return rows.some((r) => r.status === "dead") && (await effectsOf(consumer)).length === 1
      })
      const rows = new Map((await inboxRows(consumer)).map((r) => [r.message_id, r]))
      expect(rows.get(newer)).toMatchObject({
        status: "dead",
        version: 3,
        last_error:
          "orders.order-placed@3 is newer than this consumer handles (@2): upgrade the consumer first",
      })
      expect((await effectsOf(consumer)).map((e) => e.id)).toEqual([older])
    })
  })

  test("an @1 message that the upcast turns into an invalid @2 is a dead row naming the upcast", async () => {
    await withPipeline("contracts-bad-upcast", "bad-upcast", "idempotent", async ({ consumer }) => {
      // Valid @1 (any total), invalid @2 (amount must be >= 0).
      const id = await produce(OrderPlacedV1, { orderId: "o-5", total: -5, currency: "EUR" })
      await eventually("a dead row", async () => (await inboxRows(consumer)).some((r) => r.status === "dead"))
      const [row] = await inboxRows(consumer)
      expect(row?.message_id).toBe(id)
      expect(row?.last_error).toStartWith(
        "invalid payload for orders.order-placed@v2 (upcast from @v1): total.amount: Invalid value: Expected >=0",
      )
      expect(await effectsOf(consumer)).toEqual([])
    })
  })
})

describe("messages from producers that are not txbox", () => {
  const v1Data = { orderId: "ext-1", total: 7, currency: "EUR" }
  const v2Data = { orderId: "ext-2", total: { amount: 8, currency: "USD" } }

  test("a CloudEvents SDK event in structured mode, sent twice, is handled once as the version it names", async () => {
    const exchange = uniqueName("contracts-ce-structured")
    const consumer = uniqueName("ce-structured")
    const inbox = await startConsumer(exchange, consumer)
    const producer = await foreignPublisher(exchange)
    try {
      const event = new CloudEvent({
        id: crypto.randomUUID(),
        type: TYPE,
        source: "/legacy/checkout",
        datacontenttype: "application/json",
        txboxversion: 2,
        data: v2Data,
      })
      const options = { contentType: "application/cloudevents+json; charset=utf-8", persistent: true }
      await producer.publish(event.toString(), options)
      await producer.publish(event.toString(), options)
      await eventually("the handler ran", async () => (await effectsOf(consumer)).length === 1)
      await settle()
      expect(await effectsOf(consumer)).toEqual([{ id: event.id, version: 2, payload: v2Data }])
      // One processed row, the dedupe record (attributes → headers: test/unit/cloudevents-wire.test.ts).
      expect((await inboxRows(consumer)).map((r) => [r.status, r.version])).toEqual([["processed", 2]])
    } finally {
      await producer.close()
      await inbox.dispose()
    }
  })

  test("a CloudEvents SDK event on the AMQP binding (binary mode) without a version is read as @1 and upcast, once", async () => {
    const exchange = uniqueName("contracts-ce-binary")
    const consumer = uniqueName("ce-binary")
    const inbox = await startConsumer(exchange, consumer)
    const producer = await foreignPublisher(exchange)
    try {
      const event = new CloudEvent({
        id: crypto.randomUUID(),
        type: TYPE,
        source: "/legacy/pos",
        data: v1Data,
      })
      // The binding: every attribute but the data an application property `cloudEvents:<name>`;
      // no AMQP message-id or type property.
      const headers: Record<string, unknown> = {}
      for (const [name, value] of Object.entries(event.toJSON())) {
        if (name !== "data") headers[`cloudEvents:${name}`] = value
      }
      const options = { contentType: "application/json", headers, persistent: true }
      await producer.publish(JSON.stringify(event.data), options)
      await producer.publish(JSON.stringify(event.data), options)
      await eventually("the handler ran", async () => (await effectsOf(consumer)).length === 1)
      await settle()
      expect(await effectsOf(consumer)).toEqual([
        { id: event.id, version: 2, payload: { orderId: "ext-1", total: { amount: 7, currency: "EUR" } } },
      ])
    } finally {
      await producer.close()
      await inbox.dispose()
    }
  })

  test("plain amqplib with only messageId and type set, sent twice, is handled once as @1", async () => {
    const exchange = uniqueName("contracts-plain")
    const consumer = uniqueName("plain")
    const inbox = await startConsumer(exchange, consumer)
    const producer = await foreignPublisher(exchange)
    try {
      const messageId = crypto.randomUUID()
      await producer.publish(JSON.stringify(v1Data), { messageId, type: TYPE })
      await producer.publish(JSON.stringify(v1Data), { messageId, type: TYPE })
      await eventually("the handler ran", async () => (await effectsOf(consumer)).length === 1)
      await settle()
      expect(await effectsOf(consumer)).toEqual([
        { id: messageId, version: 2, payload: { orderId: "ext-1", total: { amount: 7, currency: "EUR" } } },
      ])
      expect((await inboxRows(consumer)).map((r) => [r.status, r.version])).toEqual([["processed", null]])
    } finally {
      await producer.close()
      await inbox.dispose()
    }
  })

  test("plain amqplib messages without an id, without a type, or with a bad version become dead rows with the reason", async () => {
    const exchange = uniqueName("contracts-plain-bad")
    const consumer = uniqueName("plain-bad")
    const inbox = await startConsumer(exchange, consumer)
    const producer = await foreignPublisher(exchange)
    try {
      const ids = { noType: crypto.randomUUID(), newer: crypto.randomUUID(), invalid: crypto.randomUUID() }
      await producer.publish(JSON.stringify(v1Data), { type: TYPE })
      await producer.publish(JSON.stringify(v1Data), { messageId: ids.noType })
      await producer.publish(JSON.stringify(v2Data), {
        messageId: ids.newer,
        type: TYPE,
        headers: { "txbox-version": 7 },
      })
      await producer.publish(JSON.stringify({ orderId: "x" }), { messageId: ids.invalid, type: TYPE })
      await eventually(
        "four dead rows",
        async () => (await inboxRows(consumer)).filter((r) => r.status === "dead").length === 4,
      )
      const dead = new Map((await inboxRows(consumer)).map((r) => [r.message_id, r.last_error]))
      const anonymous = [...dead.entries()].find(([key]) => key.startsWith("missing-id:"))
      expect(anonymous?.[1]).toBe("message has no message id")
      expect(dead.get(ids.noType)).toBe("message has no type")
      expect(dead.get(ids.newer)).toBe(
        "orders.order-placed@7 is newer than this consumer handles (@2): upgrade the consumer first",
      )
      expect(dead.get(ids.invalid)).toStartWith("invalid payload for orders.order-placed@v1: total:")
      expect(await effectsOf(consumer)).toEqual([])
    } finally {
      await producer.close()
      await inbox.dispose()
    }
  })
})

describe("txbox's messages read by the CloudEvents SDK", () => {
  test("a message the relay published is a valid CloudEvent with every required attribute", async () => {
    const exchange = uniqueName("contracts-ce-read")
    const seen = await collect(amqpUrl(), exchange, TYPE)
    const relay = await startRelay(exchange, "orders-service")
    try {
      const payload = { orderId: "o-9", total: { amount: 9, currency: "EUR" as const } }
      const id = await produce(OrderPlacedV2, payload)
      await eventually("the message", async () => seen.messages.length === 1)
      const message = seen.messages[0]!
      // Sent as a CloudEvents JSON batch (the relay's default), which the SDK reads as it is.
      expect(message.properties.contentType).toBe("application/cloudevents-batch+json")
      const events = HTTP.toEvent({
        headers: { "content-type": String(message.properties.contentType) },
        body: message.content.toString("utf8"),
      })
      if (!Array.isArray(events)) throw new Error("expected a batch of events")
      expect(events).toHaveLength(1)
      const event = events[0] as CloudEvent<unknown>
      expect(event.validate()).toBe(true)
      expect({ ...event.toJSON() }).toMatchObject({
        specversion: "1.0",
        id,
        type: TYPE,
        source: "orders-service",
        datacontenttype: "application/json",
        data: payload,
        txboxversion: 2,
      })
      expect(Number.isNaN(Date.parse(String(event.time)))).toBe(false)
      expect(message.properties.messageId).toBe(id)
    } finally {
      await relay.dispose()
      await seen.close()
    }
  })
})

/** `bun src/cli/main.ts ...args` in the repository root. */
const txbox = async (...args: string[]) => {
  const proc = Bun.spawn([process.execPath, MAIN, ...args], {
    cwd: fileURLToPath(new URL("../../", import.meta.url)),
    stdout: "pipe",
    stderr: "pipe",
    env: { ...process.env, DATABASE_URL: "" },
  })
  const [stdout, stderr, code] = await Promise.all([
    new Response(proc.stdout).text(),
    new Response(proc.stderr).text(),
    proc.exited,
  ])
  return { stdout, stderr, code }
}

describe("the txbox command", () => {
  test("contracts check exits 1 on a breaking version without an upcast, saying what breaks whom", async () => {
    const { stdout, stderr, code } = await txbox(
      "contracts",
      "check",
      "--old",
      join(FIXTURES, "orders-v1.ts"),
      "--new",
      join(FIXTURES, "orders-v2-breaking.ts"),
    )
    expect(code).toBe(1)
    expect(stdout).toContain(
      [
        "orders.order-placed @1 → @2: INCOMPATIBLE",
        "  breaks old producers (an @1 message fails @2's schema):",
        "    amount: required field added",
        "    channel: required field added",
        '    currency: enum narrowed: "USD" no longer accepted',
        "  breaks old consumers (an @2 message fails @1's schema):",
        "    total: required field removed",
      ].join("\n"),
    )
    expect(stderr).toBe("txbox: incompatible: orders.order-placed@2\n")
  })

  test("contracts check exits 0 when the new version upcasts from the old one; --json for machines", async () => {
    const { stdout, code } = await txbox(
      "contracts",
      "check",
      "--old",
      join(FIXTURES, "orders-v1.ts"),
      "--new",
      join(FIXTURES, "orders-v2.ts"),
      "--json",
    )
    expect(code).toBe(0)
    const result = JSON.parse(stdout)
    expect(result.compatible).toBe(true)
    expect(result.reports.at(-1)).toMatchObject({
      oldVersion: 1,
      newVersion: 2,
      upcast: true,
      compatible: true,
    })
  })

  test("contracts check with a module that cannot be loaded is a usage error (exit 2)", async () => {
    const { stderr, code } = await txbox("contracts", "check", "--new", join(FIXTURES, "nowhere.ts"))
    expect(code).toBe(2)
    expect(stderr).toStartWith("txbox: cannot load the contract module")
  })

  test("asyncapi writes an AsyncAPI 3 document that @asyncapi/parser validates", async () => {
    const dir = mkdtempSync(join(tmpdir(), "txbox-asyncapi-"))
    try {
      const out = join(dir, "asyncapi.json")
      const { stdout, code } = await txbox(
        "asyncapi",
        "--module",
        join(FIXTURES, "orders-v2.ts"),
        "--consumer",
        "billing",
        "--server",
        "amqp://rabbit.internal:5672",
        "--out",
        out,
      )
      expect(code).toBe(0)
      expect(stdout).toBe(`wrote ${out}: AsyncAPI 3.0.0, 2 messages\n`)
      const { document, diagnostics } = await new Parser().parse(readFileSync(out, "utf8"))
      expect(diagnostics.filter((d) => d.severity === DiagnosticSeverity.Error)).toEqual([])
      expect(document?.version()).toBe("3.0.0")
      expect(
        document!
          .channels()
          .all()
          .map((c) => c.address()),
      ).toEqual(["orders.order-placed", "txbox.billing"])
      const messages = new Map(
        document!
          .components()
          .messages()
          .all()
          .map((m) => [m.id(), m]),
      )
      expect([...messages.keys()]).toEqual(["orders.order-placed.v1", "orders.order-placed.v2"])
      const v2 = messages.get("orders.order-placed.v2")!
      expect(v2.payload()?.required()).toEqual(["orderId", "total"])
      expect(v2.headers()?.properties()?.["txbox-version"]?.const()).toBe(2)
      expect(
        document!
          .operations()
          .all()
          .map((o) => `${o.action()} ${o.channels().all()[0]?.address()}`),
      ).toEqual(["send orders.order-placed", "receive txbox.billing"])
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
