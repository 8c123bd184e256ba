// The two outbox processors of the articles in /work/shared/seeds ("scaling the outbox pattern"),
// ported to TypeScript on postgres.js and amqplib as literally as the languages allow, so txbox is
// compared with a known starting point (1,350 msg/s there) and a known good end point (32,500).
//
// Both read `bench.outbox_messages` (the articles' table, see db.ts), deserialize the content and
// serialize it again to publish (as the articles' MassTransit code does), and publish the same
// wire format as txbox (encodeMessage), so only the processing strategy differs.
import amqp, { type ConfirmChannel } from "amqplib"
import postgres from "postgres"
import { encodeMessage } from "../../src/transport/amqp/wire.ts"

interface ArticleRow {
  readonly id: string
  readonly type: string
  readonly content: unknown
  readonly occurred_on_utc?: Date
}

const publishOne = (channel: ConfirmChannel, exchange: string, row: ArticleRow): Promise<void> => {
  const encoded = encodeMessage(
    {
      id: row.id,
      type: row.type,
      version: 1,
      routingKey: row.type,
      // postgres.js has already parsed the jsonb: this is the articles' deserialize + serialize.
      body: JSON.stringify(row.content),
      headers: {},
      occurredAt: row.occurred_on_utc ?? new Date(),
      partitionKey: null,
      tenantId: null,
    },
    "txbox",
  )
  if (encoded._tag !== "Encoded") return Promise.reject(new Error(encoded.error))
  const m = encoded.message
  return new Promise((resolve, reject) => {
    channel.publish(exchange, m.routingKey, m.content, m.options, (error: unknown) =>
      error ? reject(error) : resolve(),
    )
  })
}

export interface BaselineRun {
  readonly processed: number
  readonly seconds: number
  readonly rate: number
  readonly batches: number
}

export interface BaselineOptions {
  readonly dbUrl: string
  readonly amqpUrl: string
  readonly exchange: string
  /** Stop claiming after this long (the article ran each variant for a fixed minute). */
  readonly maxSeconds: number
  readonly batchSize?: number
}

/**
 * The article's starting point: one transaction per batch; SELECT * of 1000 unprocessed rows by
 * time (no index: a scan and a sort); publish each message and wait for its confirm; UPDATE each
 * row on its own; commit.
 */
export const runNaive = async (o: BaselineOptions): Promise<BaselineRun> => {
  const sql = postgres(o.dbUrl, { max: 1, onnotice: () => {} })
  const connection = await amqp.connect(o.amqpUrl)
  try {
    const channel = await connection.createConfirmChannel()
    await channel.assertExchange(o.exchange, "topic", { durable: true })
    const limit = o.batchSize ?? 1000
    let processed = 0
    let batches = 0
    const started = performance.now()
    const deadline = started + o.maxSeconds * 1000
    while (performance.now() < deadline) {
      const count = await sql.begin(async (tx) => {
        const rows = await tx<ArticleRow[]>`
          SELECT * FROM bench.outbox_messages
          WHERE processed_on_utc IS NULL
          ORDER BY occurred_on_utc LIMIT ${limit}`
        for (const row of rows) {
          try {
            await publishOne(channel, o.exchange, row)
            await tx`UPDATE bench.outbox_messages SET processed_on_utc = ${new Date()} WHERE id = ${row.id}`
          } catch (error) {
            await tx`UPDATE bench.outbox_messages SET processed_on_utc = ${new Date()}, error = ${String(error)} WHERE id = ${row.id}`
          }
        }
        return rows.length
      })
      if (count === 0) break
      processed += count
      batches++
    }
    const seconds = (performance.now() - started) / 1000
    return { processed, seconds, rate: processed / seconds, batches }
  } finally {
    await connection.close().catch(() => {})
    await sql.end({ timeout: 5 })
  }
}

/**
 * The sequel's end point: the covering partial index (created with the table), FOR UPDATE SKIP
 * LOCKED, the whole batch published at once with the confirms awaited together (Task.WhenAll),
 * one UPDATE ... FROM (VALUES ...) per batch, and `workers` (5) processors in parallel, each with
 * its own connection, transaction and confirm channel.
 */
export const runOptimized = async (
  o: BaselineOptions & { readonly workers?: number },
): Promise<BaselineRun> => {
  const workers = o.workers ?? 5
  const sql = postgres(o.dbUrl, { max: workers, onnotice: () => {} })
  const connection = await amqp.connect(o.amqpUrl)
  try {
    const limit = o.batchSize ?? 1000
    const channels = await Promise.all(
      Array.from({ length: workers }, async () => {
        const channel = await connection.createConfirmChannel({ highWaterMark: Math.max(1024, limit) })
        await channel.assertExchange(o.exchange, "topic", { durable: true })
        return channel
      }),
    )
    let processed = 0
    let batches = 0
    const started = performance.now()
    const deadline = started + o.maxSeconds * 1000
    const worker = async (channel: ConfirmChannel) => {
      while (performance.now() < deadline) {
        const count = await sql.begin(async (tx) => {
          const rows = await tx<ArticleRow[]>`
            SELECT id, type, content FROM bench.outbox_messages
            WHERE processed_on_utc IS NULL
            ORDER BY occurred_on_utc LIMIT ${limit}
            FOR UPDATE SKIP LOCKED`
          if (rows.length === 0) return 0
          const updates = await Promise.all(
            rows.map((row) =>
              publishOne(channel, o.exchange, row).then(
                () => ({ id: row.id, at: new Date(), error: null as string | null }),
                (error: unknown) => ({ id: row.id, at: new Date(), error: String(error) }),
              ),
            ),
          )
          const params: Array<string | Date | null> = []
          const tuples = updates.map((u, i) => {
            params.push(u.id, u.at, u.error)
            return `($${3 * i + 1}::uuid, $${3 * i + 2}::timestamptz, $${3 * i + 3}::text)`
          })
          await tx.unsafe(
            `UPDATE bench.outbox_messages SET processed_on_utc = v.processed_on_utc, error = v.error
             FROM (VALUES ${tuples.join(", ")}) AS v(id, processed_on_utc, error)
             WHERE outbox_messages.id = v.id`,
            params,
          )
          return rows.length
        })
        if (count === 0) break
        processed += count
        batches++
      }
    }
    await Promise.all(channels.map(worker))
    const seconds = (performance.now() - started) / 1000
    for (const channel of channels) await channel.close().catch(() => {})
    return { processed, seconds, rate: processed / seconds, batches }
  } finally {
    await connection.close().catch(() => {})
    await sql.end({ timeout: 5 })
  }
}
