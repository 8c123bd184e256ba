// A plain amqplib consumer: what any service without txbox would see on the exchange.
import amqp from "amqplib"
import { BATCH_CONTENT_TYPE } from "../../src/transport/amqp/batch.ts"

export interface Collected {
  /** What arrived on the wire, batch messages as they came. */
  readonly messages: amqp.ConsumeMessage[]
  /**
   * One message per event: a batch message (the relay's default, docs/wire-format.md) taken apart
   * into the binary-mode message each of its events would have been (attributes as
   * `cloudEvents:<name>` application properties, `txboxheaders` as the others, the data as the
   * body); any other message as it came. For tests of what events carry; the batch format itself
   * is test/integration/amqp-transport.test.ts's.
   */
  readonly events: amqp.ConsumeMessage[]
  /** Deliveries per event id: 1 for each event, more for duplicates. */
  readonly counts: Map<string, number>
  readonly close: () => Promise<void>
}

/** The events of `msg`, each as its own binary-mode message. */
export const eventsOf = (msg: amqp.ConsumeMessage): amqp.ConsumeMessage[] => {
  if (msg.properties.contentType !== BATCH_CONTENT_TYPE) return [msg]
  const events = JSON.parse(msg.content.toString("utf8")) as Array<Record<string, unknown>>
  return events.map((event) => {
    const { data, datacontenttype, txboxheaders, txboxversion, ...attributes } = event
    const headers: Record<string, unknown> = { ...msg.properties.headers }
    for (const [name, value] of Object.entries(attributes)) headers[`cloudEvents:${name}`] = value
    Object.assign(headers, typeof txboxheaders === "string" ? JSON.parse(txboxheaders) : {})
    headers["txbox-version"] = txboxversion
    return {
      ...msg,
      content: Buffer.from(JSON.stringify(data)),
      properties: {
        ...msg.properties,
        contentType: datacontenttype,
        messageId: event.id,
        type: event.type,
        headers,
      },
    }
  })
}

/** Binds a fresh exclusive queue to `exchange` with `bindingKey` and records everything it receives. */
export const collect = async (url: string, exchange: string, bindingKey = "#"): Promise<Collected> => {
  const connection = await amqp.connect(url)
  const channel = await connection.createChannel()
  await channel.assertExchange(exchange, "topic", { durable: true })
  const { queue } = await channel.assertQueue("", { exclusive: true })
  await channel.bindQueue(queue, exchange, bindingKey)
  const messages: amqp.ConsumeMessage[] = []
  const events: amqp.ConsumeMessage[] = []
  const counts = new Map<string, number>()
  await channel.consume(
    queue,
    (msg) => {
      if (!msg) return
      messages.push(msg)
      for (const event of eventsOf(msg)) {
        events.push(event)
        const id = String(event.properties.messageId)
        counts.set(id, (counts.get(id) ?? 0) + 1)
      }
    },
    { noAck: true },
  )
  return {
    messages,
    events,
    counts,
    close: async () => {
      await channel.close().catch(() => {})
      await connection.close().catch(() => {})
    },
  }
}
