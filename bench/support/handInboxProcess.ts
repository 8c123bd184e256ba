// The hand-written inbox (bench/cost.ts's baseline; tables in hand.ts): an amqplib consumer on a
// durable quorum queue bound to the exchange, prefetch 32, manual ack, a pool of 4 connections. Per
// delivery, one transaction: the inbox row (message id, consumer) ON CONFLICT DO NOTHING; only if it
// was new, the handler, through the same transaction; commit; then ack. A failure rolls back and
// requeues the message. The handler is the one of inboxProcess.ts with RECORD=1: one row into
// bench.handled.
//
// Bench protocol: prints {"event":"ready"} once consuming, {"event":"stats","processed":n,
// "duplicates":n,"failed":n} every STATS_MS; SIGTERM or "stop" ends it.
// env: DB_URL, AMQP_URL, EXCHANGE, QUEUE (also the consumer's name), STATS_MS (default 1000)
import amqp, { type ConsumeMessage } from "amqplib"
import pg from "pg"
import { emit, env, onCommands } from "./childIo.ts"
import { BENCH_TYPE } from "./db.ts"
import { HANDLED_INSERT, warmPool } from "./hand.ts"
import type { OrderPlaced } from "./payload.ts"

const PREFETCH = 32
const CONNECTIONS = 4
const exchange = env("EXCHANGE")
const queue = env("QUEUE")

const pool = new pg.Pool({ connectionString: env("DB_URL"), max: CONNECTIONS })
const connection = await amqp.connect(env("AMQP_URL"))
const channel = await connection.createChannel()
await channel.assertExchange(exchange, "topic", { durable: true })
await channel.assertQueue(queue, { durable: true, arguments: { "x-queue-type": "quorum" } })
await channel.bindQueue(queue, exchange, BENCH_TYPE)
await channel.prefetch(PREFETCH)

/** The business handler: its effect commits with the inbox row. */
const handle = async (client: pg.PoolClient, payload: OrderPlaced): Promise<void> => {
  await client.query(HANDLED_INSERT, [payload.serial, null, null])
}

let processed = 0
let duplicates = 0
let failed = 0
let inFlight = 0

const onMessage = async (message: ConsumeMessage): Promise<void> => {
  inFlight++
  const client = await pool.connect()
  let broken: Error | undefined
  try {
    await client.query("BEGIN")
    const inserted = await client.query(
      "INSERT INTO hand.inbox (message_id, consumer) VALUES ($1, $2) ON CONFLICT DO NOTHING",
      [message.properties.messageId, queue],
    )
    if (inserted.rowCount === 1) await handle(client, JSON.parse(message.content.toString("utf8")))
    await client.query("COMMIT")
    channel.ack(message)
    if (inserted.rowCount === 1) processed++
    else duplicates++
  } catch (error) {
    failed++
    console.error(`hand inbox: ${error instanceof Error ? error.message : error}`)
    await client.query("ROLLBACK").catch((e: Error) => {
      broken = e
    })
    channel.nack(message, false, true)
  } finally {
    client.release(broken)
    inFlight--
  }
}

const report = (event: string) => emit({ event, processed, duplicates, failed })
let timer: ReturnType<typeof setInterval> | undefined
let stopped: Promise<void> | undefined
const stop = () => {
  stopped ??= (async () => {
    clearInterval(timer)
    await channel.cancel(tag).catch(() => {})
    while (inFlight > 0) await new Promise((resolve) => setTimeout(resolve, 10))
    await channel.close().catch(() => {})
    await connection.close().catch(() => {})
    await pool.end().catch(() => {})
    process.exit(0)
  })()
  return stopped
}
await warmPool(pool, CONNECTIONS)
const { consumerTag: tag } = await channel.consume(
  queue,
  (message) => {
    if (message !== null) void onMessage(message)
  },
  { noAck: false },
)
onCommands(() => {}, stop)
report("ready")
timer = setInterval(() => report("stats"), Number(env("STATS_MS", "1000")))
