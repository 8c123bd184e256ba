// Peak RSS of a relay draining a large backlog (1,000,000 rows by default). The relay runs in a
// process of its own (support/relayProcess.ts) and samples its own RSS every second; a raw
// consumer here keeps the queue short, so the broker stays in its normal regime for the whole run.
//
//   bun bench/memory.ts [--quick] [--backlog 1000000] [--batch 1000] [--workers 2] [--queue quorum]
import { declareSink, type QueueType, startDrain } from "./support/amqp.ts"
import { spawnRelay } from "./support/children.ts"
import { cpuMeter, portOf } from "./support/cpu.ts"
import { createBenchDatabase, generateOutbox, outboxStatus } from "./support/db.ts"
import {
  log,
  main,
  median,
  parseArgs,
  printTable,
  round,
  withServices,
  writeResult,
} from "./support/harness.ts"

const args = parseArgs()
const quick = args.quick
const config = {
  backlog: args.number("backlog", quick ? 20_000 : 1_000_000),
  batchSize: args.number("batch", 1000),
  workers: args.number("workers", 2),
  queueType: args.string("queue", "quorum") as QueueType,
  /** Samples before this many seconds are the warm-up (JIT, pools, first batches). */
  warmupSeconds: args.number("warmup", quick ? 1 : 10),
}

const mib = (bytes: number) => round(bytes / 2 ** 20, 1)

main(() =>
  withServices(async (services) => {
    const meter = cpuMeter({
      postgresPort: portOf(services.databaseUrl),
      rabbitPort: portOf(services.amqpUrl),
    })
    const bench = await createBenchDatabase(services.databaseUrl, "memory")
    const sink = await declareSink(services.amqpUrl, config.queueType, "bench.memory")
    const drain = await startDrain(services.amqpUrl, sink.queue)
    try {
      let started = performance.now()
      await generateOutbox(bench.db, config.backlog)
      log(`${config.backlog} rows generated in ${Math.round((performance.now() - started) / 1000)} s`)

      const relay = spawnRelay({
        dbUrl: bench.url,
        amqpUrl: services.amqpUrl,
        exchange: sink.exchange,
        batchSize: config.batchSize,
        workers: config.workers,
        statsMs: 1000,
      })
      await relay.ready
      const idleRss = relay.latest()!.rss
      const before = meter.sample([relay.pid])
      started = performance.now()
      relay.send("go")
      await relay.waitFor(
        `${config.backlog} messages published`,
        (line) => line.published + line.dead >= config.backlog,
        30 * 60_000,
      )
      const seconds = (performance.now() - started) / 1000
      const cpu = meter.use(before, meter.sample([relay.pid]))
      await relay.stop()
      const status = await outboxStatus(bench.db)
      if (status.sent !== config.backlog) throw new Error(`${status.sent} rows sent of ${config.backlog}`)

      const samples = relay.lines.filter((l) => l.event === "stats")
      const rss = samples.map((s) => s.rss)
      const afterWarmup = samples.find((s) => s.t >= config.warmupSeconds) ?? samples.at(-1)!
      const peak = Math.max(...rss)
      const result = {
        seconds,
        rate: config.backlog / seconds,
        idleRssMiB: mib(idleRss),
        warmupRssMiB: mib(afterWarmup.rss),
        peakRssMiB: mib(peak),
        medianRssMiB: mib(median(rss)),
        growthMiB: mib(peak - afterWarmup.rss),
        peakHeapMiB: mib(Math.max(...samples.map((s) => s.heapUsed))),
        relayCpuCores: cpu.perChild[0],
        cpu,
        series: samples.map((s) => ({
          t: round(s.t, 1),
          published: s.published,
          rssMiB: mib(s.rss),
          heapMiB: mib(s.heapUsed),
        })),
      }
      // Ten evenly spaced samples are enough to see a trend in the terminal; the JSON has them all.
      const step = Math.max(1, Math.floor(samples.length / 10))
      printTable(
        `Relay RSS while draining ${config.backlog.toLocaleString("en-US")} rows (batch ${config.batchSize} × ${config.workers} workers, ${config.queueType} queue), sampled every second in the relay's process`,
        ["t (s)", "published", "RSS MiB", "heap MiB"],
        result.series
          .filter((_, i) => i % step === 0 || i === samples.length - 1)
          .map((s) => [s.t, s.published, s.rssMiB, s.heapMiB]),
      )
      printTable(
        "Summary",
        [
          "msg/s",
          "idle MiB",
          `after ${config.warmupSeconds} s MiB`,
          "median MiB",
          "peak MiB",
          "growth MiB",
          "peak heap MiB",
        ],
        [
          [
            Math.round(result.rate),
            result.idleRssMiB,
            result.warmupRssMiB,
            result.medianRssMiB,
            result.peakRssMiB,
            result.growthMiB,
            result.peakHeapMiB,
          ],
        ],
      )
      writeResult("memory", args, services, {
        summary: {
          rate: round(result.rate),
          idleRssMiB: result.idleRssMiB,
          warmupRssMiB: result.warmupRssMiB,
          peakRssMiB: result.peakRssMiB,
          growthMiB: result.growthMiB,
          samples: samples.length,
        },
        config,
        results: result,
      })
    } finally {
      await drain.stop()
      await sink.close()
      await bench.drop()
    }
  }),
)
