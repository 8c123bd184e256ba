// The hand-written outbox relay (bench/cost.ts's baseline; tables in hand.ts): one loop, one
// connection. Each cycle, in one transaction: take up to 200 unsent rows (oldest first, SKIP LOCKED
// so several relay processes share the table), publish them on a confirm channel (persistent,
// mandatory), wait for the broker's confirms, mark them sent, commit. A full batch goes again at
// once, else it sleeps 50 ms (polling, no LISTEN). Any failure, an unroutable message (`return`)
// included, rolls the batch back; it is published again on the next try.
//
// Bench protocol: prints {"event":"ready"} once connected, starts its loop on a "go" line, prints
// {"event":"stats","published":n,"failed":n} every STATS_MS; SIGTERM or "stop" ends it.
// env: DB_URL, AMQP_URL, EXCHANGE, STATS_MS (default 1000)
import amqp from "amqplib"
import pg from "pg"
import { emit, env, onCommands, sleep } from "./childIo.ts"
import { warmPool } from "./hand.ts"

const BATCH = 200
const IDLE_MS = 50
const exchange = env("EXCHANGE")

const pool = new pg.Pool({ connectionString: env("DB_URL"), max: 1 })
const connection = await amqp.connect(env("AMQP_URL"))
const channel = await connection.createConfirmChannel()
await channel.assertExchange(exchange, "topic", { durable: true })
let returned = 0
channel.on("return", () => {
  returned++
})

let published = 0
let failed = 0

/** One cycle; returns the rows it published. */
const relayBatch = async (): Promise<number> => {
  const client = await pool.connect()
  let broken: Error | undefined
  try {
    await client.query("BEGIN")
    const { rows } = await client.query<{ id: string; type: string; payload: unknown }>(
      `SELECT id, type, payload FROM hand.outbox WHERE sent_at IS NULL
       ORDER BY created_at LIMIT ${BATCH} FOR UPDATE SKIP LOCKED`,
    )
    if (rows.length > 0) {
      const returnedBefore = returned
      for (const row of rows) {
        channel.publish(exchange, row.type, Buffer.from(JSON.stringify(row.payload)), {
          persistent: true,
          mandatory: true,
          messageId: row.id,
          type: row.type,
          contentType: "application/json",
        })
      }
      // A basic.return arrives before the basic.ack of the same message.
      await channel.waitForConfirms()
      if (returned !== returnedBefore) throw new Error(`${returned - returnedBefore} messages unroutable`)
      await client.query("UPDATE hand.outbox SET sent_at = now() WHERE id = ANY($1)", [rows.map((r) => r.id)])
    }
    await client.query("COMMIT")
    published += rows.length
    return rows.length
  } catch (error) {
    await client.query("ROLLBACK").catch((e: Error) => {
      broken = e
    })
    throw error
  } finally {
    client.release(broken)
  }
}

let stopping = false
let loop: Promise<void> | undefined
const run = async () => {
  while (!stopping) {
    try {
      if ((await relayBatch()) < BATCH) await sleep(IDLE_MS)
    } catch (error) {
      failed++
      console.error(`hand relay: batch failed: ${error instanceof Error ? error.message : error}`)
      await sleep(1000)
    }
  }
}

const report = (event: string) => emit({ event, published, failed })
let timer: ReturnType<typeof setInterval> | undefined
let stopped: Promise<void> | undefined
const stop = () => {
  stopped ??= (async () => {
    stopping = true
    clearInterval(timer)
    await loop
    report("stopped")
    await channel.close().catch(() => {})
    await connection.close().catch(() => {})
    await pool.end().catch(() => {})
    process.exit(0)
  })()
  return stopped
}
onCommands((line) => {
  if (line === "go" && loop === undefined) {
    loop = run()
    report("stats")
    timer = setInterval(() => report("stats"), Number(env("STATS_MS", "1000")))
  }
}, stop)
await warmPool(pool, 1)
report("ready")
