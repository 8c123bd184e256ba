// A plain amqplib consumer: what any service without txbox would see on the exchange.
import amqp from "amqplib"

export interface Collected {
  readonly messages: amqp.ConsumeMessage[]
  /** Deliveries per message id: 1 for each message, more for duplicates. */
  readonly counts: Map<string, number>
  readonly close: () => Promise<void>
}

/** Binds a fresh exclusive queue to `exchange` with `bindingKey` and records everything it receives. */
export const collect = async (url: string, exchange: string, bindingKey = "#"): Promise<Collected> => {
  const connection = await amqp.connect(url)
  const channel = await connection.createChannel()
  await channel.assertExchange(exchange, "topic", { durable: true })
  const { queue } = await channel.assertQueue("", { exclusive: true })
  await channel.bindQueue(queue, exchange, bindingKey)
  const messages: amqp.ConsumeMessage[] = []
  const counts = new Map<string, number>()
  await channel.consume(
    queue,
    (msg) => {
      if (!msg) return
      messages.push(msg)
      const id = String(msg.properties.messageId)
      counts.set(id, (counts.get(id) ?? 0) + 1)
    },
    { noAck: true },
  )
  return {
    messages,
    counts,
    close: async () => {
      await channel.close().catch(() => {})
      await connection.close().catch(() => {})
    },
  }
}
