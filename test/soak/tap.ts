// The duplicate injector: a plain amqplib queue bound to the run's exchange keeps the latest
// messages exactly as the broker routed them; `republish` sends a sample of them to the exchange
// again with the same body and properties (messageId included), so the consumers' queue gets
// real broker-level duplicates of messages it has already been delivered. With a cluster's URLs
// each connect takes the next node, so a node down costs one refused connect.
import amqp from "amqplib"

interface Captured {
  readonly routingKey: string
  readonly content: Buffer
  readonly properties: amqp.MessageProperties
}

const KEEP = 5000

/** The publish options that reproduce a delivered message's properties (amqplib's names are the same). */
const publishOptions = (p: amqp.MessageProperties): amqp.Options.Publish => {
  const options: Record<string, unknown> = {}
  for (const [key, value] of Object.entries(p))
    if (value !== undefined && value !== null) options[key] = value
  return options as amqp.Options.Publish
}

export class Tap {
  private readonly buffer: Captured[] = []
  private next = 0
  private connection: amqp.ChannelModel | undefined
  private closed = false
  private reconnecting = false
  /** Messages seen since the start. */
  seen = 0
  private readonly urls: ReadonlyArray<string>
  private nextUrl = 0
  private readonly exchange: string
  private readonly random: () => number

  constructor(urls: ReadonlyArray<string>, exchange: string, random: () => number) {
    if (urls.length === 0) throw new Error("Tap: no broker URL")
    this.urls = urls
    this.exchange = exchange
    this.random = random
  }

  /** Connects now; after a lost connection (the faults cut it) it reconnects every second. */
  async start(): Promise<void> {
    await this.connect()
  }

  /** A connection to the first URL, from the one after the last used, that takes one. */
  private async open(): Promise<amqp.ChannelModel> {
    let last: unknown
    for (let i = 0; i < this.urls.length; i++) {
      const url = this.urls[this.nextUrl]!
      this.nextUrl = (this.nextUrl + 1) % this.urls.length
      try {
        return await amqp.connect(url)
      } catch (error) {
        last = error
      }
    }
    throw last
  }

  private async connect(): Promise<void> {
    const connection = await this.open()
    try {
      connection.on("error", () => {})
      connection.on("close", () => {
        this.connection = undefined
        this.reconnect()
      })
      const channel = await connection.createChannel()
      channel.on("error", () => {})
      // A channel closed alone (its queue deleted under it) would stop the tap: start over.
      channel.on("close", () => void connection.close().catch(() => {}))
      await channel.assertExchange(this.exchange, "topic", { durable: true })
      const { queue } = await channel.assertQueue("", { exclusive: true, autoDelete: true })
      await channel.bindQueue(queue, this.exchange, "#")
      await channel.consume(
        queue,
        (msg) => {
          if (msg === null) return
          this.seen++
          const captured = {
            routingKey: msg.fields.routingKey,
            content: msg.content,
            properties: msg.properties,
          }
          if (this.buffer.length < KEEP) this.buffer.push(captured)
          else this.buffer[this.next] = captured
          this.next = (this.next + 1) % KEEP
        },
        { noAck: true },
      )
      this.connection = connection
    } catch (error) {
      await connection.close().catch(() => {})
      throw error
    }
  }

  private reconnect(): void {
    if (this.closed || this.reconnecting) return
    this.reconnecting = true
    void (async () => {
      while (!this.closed) {
        await new Promise((resolve) => setTimeout(resolve, 1000))
        if (this.closed) break
        try {
          await this.connect()
          break
        } catch {}
      }
      this.reconnecting = false
    })()
  }

  /**
   * Publishes `count` captured messages again (a random sample, without repeats), with publisher
   * confirms; resolves with their message ids. Empty when nothing was captured yet.
   */
  async republish(count: number): Promise<string[]> {
    const pool = [...this.buffer]
    const sample: Captured[] = []
    while (sample.length < count && pool.length > 0) {
      const [picked] = pool.splice(Math.floor(this.random() * pool.length), 1)
      if (picked) sample.push(picked)
    }
    if (sample.length === 0) return []
    const connection = await this.open()
    try {
      connection.on("error", () => {})
      const channel = await connection.createConfirmChannel()
      channel.on("error", () => {})
      for (const m of sample)
        channel.publish(this.exchange, m.routingKey, m.content, publishOptions(m.properties))
      await channel.waitForConfirms()
      await channel.close()
    } finally {
      await connection.close().catch(() => {})
    }
    return sample.map((m) => String(m.properties.messageId))
  }

  async close(): Promise<void> {
    this.closed = true
    await this.connection?.close().catch(() => {})
  }
}
