// Inbox throughput: a consumer queue pre-filled with N bench messages, drained by a txbox Inbox in
// idempotent mode and in store-then-process mode, and by a raw amqplib consume + ack (the ceiling)
// on the same queue. The handler writes one business row through the inbox's transaction (what
// the goal names: a one-row handler), so the figures are the inbox's own cost plus one
// INSERT.
//
//   bun bench/inbox.ts [--quick] [--messages 50000] [--prefetch 32] [--queue quorum|classic]
//                      [--transactions 4] [--concurrency 4]
import { Effect, Exit, Layer, ManagedRuntime, Scope } from "effect"
import { sql } from "kysely"
import * as Inbox from "../src/Inbox.ts"
import * as PgStore from "../src/storage/drivers/pg/PgStore.ts"
import * as AmqpTransport from "../src/transport/amqp/AmqpTransport.ts"
import { defaults } from "../src/transport/amqp/config.ts"
import { consumerQueueArguments, deadQueueName, queueName } from "../src/transport/amqp/subscriber.ts"
import { deleteTopology, prefillQueue, type QueueType, rawConsume, uniqueName } from "./support/amqp.ts"
import { type CpuUse, cpuMeter, portOf } from "./support/cpu.ts"
import { createBenchDatabase } from "./support/db.ts"
import {
  log,
  main,
  parseArgs,
  printTable,
  round,
  sleep,
  withServices,
  writeResult,
} from "./support/harness.ts"
import { OrderPlaced } from "./support/payload.ts"

const args = parseArgs()
const quick = args.quick
const config = {
  messages: args.number("messages", quick ? 1_000 : 50_000),
  prefetch: args.number("prefetch", 32),
  /** Store-then-process: rows per processor claim (the Inbox default). */
  batchSize: args.number("batch", 100),
  /** Idempotent mode: inbox transactions at once (the Inbox default). */
  transactions: args.number("transactions", 4),
  /** Store-then-process: processor transactions at once (the Inbox default). */
  concurrency: args.number("concurrency", 4),
  queueType: args.string("queue", "quorum") as QueueType,
}

interface Run {
  readonly what: string
  readonly rate: number
  readonly seconds: number
  /** Store-then-process: the consume side alone (stored and acked), before the processor is done. */
  readonly storedRate?: number
  readonly cpu: CpuUse
}

main(() =>
  withServices(async (services) => {
    const meter = cpuMeter({
      postgresPort: portOf(services.databaseUrl),
      rabbitPort: portOf(services.amqpUrl),
    })
    const bench = await createBenchDatabase(services.databaseUrl, "inbox")
    const exchange = uniqueName("bench.inbox")
    const consumer = uniqueName("inbox")
    const queue = queueName(consumer)
    const n = config.messages
    const prefill = async () => {
      const started = performance.now()
      // Declared as txbox declares it, so the inbox's subscription finds it equivalent.
      await prefillQueue(services.amqpUrl, {
        exchange,
        queue,
        queueType: config.queueType,
        count: n,
        arguments: consumerQueueArguments(consumer, {
          queueType: config.queueType,
          deliveryLimit: defaults.deliveryLimit,
        }),
      })
      log(`queue pre-filled with ${n} messages in ${Math.round(performance.now() - started)} ms`)
    }
    const runs: Run[] = []
    await sql`CREATE TABLE orders_seen (id text PRIMARY KEY, total numeric NOT NULL)`.execute(bench.db)
    try {
      await prefill()
      let before = meter.sample()
      const raw = await rawConsume(services.amqpUrl, queue, n, config.prefetch)
      runs.push({
        what: `raw consume + ack (prefetch ${config.prefetch})`,
        rate: raw.rate,
        seconds: raw.seconds,
        cpu: meter.use(before, meter.sample()),
      })
      log(`raw consume: ${Math.round(raw.rate)} msg/s`)

      for (const mode of ["idempotent", "store-then-process"] as const) {
        await sql`TRUNCATE txbox.inbox, orders_seen`.execute(bench.db)
        await prefill()
        const runtime = ManagedRuntime.make(
          Layer.mergeAll(
            PgStore.layer({ url: bench.url }),
            AmqpTransport.layer({
              url: services.amqpUrl,
              exchange,
              queueType: config.queueType,
              failFast: true,
            }),
          ),
        )
        try {
          await runtime.runPromise(Effect.void)
          const scope = await runtime.runPromise(Scope.make())
          before = meter.sample()
          const started = performance.now()
          const handle = await runtime.runPromise(
            Inbox.make({
              consumer,
              mode,
              prefetch: config.prefetch,
              batchSize: config.batchSize,
              transactions: config.transactions,
              processorConcurrency: config.concurrency,
              handlers: [
                Inbox.handler(OrderPlaced, ({ payload, envelope, trx }) =>
                  Effect.promise(() =>
                    sql`INSERT INTO orders_seen (id, total) VALUES (${envelope.id}, ${payload.total})`.execute(
                      trx,
                    ),
                  ),
                ),
              ],
            }).pipe(Scope.provide(scope)),
          )
          let storedAt: number | undefined
          const deadline = started + 600_000
          for (;;) {
            const stats = await runtime.runPromise(handle.stats)
            if (storedAt === undefined && stats.stored >= n) storedAt = performance.now()
            if (stats.processed + stats.duplicates + stats.dead >= n) break
            if (performance.now() > deadline)
              throw new Error(`inbox ${mode}: ${stats.processed}/${n} processed`)
            await sleep(5)
          }
          const cpu = meter.use(before, meter.sample())
          const seconds = (performance.now() - started) / 1000
          await runtime.runPromise(Scope.close(scope, Exit.void))
          const rows = await sql<{ n: string }>`
            SELECT count(*) AS n FROM txbox.inbox WHERE status = 'processed'`.execute(bench.db)
          if (Number(rows.rows[0]?.n) !== n)
            throw new Error(`inbox ${mode}: ${rows.rows[0]?.n} processed rows`)
          runs.push({
            what: `txbox Inbox, ${mode}`,
            rate: n / seconds,
            seconds,
            ...(storedAt === undefined ? {} : { storedRate: n / ((storedAt - started) / 1000) }),
            cpu,
          })
          log(`inbox ${mode}: ${Math.round(n / seconds)} msg/s`)
        } finally {
          await runtime.dispose()
        }
      }

      const ceiling = runs[0]!.rate
      printTable(
        `Inbox throughput, ${n.toLocaleString("en-US")} messages pre-filled in a ${config.queueType} queue, prefetch ${config.prefetch}, one-row handler, ${config.transactions} inbox transactions / ${config.concurrency} processor transactions at once (CPU per message, and in cores)`,
        [
          "consumer",
          "msg/s",
          "of ceiling",
          "stored msg/s",
          "seconds",
          "bench µs/msg",
          "pg µs/msg",
          "bench",
          "pg",
          "rabbit",
          "other",
        ],
        runs.map((r) => [
          r.what,
          Math.round(r.rate),
          round(r.rate / ceiling, 3),
          r.storedRate === undefined ? undefined : Math.round(r.storedRate),
          round(r.seconds, 1),
          round((r.cpu.bench / r.rate) * 1e6),
          r.cpu.postgres === undefined ? undefined : round((r.cpu.postgres / r.rate) * 1e6),
          round(r.cpu.bench, 2),
          r.cpu.postgres === undefined ? undefined : round(r.cpu.postgres, 2),
          r.cpu.rabbitmq === undefined ? undefined : round(r.cpu.rabbitmq, 2),
          r.cpu.other === undefined ? undefined : round(r.cpu.other, 2),
        ]),
      )
      const summary: Record<string, number> = {
        ceiling: round(ceiling),
        idempotent: round(runs[1]!.rate),
        storeThenProcess: round(runs[2]!.rate),
        storeThenProcessStored: round(runs[2]!.storedRate ?? Number.NaN),
        idempotentOverCeiling: round(runs[1]!.rate / ceiling, 3),
        storeThenProcessOverCeiling: round(runs[2]!.rate / ceiling, 3),
      }
      writeResult("inbox", args, services, { summary, config, results: runs })
    } finally {
      await deleteTopology(services.amqpUrl, {
        queues: [queue, deadQueueName(consumer)],
        exchanges: [exchange],
      })
      await bench.drop()
    }
  }),
)
