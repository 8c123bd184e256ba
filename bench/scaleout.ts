// Scale-out: one relay process against two draining the same backlog (FOR UPDATE SKIP LOCKED
// hands each claim different rows). Each relay is a process of its own (support/relayProcess.ts);
// all connect first, then start together.
//
//   bun bench/scaleout.ts [--quick] [--backlog 200000] [--processes 1,2] [--batch 1000] [--workers 2]
//                         [--queue quorum]
import { declareSink, type QueueType } from "./support/amqp.ts"
import { spawnRelay } from "./support/children.ts"
import { type CpuUse, cpuMeter, portOf } from "./support/cpu.ts"
import { createBenchDatabase, fillOutbox, outboxStatus } from "./support/db.ts"
import { log, main, parseArgs, printTable, round, withServices, writeResult } from "./support/harness.ts"

const args = parseArgs()
const quick = args.quick
const config = {
  backlog: args.number("backlog", quick ? 4_000 : 200_000),
  processes: args.list("processes", [1, 2]),
  batchSize: args.number("batch", 1000),
  workers: args.number("workers", 2),
  queueType: args.string("queue", "quorum") as QueueType,
}

interface Run {
  readonly processes: number
  readonly rate: number
  readonly seconds: number
  /** Messages in the queue beyond the backlog: published twice (a lease ran out). */
  readonly duplicates: number
  readonly perProcess: ReadonlyArray<number>
  readonly cpu: CpuUse
}

main(() =>
  withServices(async (services) => {
    const meter = cpuMeter({
      postgresPort: portOf(services.databaseUrl),
      rabbitPort: portOf(services.amqpUrl),
    })
    const bench = await createBenchDatabase(services.databaseUrl, "scaleout")
    const runs: Run[] = []
    try {
      for (const processes of config.processes) {
        await fillOutbox(bench.db, config.backlog)
        const sink = await declareSink(services.amqpUrl, config.queueType, "bench.scaleout")
        const relays = Array.from({ length: processes }, () =>
          spawnRelay({
            dbUrl: bench.url,
            amqpUrl: services.amqpUrl,
            exchange: sink.exchange,
            batchSize: config.batchSize,
            workers: config.workers,
            statsMs: 20,
          }),
        )
        try {
          await Promise.all(relays.map((r) => r.ready))
          const pids = relays.map((r) => r.pid)
          const before = meter.sample(pids)
          const started = performance.now()
          for (const relay of relays) relay.send("go")
          const published = () => relays.reduce((sum, r) => sum + (r.latest()?.published ?? 0), 0)
          await relays[0]!.waitFor(
            `${config.backlog} messages published`,
            () => published() >= config.backlog,
            600_000,
          )
          const seconds = (performance.now() - started) / 1000
          const cpu = meter.use(before, meter.sample(pids))
          const perProcess = relays.map((r) => r.latest()?.published ?? 0)
          await Promise.all(relays.map((r) => r.stop()))
          const [status, depth] = await Promise.all([outboxStatus(bench.db), sink.events()])
          if (status.sent !== config.backlog) throw new Error(`${status.sent} rows sent of ${config.backlog}`)
          runs.push({
            processes,
            rate: config.backlog / seconds,
            seconds,
            duplicates: depth - config.backlog,
            perProcess,
            cpu,
          })
          log(`${processes} relay process(es): ${Math.round(config.backlog / seconds)} msg/s`)
        } finally {
          await Promise.all(relays.map((r) => r.stop()))
          await sink.close()
        }
      }
      const base = runs[0]!.rate
      printTable(
        `Relay processes draining ${config.backlog.toLocaleString("en-US")} rows together (each batch ${config.batchSize} × ${config.workers} workers, ${config.queueType} queue; CPU in cores)`,
        [
          "processes",
          "msg/s",
          "speed-up",
          "seconds",
          "split",
          "relays",
          "pg",
          "rabbit",
          "other",
          "duplicates",
        ],
        runs.map((r) => [
          r.processes,
          Math.round(r.rate),
          round(r.rate / base, 2),
          round(r.seconds, 1),
          r.perProcess.map((n) => n.toLocaleString("en-US")).join(" / "),
          r.cpu.children === undefined ? undefined : round(r.cpu.children, 2),
          r.cpu.postgres === undefined ? undefined : round(r.cpu.postgres, 2),
          r.cpu.rabbitmq === undefined ? undefined : round(r.cpu.rabbitmq, 2),
          r.cpu.other === undefined ? undefined : round(r.cpu.other, 2),
          r.duplicates,
        ]),
      )
      const summary: Record<string, number> = {}
      for (const r of runs) summary[`processes${r.processes}`] = round(r.rate)
      if (runs.length > 1) summary.speedup = round(runs.at(-1)!.rate / base, 3)
      writeResult("scaleout", args, services, { summary, config, results: runs })
    } finally {
      await bench.drop()
    }
  }),
)
