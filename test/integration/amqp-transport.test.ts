// The RabbitMQ transport against a real broker. What the broker holds is checked with a plain
// amqplib client, never through the transport under test.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import net from "node:net"
import amqp from "amqplib"
import { Deferred, Duration, Effect, Exit, Fiber, Layer, Scope } from "effect"
import { AmqpTransport } from "../../src/amqp.ts"
import type { TransportError } from "../../src/Errors.ts"
import {
  type Delivery,
  type DeliveryDecision,
  type OutgoingMessage,
  type PublishOutcome,
  Transport,
} from "../../src/ports/Transport.ts"
import { BATCH_CONTENT_TYPE } from "../../src/transport/amqp/batch.ts"
import type { AmqpTransportConfig } from "../../src/transport/amqp/config.ts"
import { amqpUrl, uniqueName } from "../support/db.ts"
import { startTcpProxy, type TcpProxy } from "../support/tcpProxy.ts"

let raw: amqp.ChannelModel
let admin: amqp.Channel
const exchanges: string[] = []
const queues: string[] = []

beforeAll(async () => {
  raw = await amqp.connect(amqpUrl())
  admin = await raw.createChannel()
})

afterAll(async () => {
  // Leave the shared broker as we found it.
  for (const queue of queues) await admin.deleteQueue(queue).catch(() => {})
  for (const exchange of exchanges) await admin.deleteExchange(exchange).catch(() => {})
  await raw.close().catch(() => {})
})

const freshExchange = (): string => {
  const name = uniqueName("txbox-test-events")
  exchanges.push(name)
  return name
}

/** A queue of our own on `exchange`, declared and bound before anything is published. */
const boundQueue = async (exchange: string, bindingKey: string): Promise<string> => {
  const queue = uniqueName("txbox-test-q")
  queues.push(queue)
  await admin.assertExchange(exchange, "topic", { durable: true })
  await admin.assertQueue(queue, { durable: false, autoDelete: false })
  await admin.bindQueue(queue, exchange, bindingKey)
  return queue
}

/** Takes up to `count` messages from `queue`, acking them, waiting up to `timeoutMs` for them to arrive. */
const drain = async (queue: string, count: number, timeoutMs = 5000): Promise<amqp.GetMessage[]> => {
  const got: amqp.GetMessage[] = []
  const deadline = Date.now() + timeoutMs
  while (got.length < count && Date.now() < deadline) {
    const message = await admin.get(queue, { noAck: true })
    if (message === false) await Bun.sleep(20)
    else got.push(message)
  }
  return got
}

/** The event ids in `messages`, a batch message's each (default: one message per routing key). */
const eventIds = (messages: ReadonlyArray<amqp.GetMessage>): string[] =>
  messages
    .flatMap((m) =>
      m.properties.contentType === BATCH_CONTENT_TYPE
        ? (JSON.parse(m.content.toString("utf8")) as Array<{ id: string }>).map((e) => e.id)
        : [m.properties.messageId as string],
    )
    .sort()

/** Binary mode: one message per event (`batchMessages: 1`), and the default, batches. */
const modes: ReadonlyArray<{ readonly name: string; readonly options: { readonly batchMessages?: number } }> =
  [
    { name: "one message per event", options: { batchMessages: 1 } },
    { name: "batched (the default)", options: {} },
  ]

const readyCount = async (queue: string): Promise<number> => (await admin.checkQueue(queue)).messageCount

const message = (i: number, overrides: Partial<OutgoingMessage> = {}): OutgoingMessage => ({
  id: `0190a0b0-0000-7000-8000-${String(i).padStart(12, "0")}`,
  type: "orders.order-placed",
  version: 2,
  routingKey: "orders.order-placed",
  body: JSON.stringify({ orderId: `order-${i}`, total: i * 1.5 }),
  headers: { traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-origin": "test" },
  occurredAt: new Date(Date.UTC(2024, 4, 6, 7, 8, 9, 123)),
  partitionKey: `customer-${i % 3}`,
  tenantId: "acme",
  ...overrides,
})

const run = <A, E>(
  config: AmqpTransportConfig,
  program: Effect.Effect<A, E, Transport | Scope.Scope>,
): Promise<A> =>
  Effect.runPromise(
    program.pipe(Effect.scoped, Effect.provide(AmqpTransport.layer(config))) as Effect.Effect<A>,
  )

/** `program` on a transport that reaches the broker through a proxy the test can cut (quick reconnects). */
const runThroughProxy = async <A, E>(
  exchange: string,
  program: (proxy: TcpProxy) => Effect.Effect<A, E, Transport | Scope.Scope>,
): Promise<A> => {
  const target = new URL(amqpUrl())
  const proxy = await startTcpProxy(target.hostname, Number(target.port || 5672))
  try {
    return await run(
      {
        url: proxy.urlFor(amqpUrl()),
        exchange,
        reconnect: { initialDelay: "50 millis", maxDelay: "200 millis" },
      },
      program(proxy),
    )
  } finally {
    await proxy.close()
  }
}

/** Retries `check` until it passes or `timeoutMs` runs out. */
const eventually = async (check: () => void | Promise<void>, timeoutMs = 10_000): Promise<void> => {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    try {
      await check()
      return
    } catch (error) {
      if (Date.now() > deadline) throw error
      await Bun.sleep(50)
    }
  }
}

/** A TCP port nothing listens on. */
const closedPort = async (): Promise<number> => {
  const server = net.createServer()
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const { port } = server.address() as net.AddressInfo
  await new Promise<void>((resolve) => server.close(() => resolve()))
  return port
}

const publishAll = (batch: ReadonlyArray<OutgoingMessage>) =>
  Effect.gen(function* () {
    const transport = yield* Transport
    return yield* transport.publish(batch)
  })

const tally = (outcomes: ReadonlyArray<{ readonly _tag: string }>): Record<string, number> => {
  const counts: Record<string, number> = {}
  for (const o of outcomes) counts[o._tag] = (counts[o._tag] ?? 0) + 1
  return counts
}

describe("publish", () => {
  test("one message per event (batchMessages: 1): each is confirmed and a plain AMQP client reads each CloudEvents attribute", async () => {
    const exchange = freshExchange()
    const queue = await boundQueue(exchange, "orders.#")
    const batch = Array.from({ length: 50 }, (_, i) => message(i))

    const outcomes = await run(
      { url: amqpUrl(), exchange, source: "orders-service", batchMessages: 1 },
      publishAll(batch),
    )

    expect(outcomes).toHaveLength(50)
    expect(outcomes.every((o) => o._tag === "Confirmed")).toBe(true)
    const received = await drain(queue, 50)
    expect(received).toHaveLength(50)
    const byId = new Map(received.map((m) => [m.properties.messageId as string, m]))
    for (const sent of batch) {
      const got = byId.get(sent.id)!
      expect(got.content.toString("utf8")).toBe(sent.body)
      expect(got.fields.routingKey).toBe("orders.order-placed")
      expect(got.properties.messageId).toBe(sent.id)
      expect(got.properties.type).toBe("orders.order-placed")
      expect(got.properties.contentType).toBe("application/json")
      expect(got.properties.appId).toBe("orders-service")
      expect(got.properties.timestamp).toBe(Math.floor(sent.occurredAt.getTime() / 1000))
      expect(got.properties.deliveryMode).toBe(2)
      expect(got.properties.headers).toEqual({
        "cloudEvents:specversion": "1.0",
        "cloudEvents:id": sent.id,
        "cloudEvents:type": "orders.order-placed",
        "cloudEvents:source": "orders-service",
        "cloudEvents:time": "2024-05-06T07:08:09.123Z",
        "txbox-version": 2,
        // The producer's trace as stored: with no tracer installed the transport makes no PRODUCER
        // span of its own (with one, its span is the new parent: test/integration/otlp.test.ts).
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "partition-key": sent.partitionKey,
        "tenant-id": "acme",
        "x-origin": "test",
      })
    }
  })

  test("by default a batch's events of one routing key go as one CloudEvents batch message, in order, up to batchMessages", async () => {
    const exchange = freshExchange()
    const queue = await boundQueue(exchange, "#")
    const batch = [
      ...Array.from({ length: 5 }, (_, i) => message(i)),
      message(5, { type: "billing.invoice-sent", routingKey: "billing.invoice-sent", partitionKey: null }),
      message(6),
    ]

    const outcomes = await run(
      { url: amqpUrl(), exchange, source: "orders-service", batchMessages: 4 },
      publishAll(batch),
    )

    expect(outcomes.map((o) => o._tag)).toEqual(Array(7).fill("Confirmed"))
    const received = await drain(queue, 3)
    expect(received).toHaveLength(3)
    expect(received.map((m) => m.properties.contentType)).toEqual(Array(3).fill(BATCH_CONTENT_TYPE))
    expect(received.map((m) => m.fields.routingKey)).toEqual([
      "orders.order-placed",
      "orders.order-placed",
      "billing.invoice-sent",
    ])
    const events = received.map(
      (m) => JSON.parse(m.content.toString("utf8")) as Array<Record<string, unknown>>,
    )
    expect(events.map((e) => e.map((event) => event.id))).toEqual([
      [0, 1, 2, 3].map((i) => batch[i]!.id),
      [4, 6].map((i) => batch[i]!.id),
      [batch[5]!.id],
    ])
    // A structured CloudEvent each; what binary mode puts in application properties, in
    // txboxheaders (a JSON object in a string: CloudEvents extension values are simple types).
    expect(events[0]![1]).toEqual({
      specversion: "1.0",
      id: batch[1]!.id,
      source: "orders-service",
      type: "orders.order-placed",
      time: "2024-05-06T07:08:09.123Z",
      datacontenttype: "application/json",
      txboxversion: 2,
      txboxheaders: JSON.stringify({
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "x-origin": "test",
        "partition-key": "customer-1",
        "tenant-id": "acme",
      }),
      data: JSON.parse(batch[1]!.body),
    })
    expect(received[0]!.properties.deliveryMode).toBe(2)
    expect(received[0]!.properties.appId).toBe("orders-service")
  })

  for (const mode of modes) {
    test(`${mode.name}: an unroutable message comes back Returned while the rest of its batch is Confirmed`, async () => {
      const exchange = freshExchange()
      const queue = await boundQueue(exchange, "orders.#")
      const batch = [
        message(1),
        message(2),
        message(3, { type: "billing.invoice-sent", routingKey: "billing.invoice-sent" }),
        message(4),
      ]

      const outcomes = await run({ url: amqpUrl(), exchange, ...mode.options }, publishAll(batch))

      expect(outcomes.map((o) => o._tag)).toEqual(["Confirmed", "Confirmed", "Returned", "Confirmed"])
      expect((outcomes[2] as { error: string }).error).toContain("billing.invoice-sent")
      const received = await drain(queue, mode.options.batchMessages === 1 ? 3 : 1)
      expect(eventIds(received)).toEqual([batch[0]!.id, batch[1]!.id, batch[3]!.id])
    })

    test(`${mode.name}: a message that can never be published is Rejected while the rest of its batch is Confirmed`, async () => {
      const exchange = freshExchange()
      const queue = await boundQueue(exchange, "orders.#")
      const batch = [
        message(1),
        // Headers beyond amqplib's 64 KiB table buffer.
        message(2, { headers: { huge: "x".repeat(70_000) } }),
        // Larger than the configured maxMessageSize.
        message(3, { body: JSON.stringify({ blob: "y".repeat(5000) }) }),
        message(4),
      ]

      const outcomes = await run(
        { url: amqpUrl(), exchange, maxMessageSize: 4096, ...mode.options },
        publishAll(batch),
      )

      expect(outcomes.map((o) => o._tag)).toEqual(["Confirmed", "Rejected", "Rejected", "Confirmed"])
      expect((outcomes[2] as { error: string }).error).toContain("maxMessageSize")
      // Batched too: the events too large to go with others close the batch before them.
      const received = await drain(queue, 2)
      expect(eventIds(received)).toEqual([batch[0]!.id, batch[3]!.id])
    })
  }

  test("publishing with the broker unreachable fails fast with a TransportError, not a hang", async () => {
    const port = await closedPort()
    const url = `amqp://secret-user:secret-pass@127.0.0.1:${port}`
    const started = Date.now()

    const result = await run(
      { url, exchange: freshExchange(), reconnect: { initialDelay: "50 millis" } },
      Effect.gen(function* () {
        const transport = yield* Transport
        const connected = yield* transport.isConnected
        const error = yield* Effect.flip(transport.publish([message(1)]))
        return { connected, error }
      }),
    )

    expect(Date.now() - started).toBeLessThan(3000)
    expect(result.connected).toBe(false)
    const error: TransportError = result.error
    expect(error._tag).toBe("TransportError")
    expect(error.reason).toBe("connection")
    expect(error.retryable).toBe(true)
    expect(error.message).toContain("ECONNREFUSED")
    expect(error.message).not.toContain("secret-pass")
  })

  test("with failFast, building the layer fails when the broker is unreachable", async () => {
    const port = await closedPort()
    const exit = await Effect.runPromiseExit(
      Layer.build(
        AmqpTransport.layer({
          url: `amqp://user:pw@127.0.0.1:${port}`,
          exchange: freshExchange(),
          failFast: true,
        }),
      ).pipe(Effect.scoped),
    )
    expect(Exit.isFailure(exit)).toBe(true)
    expect(String(Exit.isFailure(exit) ? exit.cause : "")).not.toContain("pw@")
  })

  test("an invalid config fails the layer with a ConfigError that does not echo the URL", async () => {
    const configs: ReadonlyArray<AmqpTransportConfig> = [
      { url: "http://user:hunter2@localhost" },
      { url: "amqp://user:hunter2@localhost", publishWindow: 0 },
      { url: "amqp://user:hunter2@localhost", queueType: "stream" as never },
      {
        url: "amqp://user:hunter2@localhost",
        reconnect: { initialDelay: "10 seconds", maxDelay: "1 second" },
      },
      { urls: [] },
      { urls: ["amqp://user:hunter2@localhost", "http://user:hunter2@localhost"] },
      { url: "amqp://user:hunter2@localhost", urls: ["amqp://user:hunter2@other"] } as never,
      {} as never,
    ]
    for (const config of configs) {
      const error = await Effect.runPromise(
        Effect.flip(Layer.build(AmqpTransport.layer(config)).pipe(Effect.scoped)),
      )
      expect(error._tag).toBe("ConfigError")
      expect(error.message).not.toContain("hunter2")
    }
  })

  test("a cluster's URLs: the first round tries each, so one that answers is enough to start, even with failFast", async () => {
    const [dead1, dead2] = [await closedPort(), await closedPort()]
    const exchange = freshExchange()
    const queue = await boundQueue(exchange, "orders.#")
    // The round starts at a random URL: several layers, so most start at a dead one.
    for (let i = 0; i < 4; i++) {
      const outcomes = await run(
        {
          urls: [`amqp://user:pw@127.0.0.1:${dead1}`, amqpUrl(), `amqp://user:pw@127.0.0.1:${dead2}`],
          exchange,
          failFast: true,
        },
        publishAll([message(i)]),
      )
      expect(outcomes.map((o) => o._tag)).toEqual(["Confirmed"])
    }
    expect(await drain(queue, 4)).toHaveLength(4)

    // None answers: one error naming each node by host and port, without credentials.
    const exit = await Effect.runPromiseExit(
      Layer.build(
        AmqpTransport.layer({
          urls: [`amqp://user:pw@127.0.0.1:${dead1}`, `amqp://user:pw@127.0.0.1:${dead2}`],
          exchange,
          failFast: true,
        }),
      ).pipe(Effect.scoped),
    )
    const text = String(Exit.isFailure(exit) ? exit.cause : "")
    expect(text).toContain(`127.0.0.1:${dead1}: `)
    expect(text).toContain(`127.0.0.1:${dead2}: `)
    expect(text).not.toContain("pw@")
  })

  test("a cluster's URLs: when the connection is lost the transport moves on to the next URL", async () => {
    const exchange = freshExchange()
    const queue = await boundQueue(exchange, "orders.#")
    const target = new URL(amqpUrl())
    const proxies = [
      await startTcpProxy(target.hostname, Number(target.port || 5672)),
      await startTcpProxy(target.hostname, Number(target.port || 5672)),
    ]
    try {
      const result = await run(
        {
          urls: proxies.map((p) => p.urlFor(amqpUrl())),
          exchange,
          reconnect: { initialDelay: "50 millis", maxDelay: "200 millis" },
        },
        Effect.gen(function* () {
          const transport = yield* Transport
          const before = yield* transport.publish([message(1)])
          const first = proxies.findIndex((p) => p.connections() === 1)
          // The node behind the first proxy goes away, and stays away.
          proxies[first]!.block()
          let up = false
          for (let i = 0; i < 100 && !up; i++) {
            yield* Effect.sleep(Duration.millis(50))
            up = yield* transport.isConnected
          }
          const after = yield* transport.publish([message(2)])
          return { before, first, up, after, carried: proxies.map((p) => p.connections()) }
        }),
      )
      expect(result.first).toBeGreaterThanOrEqual(0)
      expect(result.up).toBe(true)
      expect(result.before.map((o) => o._tag)).toEqual(["Confirmed"])
      expect(result.after.map((o) => o._tag)).toEqual(["Confirmed"])
      // Through the other proxy now.
      expect(result.carried[result.first]).toBe(0)
      expect(result.carried[1 - result.first]).toBe(1)
      expect(await drain(queue, 2)).toHaveLength(2)
    } finally {
      for (const proxy of proxies) await proxy.close()
    }
  })

  test("after the connection is lost, publish fails fast, and succeeds again once it is back", async () => {
    const exchange = freshExchange()
    const queue = await boundQueue(exchange, "orders.#")
    const result = await runThroughProxy(exchange, (proxy) =>
      Effect.gen(function* () {
        const transport = yield* Transport
        const before = yield* transport.publish([message(1)])
        proxy.block()
        // The client notices the dropped socket at once (the proxy closes it).
        yield* Effect.sleep(Duration.millis(100))
        const whileDown = yield* transport.isConnected
        const started = Date.now()
        const failed = yield* Effect.exit(transport.publish([message(2)]))
        const failedAfterMs = Date.now() - started
        proxy.unblock()
        let up = false
        for (let i = 0; i < 100 && !up; i++) {
          up = yield* transport.isConnected
          if (!up) yield* Effect.sleep(Duration.millis(50))
        }
        const after = yield* transport.publish([message(3)])
        return { before, whileDown, failed, failedAfterMs, up, after }
      }),
    )
    expect(result.before.map((o) => o._tag)).toEqual(["Confirmed"])
    expect(result.whileDown).toBe(false)
    expect(Exit.isFailure(result.failed)).toBe(true)
    expect(result.failedAfterMs).toBeLessThan(500)
    expect(result.up).toBe(true)
    expect(result.after.map((o) => o._tag)).toEqual(["Confirmed"])
    const received = await drain(queue, 2)
    expect(received.map((m) => m.properties.messageId).sort()).toEqual([message(1).id, message(3).id])
  })

  // The soak saw it once (2026-12-06): a consumer reconnected as RabbitMQ began to stop, the broker
  // closed the new connection before the client's code ran again, and the transport took the closed
  // connection for live from then on: every resubscribe failed on it, for good.
  test("a connection closed by the broker in the same read as its handshake's end is lost, not kept: the transport connects again", async () => {
    const exchange = freshExchange()
    const queue = await boundQueue(exchange, "orders.#")
    const result = await runThroughProxy(exchange, (proxy) =>
      Effect.gen(function* () {
        const transport = yield* Transport
        const before = yield* transport.publish([message(1)])
        // The next connection is closed as it opens; the one after it is left alone.
        proxy.closeRightAfterOpen(1)
        proxy.block()
        yield* Effect.sleep(Duration.millis(100))
        proxy.unblock()
        // Past the reconnect that gets the Close and the one after it.
        let after: ReadonlyArray<PublishOutcome> | undefined
        for (let i = 0; i < 60 && after === undefined; i++) {
          yield* Effect.sleep(Duration.millis(100))
          const attempt = yield* Effect.exit(transport.publish([message(2)]))
          if (Exit.isSuccess(attempt) && attempt.value.every((o) => o._tag === "Confirmed"))
            after = attempt.value
        }
        return { before, after }
      }),
    )
    expect(result.before.map((o) => o._tag)).toEqual(["Confirmed"])
    expect(result.after?.map((o) => o._tag)).toEqual(["Confirmed"])
    const received = await drain(queue, 2)
    expect(received.map((m) => m.properties.messageId).sort()).toEqual([message(1).id, message(2).id])
  })

  test("messages in flight when the connection dies are Interrupted, and the batch still completes", async () => {
    const exchange = freshExchange()
    const queue = await boundQueue(exchange, "orders.#")
    const target = new URL(amqpUrl())
    const proxy = await startTcpProxy(target.hostname, Number(target.port || 5672))
    try {
      const batch = Array.from({ length: 20_000 }, (_, i) => message(i))
      const outcomes = await run(
        // One event per message: batch messages would carry all 20,000 in a few, confirmed before the cut.
        { url: proxy.urlFor(amqpUrl()), exchange, publishWindow: 500, batchMessages: 1 },
        Effect.gen(function* () {
          const transport = yield* Transport
          const fiber = yield* Effect.forkChild(transport.publish(batch))
          // Cut the connection once the broker has taken some of the batch.
          yield* Effect.promise(() =>
            eventually(async () => expect(await readyCount(queue)).toBeGreaterThan(0)),
          )
          proxy.block()
          return yield* Fiber.join(fiber)
        }).pipe(Effect.timeout(Duration.seconds(10))),
      )
      const counts = tally(outcomes)
      expect(outcomes).toHaveLength(20_000)
      expect(counts.Interrupted ?? 0).toBeGreaterThan(0)
      expect((counts.Interrupted ?? 0) + (counts.Confirmed ?? 0)).toBe(20_000)
    } finally {
      await proxy.close()
    }
  })
})

describe("subscribe", () => {
  const consumerConfig = (exchange: string): AmqpTransportConfig => ({ url: amqpUrl(), exchange })
  const track = (consumer: string) => {
    queues.push(`txbox.${consumer}`)
    for (let attempt = 1; attempt <= 3; attempt++) queues.push(`txbox.${consumer}.delay.${attempt}`)
  }

  for (const mode of modes) {
    test(`${mode.name}: the handler sees the decoded Delivery, and Ack removes the message from the queue`, async () => {
      const exchange = freshExchange()
      const consumer = uniqueName("ack")
      track(consumer)
      const seen: Delivery[] = []

      await run(
        { ...consumerConfig(exchange), ...mode.options },
        Effect.gen(function* () {
          const transport = yield* Transport
          yield* transport.subscribe({ consumer, types: ["orders.order-placed"], prefetch: 10 }, (delivery) =>
            Effect.sync(() => {
              seen.push(delivery)
              return { _tag: "Ack" } as const
            }),
          )
          const outcomes = yield* transport.publish([message(1), message(2)])
          expect(outcomes.map((o) => o._tag)).toEqual(["Confirmed", "Confirmed"])
          yield* Effect.promise(() => eventually(() => expect(seen).toHaveLength(2)))
        }),
      )

      const first = seen.find((d) => d.messageId === message(1).id)!
      expect(first).toEqual({
        messageId: message(1).id,
        type: "orders.order-placed",
        version: 2,
        body: message(1).body,
        // A batched event's body is its data as text, with no bytes of its own.
        ...(mode.options.batchMessages === 1 ? { bodyBytes: Buffer.from(message(1).body) } : {}),
        headers: {
          "cloudEvents:specversion": "1.0",
          "cloudEvents:id": message(1).id,
          "cloudEvents:type": "orders.order-placed",
          "cloudEvents:source": "txbox",
          "cloudEvents:time": "2024-05-06T07:08:09.123Z",
          "txbox-version": "2",
          traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
          "partition-key": "customer-1",
          "tenant-id": "acme",
          "x-origin": "test",
        },
        partitionKey: "customer-1",
        tenantId: "acme",
        attempt: 1,
        redelivered: false,
      })
      const queue = await admin.checkQueue(`txbox.${consumer}`)
      expect(queue.messageCount).toBe(0)
    })
  }

  for (const mode of modes) {
    // Batched, the two events share a message: the retried one goes alone to the delay queue.
    test(`${mode.name}: Retry brings a message back after about the delay as attempt 2, without blocking the message behind it`, async () => {
      const exchange = freshExchange()
      const consumer = uniqueName("retry")
      track(consumer)
      const log: Array<{ readonly id: string; readonly attempt: number; readonly at: number }> = []
      const delayMs = 1000

      await run(
        { ...consumerConfig(exchange), ...mode.options },
        Effect.gen(function* () {
          const transport = yield* Transport
          // prefetch 1: if the retry held its slot while waiting, the second message would wait too.
          yield* transport.subscribe({ consumer, types: ["orders.#"], prefetch: 1 }, (delivery) =>
            Effect.sync((): DeliveryDecision => {
              log.push({ id: delivery.messageId!, attempt: delivery.attempt, at: Date.now() })
              return delivery.messageId === message(1).id && delivery.attempt === 1
                ? { _tag: "Retry", delayMs }
                : { _tag: "Ack" }
            }),
          )
          yield* transport.publish([message(1), message(2)])
          yield* Effect.promise(() => eventually(() => expect(log).toHaveLength(3)))
        }),
      )

      const [first, second, third] = log
      expect(first).toMatchObject({ id: message(1).id, attempt: 1 })
      expect(second).toMatchObject({ id: message(2).id, attempt: 1 })
      expect(third).toMatchObject({ id: message(1).id, attempt: 2 })
      expect(second!.at - first!.at).toBeLessThan(delayMs / 2)
      const delay = third!.at - first!.at
      expect(delay).toBeGreaterThanOrEqual(delayMs - 50)
      expect(delay).toBeLessThan(delayMs + 1500)
      await eventually(async () => expect(await readyCount(`txbox.${consumer}`)).toBe(0))
      expect(await readyCount(`txbox.${consumer}.delay.1`)).toBe(0)
    })
  }

  test("closing the subscription's scope waits for the handler in flight, which is then acked", async () => {
    const exchange = freshExchange()
    const consumer = uniqueName("close")
    track(consumer)
    let finished = false

    const closedAfterMs = await run(
      consumerConfig(exchange),
      Effect.gen(function* () {
        const transport = yield* Transport
        const started = yield* Deferred.make<void>()
        const scope = yield* Scope.make()
        yield* transport
          .subscribe({ consumer, types: ["orders.#"], prefetch: 5 }, () =>
            Effect.gen(function* () {
              yield* Deferred.succeed(started, undefined)
              yield* Effect.sleep(Duration.millis(800))
              finished = true
              return { _tag: "Ack" } as const
            }),
          )
          .pipe(Scope.provide(scope))
        yield* transport.publish([message(1)])
        yield* Deferred.await(started)
        const closing = Date.now()
        yield* Scope.close(scope, Exit.void)
        return Date.now() - closing
      }),
    )

    expect(finished).toBe(true)
    expect(closedAfterMs).toBeGreaterThanOrEqual(600)
    // Acked before its channel closed: nothing went back to the queue.
    await Bun.sleep(200)
    expect(await readyCount(`txbox.${consumer}`)).toBe(0)
  })

  test("a subscription resumes after the connection comes back", async () => {
    const exchange = freshExchange()
    const consumer = uniqueName("resume")
    track(consumer)
    const target = new URL(amqpUrl())
    const proxy = await startTcpProxy(target.hostname, Number(target.port || 5672))
    const seen: string[] = []
    try {
      await run(
        {
          url: proxy.urlFor(amqpUrl()),
          exchange,
          reconnect: { initialDelay: "50 millis", maxDelay: "200 millis" },
        },
        Effect.gen(function* () {
          const transport = yield* Transport
          yield* transport.subscribe({ consumer, types: ["orders.#"], prefetch: 10 }, (delivery) =>
            Effect.sync(() => {
              seen.push(delivery.messageId!)
              return { _tag: "Ack" } as const
            }),
          )
          proxy.block()
          yield* Effect.sleep(Duration.millis(200))
          proxy.unblock()
          // Published by a plain client, so only the resumed consumer can explain its arrival.
          yield* Effect.promise(() =>
            eventually(async () => {
              expect(await admin.checkQueue(`txbox.${consumer}`)).toMatchObject({ consumerCount: 1 })
            }),
          )
          admin.publish(exchange, "orders.order-placed", Buffer.from("{}"), { messageId: "after-reconnect" })
          yield* Effect.promise(() => eventually(() => expect(seen).toContain("after-reconnect")))
        }),
      )
    } finally {
      await proxy.close()
    }
  })
})
