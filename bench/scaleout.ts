// Scale-out, two ways:
// - steady: producers at a fixed low rate, 1 → 16 relay processes (and inbox processes), the
//   whole pipeline with txbox's defaults (bench/cost.ts's machinery, run as a child): msg/s, commit →
//   handler p50/p99, the relays' claims per second and the share that found nothing, and PostgreSQL's
//   CPU per message against one relay + one inbox process (issue #25's goals);
// - drain: one relay process against more draining the same backlog (FOR UPDATE SKIP LOCKED hands
//   each claim different rows). Each relay is a process of its own (support/relayProcess.ts); all
//   connect first, then start together.
//
//   bun bench/scaleout.ts [--quick] [--modes steady,drain] [--rate 100] [--seconds 15]
//                         [--topologies 1+1,4+1,16+1,4+4,16+16]
//                         [--backlog 200000] [--processes 1,2] [--batch 1000] [--workers 2] [--queue quorum]
import { spawnSync } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { ClaimFigures } from "./cost.ts"
import { declareSink, type QueueType } from "./support/amqp.ts"
import { spawnRelay } from "./support/children.ts"
import { type CpuUse, cpuMeter, portOf } from "./support/cpu.ts"
import { createBenchDatabase, fillOutbox, outboxStatus } from "./support/db.ts"
import {
  BENCH_DIR,
  log,
  main,
  parseArgs,
  printTable,
  round,
  withServices,
  writeResult,
} from "./support/harness.ts"

const args = parseArgs()
const quick = args.quick
const config = {
  backlog: args.number("backlog", quick ? 4_000 : 200_000),
  processes: args.list("processes", [1, 2]),
  batchSize: args.number("batch", 1000),
  workers: args.number("workers", 2),
  queueType: args.string("queue", "quorum") as QueueType,
  modes: args.string("modes", "steady,drain").split(","),
  rate: args.number("rate", 100),
  seconds: args.number("seconds", quick ? 5 : 15),
  topologies: args.string("topologies", quick ? "1+1,4+1" : "1+1,4+1,16+1,4+4,16+16"),
}

/** What bench/cost.ts wrote for one topology (its results/cost.json's runs). */
interface CostRun {
  readonly topology: string
  readonly e2eRate: number
  readonly p50: number
  readonly p99: number
  readonly usPerMessage: Readonly<Record<string, number | undefined>>
  readonly claims: ClaimFigures | undefined
}

/**
 * The steady part: bench/cost.ts with txbox's pipeline only, at `rate`, over the topologies, its
 * results written to a directory of its own (results/cost.json stays the cost bench's).
 */
const steady = (): ReadonlyArray<CostRun> => {
  const dir = mkdtempSync(join(tmpdir(), "txbox-scaleout-"))
  try {
    const child = spawnSync(
      process.execPath,
      [
        join(BENCH_DIR, "cost.ts"),
        "--pipelines",
        "txbox",
        "--loads",
        String(config.rate),
        "--topologies",
        config.topologies,
        "--rounds",
        "1",
        "--seconds",
        String(config.seconds),
        "--warmup",
        "3",
        ...(quick ? ["--quick"] : []),
      ],
      { stdio: ["ignore", "inherit", "inherit"], env: { ...process.env, TXBOX_BENCH_RESULTS_DIR: dir } },
    )
    if (child.status !== 0) throw new Error(`bench/cost.ts ended with ${child.status ?? child.signal}`)
    return (JSON.parse(readFileSync(join(dir, "cost.json"), "utf8")) as { results: CostRun[] }).results
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

const printSteady = (runs: ReadonlyArray<CostRun>): Record<string, number> => {
  const base = runs.find((r) => r.topology === "1+1") ?? runs[0]!
  const pgBase = base.usPerMessage.postgres
  printTable(
    `Relay + inbox processes at ${config.rate} msg/s offered (txbox's defaults, bench/cost.ts): PostgreSQL µs per message against ${base.topology}'s`,
    [
      "relay+inbox",
      "msg/s",
      "p50 ms",
      "p99 ms",
      "p99 ×",
      "claims/s",
      "empty %",
      "steady empty %",
      "relay µs",
      "pg µs",
      "pg ×",
    ],
    runs.map((r) => [
      r.topology,
      Math.round(r.e2eRate),
      round(r.p50, 0),
      round(r.p99, 0),
      round(r.p99 / base.p99, 2),
      r.claims === undefined ? undefined : round(r.claims.perSecond, 1),
      r.claims === undefined ? undefined : Math.round(r.claims.empty * 100),
      r.claims?.steadyEmpty === undefined ? undefined : Math.round(r.claims.steadyEmpty * 100),
      r.usPerMessage.relay === undefined ? undefined : Math.round(r.usPerMessage.relay),
      r.usPerMessage.postgres === undefined ? undefined : Math.round(r.usPerMessage.postgres),
      r.usPerMessage.postgres === undefined || pgBase === undefined
        ? undefined
        : round(r.usPerMessage.postgres / pgBase, 2),
    ]),
  )
  const summary: Record<string, number> = {}
  for (const r of runs) {
    const k = r.topology.replace("+", "_")
    summary[`steady_p99_ms_${k}`] = round(r.p99, 1)
    if (r.claims) summary[`steady_empty_claims_${k}`] = round(r.claims.empty, 3)
    if (r.claims?.steadyEmpty !== undefined)
      summary[`steady_empty_claims_after_start_${k}`] = round(r.claims.steadyEmpty, 3)
    if (r.usPerMessage.postgres !== undefined && pgBase !== undefined)
      summary[`steady_pg_ratio_${k}`] = round(r.usPerMessage.postgres / pgBase, 3)
  }
  return summary
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

main(async () => {
  const steadySummary = config.modes.includes("steady") ? printSteady(steady()) : {}
  if (!config.modes.includes("drain")) {
    writeResult("scaleout", args, undefined, { summary: steadySummary, config, results: [] })
    return
  }
  await withServices(async (services) => {
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
      const summary: Record<string, number> = { ...steadySummary }
      for (const r of runs) summary[`processes${r.processes}`] = round(r.rate)
      if (runs.length > 1) summary.speedup = round(runs.at(-1)!.rate / base, 3)
      writeResult("scaleout", args, services, { summary, config, results: runs })
    } finally {
      await bench.drop()
    }
  })
})
