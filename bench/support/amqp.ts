// Plain amqplib on the bench's side of the broker: sink queues, the raw publish ceiling, queue
// pre-fills and the raw consume ceiling. No txbox code runs here except the wire encoding, so the
// ceilings publish byte-for-byte what the relay publishes.
import { randomBytes } from "node:crypto"
import amqp, { type ConfirmChannel, type Options } from "amqplib"
import { uuidv7 } from "../../src/core/uuid.ts"
import type { OutgoingMessage } from "../../src/ports/Transport.ts"
import { BATCH_CONTENT_TYPE } from "../../src/transport/amqp/batch.ts"
import { encodeMessage } from "../../src/transport/amqp/wire.ts"
import { BENCH_TYPE } from "./db.ts"
import { makeBody } from "./payload.ts"

export type QueueType = "classic" | "quorum"

export const uniqueName = (prefix: string): string =>
  `${prefix}-${Date.now().toString(36)}-${randomBytes(3).toString("hex")}`

export interface Encoded {
  readonly routingKey: string
  readonly content: Buffer
  readonly options: Options.Publish
}

/** Message `serial` exactly as the relay would publish it: CloudEvents headers, persistent, mandatory. */
export const encodeBench = (serial: number, body = makeBody(serial)): Encoded => {
  const message: OutgoingMessage = {
    id: uuidv7(),
    type: BENCH_TYPE,
    version: 1,
    routingKey: BENCH_TYPE,
    body,
    headers: {},
    occurredAt: new Date(),
    partitionKey: null,
    tenantId: null,
  }
  const encoded = encodeMessage(message, "txbox")
  if (encoded._tag !== "Encoded") throw new Error(encoded.error)
  return encoded.message
}

export interface Sink {
  readonly exchange: string
  readonly queue: string
  /** Messages ready in the queue now (a batch message counts once). */
  depth(): Promise<number>
  /** Events in the queue: takes every message off it, counting a batch message's events. */
  events(): Promise<number>
  /** Deletes the queue (its messages with it) and the exchange. */
  close(): Promise<void>
}

/**
 * A durable topic exchange with one queue of `queueType` bound to everything, and nobody
 * consuming: the benches measure publishing, then delete the queue ("purge between runs"), so no
 * consumer competes with the relay for the two cores.
 */
export const declareSink = async (url: string, queueType: QueueType, prefix = "bench"): Promise<Sink> => {
  const exchange = uniqueName(`${prefix}.x`)
  const queue = uniqueName(`${prefix}.${queueType}`)
  const connection = await amqp.connect(url)
  const channel = await connection.createChannel()
  await channel.assertExchange(exchange, "topic", { durable: true })
  await channel.assertQueue(queue, { durable: true, arguments: { "x-queue-type": queueType } })
  await channel.bindQueue(queue, exchange, "#")
  return {
    exchange,
    queue,
    depth: async () => (await channel.checkQueue(queue)).messageCount,
    events: async () => {
      let events = 0
      for (let message = await channel.get(queue, { noAck: true }); message !== false; ) {
        events +=
          message.properties.contentType === BATCH_CONTENT_TYPE
            ? (JSON.parse(message.content.toString("utf8")) as unknown[]).length
            : 1
        message = await channel.get(queue, { noAck: true })
      }
      return events
    },
    close: async () => {
      await channel.deleteQueue(queue).catch(() => {})
      await channel.deleteExchange(exchange).catch(() => {})
      await connection.close().catch(() => {})
    },
  }
}

export interface PublishRun {
  readonly messages: number
  readonly seconds: number
  readonly rate: number
  readonly nacked: number
}

/**
 * The raw ceiling: `channels` amqplib confirm channels on one connection, each keeping `window`
 * messages unconfirmed, refilling from each confirm callback, honouring `drain`, and publishing its
 * share of `count`. Messages are encoded as they go (any publisher pays that), from bodies built
 * beforehand (the relay gets its bodies from the database). `properties` replaces txbox's message
 * properties (e.g. bare ones, to price the wire format).
 */
export const rawPublish = async (
  url: string,
  exchange: string,
  count: number,
  window: number,
  channels = 1,
  properties?: (message: Encoded) => Options.Publish,
): Promise<PublishRun> => {
  const bodies = Array.from({ length: Math.min(count, 10_000) }, (_, i) => makeBody(i))
  const connection = await amqp.connect(url)
  try {
    // The same write buffer the relay's publisher gets (room for the whole window).
    const opened: ConfirmChannel[] = []
    for (let c = 0; c < channels; c++) {
      const channel = await connection.createConfirmChannel({ highWaterMark: Math.max(1024, window) })
      opened.push(channel)
    }
    await opened[0]!.assertExchange(exchange, "topic", { durable: true })
    let nacked = 0
    let next = 0
    const started = performance.now()
    const publishShare = (channel: ConfirmChannel, share: number) =>
      new Promise<void>((resolve, reject) => {
        let sent = 0
        let settled = 0
        let inFlight = 0
        let waitingDrain = false
        if (share === 0) return resolve()
        channel.on("close", () => reject(new Error("channel closed during the raw publish")))
        const onConfirm = (error: unknown) => {
          if (error) nacked++
          inFlight--
          if (++settled === share) resolve()
          else if (!waitingDrain) pump()
        }
        const pump = () => {
          while (sent < share && inFlight < window) {
            const i = next++
            const m = encodeBench(i, bodies[i % bodies.length])
            sent++
            inFlight++
            const options = properties === undefined ? m.options : properties(m)
            if (!channel.publish(exchange, m.routingKey, m.content, options, onConfirm)) {
              waitingDrain = true
              channel.once("drain", () => {
                waitingDrain = false
                pump()
              })
              return
            }
          }
        }
        pump()
      })
    await Promise.all(
      opened.map((channel, c) =>
        publishShare(channel, Math.floor(count / channels) + (c < count % channels ? 1 : 0)),
      ),
    )
    const seconds = (performance.now() - started) / 1000
    for (const channel of opened) {
      channel.removeAllListeners("close")
      await channel.close().catch(() => {})
    }
    return { messages: count, seconds, rate: count / seconds, nacked }
  } finally {
    await connection.close().catch(() => {})
  }
}

/**
 * Declares `queue` (durable, of `queueType`) bound to `exchange` for `routingKey` and publishes
 * `count` bench messages into it with confirms; `encode` builds message `i` (default: encodeBench).
 */
export const prefillQueue = async (
  url: string,
  options: {
    readonly exchange: string
    readonly queue: string
    readonly queueType: QueueType
    readonly count: number
    readonly encode?: (i: number) => Encoded
    /** The queue's arguments; the default is only its type. Pass txbox's for a queue txbox consumes. */
    readonly arguments?: Record<string, unknown>
  },
): Promise<void> => {
  const connection = await amqp.connect(url)
  try {
    const channel = await connection.createConfirmChannel({ highWaterMark: 4096 })
    await channel.assertExchange(options.exchange, "topic", { durable: true })
    await channel.assertQueue(options.queue, {
      durable: true,
      arguments: options.arguments ?? { "x-queue-type": options.queueType },
    })
    await channel.bindQueue(options.queue, options.exchange, BENCH_TYPE)
    const encode = options.encode ?? ((i: number) => encodeBench(i))
    for (let i = 0; i < options.count; i++) {
      const m = encode(i)
      if (!channel.publish(options.exchange, m.routingKey, m.content, m.options)) {
        await new Promise((resolve) => channel.once("drain", resolve))
      }
      // Bound what is unconfirmed, as any sane publisher does.
      if (i % 2000 === 1999) await channel.waitForConfirms()
    }
    await channel.waitForConfirms()
    await channel.close()
  } finally {
    await connection.close().catch(() => {})
  }
}

/** The raw consume ceiling: manual ack of each delivery with `prefetch` unacked, until `count`. */
export const rawConsume = async (
  url: string,
  queue: string,
  count: number,
  prefetch: number,
): Promise<PublishRun> => {
  const connection = await amqp.connect(url)
  try {
    const channel = await connection.createChannel()
    await channel.prefetch(prefetch)
    let received = 0
    const started = performance.now()
    await new Promise<void>((resolve) => {
      void channel.consume(
        queue,
        (message) => {
          if (message === null) return
          // What a consumer does at the least: look at the body, then ack.
          JSON.parse(message.content.toString("utf8"))
          channel.ack(message)
          if (++received === count) resolve()
        },
        { noAck: false },
      )
    })
    const seconds = (performance.now() - started) / 1000
    await channel.close().catch(() => {})
    return { messages: count, seconds, rate: count / seconds, nacked: 0 }
  } finally {
    await connection.close().catch(() => {})
  }
}

/** Deletes what a bench declared (or had txbox declare) on the shared broker. */
export const deleteTopology = async (
  url: string,
  topology: { readonly queues?: ReadonlyArray<string>; readonly exchanges?: ReadonlyArray<string> },
): Promise<void> => {
  const connection = await amqp.connect(url)
  try {
    for (const queue of topology.queues ?? []) {
      // One channel per delete: a failed delete closes its channel.
      const channel = await connection.createChannel()
      await channel.deleteQueue(queue).catch(() => {})
      await channel.close().catch(() => {})
    }
    for (const exchange of topology.exchanges ?? []) {
      const channel = await connection.createChannel()
      await channel.deleteExchange(exchange).catch(() => {})
      await channel.close().catch(() => {})
    }
  } finally {
    await connection.close().catch(() => {})
  }
}

/**
 * A raw consumer that empties `queue` as fast as the broker delivers (noAck), so a long run's
 * queue stays short; for the memory bench, which measures the relay's RSS, not throughput.
 */
export const startDrain = async (
  url: string,
  queue: string,
): Promise<{ received(): number; stop(): Promise<void> }> => {
  const connection = await amqp.connect(url)
  const channel = await connection.createChannel()
  let received = 0
  await channel.consume(
    queue,
    (message) => {
      if (message !== null) received++
    },
    { noAck: true },
  )
  return {
    received: () => received,
    stop: async () => {
      await channel.close().catch(() => {})
      await connection.close().catch(() => {})
    },
  }
}
