// Relay throughput: txbox draining a pre-filled outbox, over a batch size × workers matrix, into a
// classic durable and a quorum queue, next to the raw amqplib ceiling and the two processors of
// the "scaling the outbox pattern" articles (naive and optimized).
//
//   bun bench/relay.ts [--quick] [--backlog 50000] [--headline 200000] [--ceiling 100000]
//                      [--batches 100,1000,5000] [--workers 1,2,4] [--queues classic,quorum]
//                      [--windows 500,2000,5000] [--channels 1,2,4,8]
//   bun bench/relay.ts --source wal [--quick] [--backlog 40000] [--queues classic,quorum]
//     (the polling relay and the WAL relay on one backlog: support/relayWal.ts)
import { declareSink, type QueueType, rawPublish } from "./support/amqp.ts"
import { runNaive, runOptimized } from "./support/baselines.ts"
import { type CpuUse, cpuMeter, portOf } from "./support/cpu.ts"
import {
  articleProcessed,
  averageBodyBytes,
  createBenchDatabase,
  fillArticleTable,
  fillOutbox,
  outboxStatus,
} from "./support/db.ts"
import { log, main, parseArgs, printTable, round, withServices, writeResult } from "./support/harness.ts"
import { type RelayRun, runRelayInProcess } from "./support/relay.ts"
import { printWalDrain, runWalDrain } from "./support/relayWal.ts"

const args = parseArgs()
const quick = args.quick
const config = {
  /** Rows per matrix cell: 40k keeps the 18-cell matrix within minutes on 2 cores. */
  backlog: args.number("backlog", quick ? 1_000 : 40_000),
  /** Rows the best configuration drains again, per queue type: the headline figure. */
  headline: args.number("headline", quick ? 2_000 : 200_000),
  /** Messages per window for the raw ceiling. */
  ceilingMessages: args.number("ceiling", quick ? 2_000 : 60_000),
  windows: args.list("windows", [500, 2000, 5000]),
  /** Confirm channels the raw ceiling publishes over (each with the window): the best counts. */
  channels: args.list("channels", quick ? [1, 2] : [1, 2, 4, 8]),
  batches: args.list("batches", quick ? [100, 1000] : [100, 1000, 5000]),
  workers: args.list("workers", quick ? [1, 2] : [1, 2, 4]),
  queues: args.string("queues", "classic,quorum").split(",") as QueueType[],
  /** The naive processor runs this long (it would take minutes to drain a big backlog). */
  naiveSeconds: args.number("naive-seconds", quick ? 0.5 : 10),
  naiveBacklog: args.number("naive-backlog", quick ? 200 : 20_000),
  /** The optimized processor drains this backlog (or stops after optimizedSeconds). */
  optimizedBacklog: args.number("optimized-backlog", quick ? 2_000 : 100_000),
  optimizedSeconds: args.number("optimized-seconds", quick ? 10 : 60),
  warmup: args.number("warmup", quick ? 500 : 20_000),
  /** "polling": the matrix below; "wal": the polling relay against the WAL relay (issue #27). */
  source: args.string("source", "polling"),
}
if (config.source !== "polling" && config.source !== "wal")
  throw new Error(`--source: ${config.source} (polling, wal)`)

interface Cell {
  readonly queue: QueueType
  readonly batchSize: number
  readonly workers: number
  readonly backlog: number
  readonly rate: number
  readonly seconds: number
  readonly cpu: CpuUse
  readonly phases: RelayRun["phases"]
}

const cores = (n: number | undefined) => (n === undefined ? undefined : round(n, 2))
const phaseMs = (cell: Cell, name: string) => cell.phases?.[name]?.meanMs

main(() =>
  withServices(async (services) => {
    if (config.source === "wal") {
      const walConfig = {
        amqpUrl: services.amqpUrl,
        queues: config.queues,
        backlog: config.backlog,
        warmup: Math.min(config.warmup, config.backlog),
        batchSize: 1000,
      }
      const cells = await runWalDrain(walConfig)
      printWalDrain(cells, walConfig)
      const summary: Record<string, number> = {}
      for (const cell of cells) summary[`${cell.queue}.${cell.source}.rate`] = round(cell.rate)
      writeResult("relay-wal", args, services, { summary, config: walConfig, results: cells })
      return
    }
    const meter = cpuMeter({
      postgresPort: portOf(services.databaseUrl),
      rabbitPort: portOf(services.amqpUrl),
    })
    const bench = await createBenchDatabase(services.databaseUrl, "relay")
    try {
      const cell = async (queue: QueueType, batchSize: number, workers: number, backlog: number) => {
        await fillOutbox(bench.db, backlog)
        const sink = await declareSink(services.amqpUrl, queue, "bench.relay")
        try {
          const run = await runRelayInProcess({
            dbUrl: bench.url,
            amqpUrl: services.amqpUrl,
            exchange: sink.exchange,
            batchSize,
            workers,
            expected: backlog,
            timeoutMs: 600_000,
            meter,
            phases: true,
          })
          // Count what arrived, from the broker and the table, not from the relay's own stats.
          // Events, not messages: the relay sends a batch's events of one routing key as one message.
          const [depth, status] = await Promise.all([sink.events(), outboxStatus(bench.db)])
          if (status.sent !== backlog || depth !== backlog) {
            throw new Error(
              `cell ${queue}/${batchSize}/${workers}: ${status.sent} rows sent, ${depth} in the queue, expected ${backlog}`,
            )
          }
          const result: Cell = {
            queue,
            batchSize,
            workers,
            backlog,
            rate: run.rate,
            seconds: run.seconds,
            cpu: run.cpu,
            phases: run.phases,
          }
          log(`${queue} batch ${batchSize} × ${workers} workers: ${Math.round(run.rate)} msg/s`)
          return result
        } finally {
          await sink.close()
        }
      }

      // A first drain that is not recorded: JIT and connection warm-up would otherwise go to cell one.
      await fillOutbox(bench.db, Math.max(config.warmup, config.backlog, config.headline))
      const bodyBytes = await averageBodyBytes(bench.db)
      if (config.warmup > 0) await cell(config.queues[0]!, 1000, 1, config.warmup)

      const perQueue: Record<string, unknown> = {}
      const summary: Record<string, number> = { bodyBytes }
      const matrixRows: Array<Array<string | number | undefined>> = []
      const compareRows: Array<Array<string | number | undefined>> = []

      for (const queue of config.queues) {
        const ceiling = []
        for (const channels of config.channels) {
          for (const window of config.windows) {
            const sink = await declareSink(services.amqpUrl, queue, "bench.ceiling")
            try {
              const before = meter.sample()
              const run = await rawPublish(
                services.amqpUrl,
                sink.exchange,
                config.ceilingMessages,
                window,
                channels,
              )
              const cpu = meter.use(before, meter.sample())
              if ((await sink.depth()) !== config.ceilingMessages)
                throw new Error("ceiling: messages missing")
              ceiling.push({
                channels,
                window,
                rate: run.rate,
                seconds: run.seconds,
                nacked: run.nacked,
                cpu,
              })
              log(
                `${queue} raw ceiling, ${channels} channel(s) × window ${window}: ${Math.round(run.rate)} msg/s`,
              )
            } finally {
              await sink.close()
            }
          }
        }
        const bestCeiling = ceiling.reduce((a, b) => (b.rate > a.rate ? b : a))

        const cells: Cell[] = []
        for (const batchSize of config.batches) {
          for (const workers of config.workers)
            cells.push(await cell(queue, batchSize, workers, config.backlog))
        }
        const best = cells.reduce((a, b) => (b.rate > a.rate ? b : a))
        const headline = await cell(queue, best.batchSize, best.workers, config.headline)

        await fillArticleTable(bench.db, config.naiveBacklog, false)
        let sink = await declareSink(services.amqpUrl, queue, "bench.naive")
        let before = meter.sample()
        const naiveRun = await runNaive({
          dbUrl: bench.url,
          amqpUrl: services.amqpUrl,
          exchange: sink.exchange,
          maxSeconds: config.naiveSeconds,
        })
        const naive = { ...naiveRun, cpu: meter.use(before, meter.sample()) }
        if ((await articleProcessed(bench.db)) !== naive.processed) throw new Error("naive: count mismatch")
        await sink.close()
        log(`${queue} naive: ${Math.round(naive.rate)} msg/s`)

        await fillArticleTable(bench.db, config.optimizedBacklog, true)
        sink = await declareSink(services.amqpUrl, queue, "bench.optimized")
        before = meter.sample()
        const optimizedRun = await runOptimized({
          dbUrl: bench.url,
          amqpUrl: services.amqpUrl,
          exchange: sink.exchange,
          maxSeconds: config.optimizedSeconds,
        })
        const optimized = { ...optimizedRun, cpu: meter.use(before, meter.sample()) }
        if ((await sink.depth()) !== optimized.processed) throw new Error("optimized: count mismatch")
        await sink.close()
        log(`${queue} optimized: ${Math.round(optimized.rate)} msg/s`)

        for (const c of cells) {
          matrixRows.push([
            queue,
            c.batchSize,
            c.workers,
            c.backlog,
            Math.round(c.rate),
            cores(c.cpu.bench),
            cores(c.cpu.postgres),
            cores(c.cpu.rabbitmq),
            cores(c.cpu.other),
            phaseMs(c, "Relay.claim"),
            phaseMs(c, "AmqpTransport.publish"),
            phaseMs(c, "Relay.mark"),
          ])
        }
        // CPU per message, all three parties together: what the two cores pay for each message.
        const perMessage = (rate: number, cpu: CpuUse) =>
          cpu.postgres === undefined || cpu.rabbitmq === undefined
            ? undefined
            : round(((cpu.bench + cpu.postgres + cpu.rabbitmq) / rate) * 1e6)
        const row = (what: string, rate: number, cpu: CpuUse, note: string) => [
          queue,
          what,
          Math.round(rate),
          cores(cpu.bench),
          cores(cpu.postgres),
          cores(cpu.rabbitmq),
          cores(cpu.other),
          perMessage(rate, cpu),
          note,
        ]
        compareRows.push(
          row(
            "txbox (headline)",
            headline.rate,
            headline.cpu,
            `batch ${headline.batchSize} × ${headline.workers}, ${headline.backlog.toLocaleString("en-US")} rows`,
          ),
          row(
            "raw ceiling",
            bestCeiling.rate,
            bestCeiling.cpu,
            `${bestCeiling.channels} channel(s) × window ${bestCeiling.window}`,
          ),
          row("naive (article)", naive.rate, naive.cpu, `${naive.processed.toLocaleString("en-US")} rows`),
          row(
            "optimized (sequel)",
            optimized.rate,
            optimized.cpu,
            `5 workers, ${optimized.processed.toLocaleString("en-US")} rows`,
          ),
        )
        const ratios = {
          vsCeiling: headline.rate / bestCeiling.rate,
          vsNaive: headline.rate / naive.rate,
          vsOptimized: headline.rate / optimized.rate,
        }
        Object.assign(summary, {
          [`${queue}.txbox`]: round(headline.rate),
          [`${queue}.ceiling`]: round(bestCeiling.rate),
          [`${queue}.naive`]: round(naive.rate),
          [`${queue}.optimized`]: round(optimized.rate),
          [`${queue}.txboxOverCeiling`]: round(ratios.vsCeiling, 3),
          [`${queue}.txboxOverNaive`]: round(ratios.vsNaive, 2),
          [`${queue}.txboxOverOptimized`]: round(ratios.vsOptimized, 2),
          [`${queue}.bestBatch`]: best.batchSize,
          [`${queue}.bestWorkers`]: best.workers,
        })
        perQueue[queue] = { ceiling, cells, headline, naive, optimized, ratios }
      }

      printTable(
        "Relay matrix: msg/s draining a pre-filled backlog; CPU in cores (2 = the whole box); mean ms per batch",
        [
          "queue",
          "batch",
          "workers",
          "rows",
          "msg/s",
          "relay",
          "pg",
          "rabbit",
          "other",
          "claim",
          "publish",
          "mark",
        ],
        matrixRows,
      )
      printTable(
        "txbox vs the raw ceiling and the articles' processors (CPU in cores; µs cpu/msg = bench + pg + rabbit per message)",
        ["queue", "what", "msg/s", "bench", "pg", "rabbit", "other", "µs cpu/msg", "note"],
        compareRows,
      )
      printTable(
        "Ratios",
        ["queue", "txbox/ceiling", "txbox/naive", "txbox/optimized"],
        config.queues.map((q) => [
          q,
          summary[`${q}.txboxOverCeiling`],
          summary[`${q}.txboxOverNaive`],
          summary[`${q}.txboxOverOptimized`],
        ]),
      )
      writeResult("relay", args, services, { summary, config, results: perQueue })
    } finally {
      await bench.drop()
    }
  }),
)
