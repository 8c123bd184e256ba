// End-to-end latency, producer COMMIT → consumer handler start, at steady offered rates, with the
// relay woken by NOTIFY and with polling only. Three processes, as three services would run: the
// producer (this one), a relay (support/relayProcess.ts) and an idempotent txbox Inbox
// (support/inboxProcess.ts), whose handler records now − payload.committedAt.
//
//   bun bench/latency.ts [--quick] [--rates 500,2000] [--seconds 10] [--poll-ms 100]
import { Effect } from "effect"
import { Kysely } from "kysely"
import { PostgresJSDialect } from "kysely-postgres-js"
import postgres from "postgres"
import * as Outbox from "../src/Outbox.ts"
import { deadQueueName, queueName } from "../src/transport/amqp/subscriber.ts"
import { deleteTopology, uniqueName } from "./support/amqp.ts"
import { spawnChild, spawnRelay } from "./support/children.ts"
import { type CpuUse, cpuMeter, portOf } from "./support/cpu.ts"
import { createBenchDatabase } from "./support/db.ts"
import {
  log,
  main,
  parseArgs,
  percentile,
  printTable,
  round,
  sleep,
  withServices,
  writeResult,
} from "./support/harness.ts"
import { makePayload, OrderPlaced, wallMs } from "./support/payload.ts"

const args = parseArgs()
const quick = args.quick
const config = {
  rates: args.list("rates", quick ? [200, 500] : [500, 2000]),
  /** Measured seconds per scenario, after the warm-up. */
  seconds: args.number("seconds", quick ? 0.5 : 10),
  warmupSeconds: args.number("warmup", quick ? 0.2 : 2),
  /** Relay poll interval in the polling-only scenarios (LISTEN off). */
  pollMs: args.number("poll-ms", 100),
  /** Relay poll interval when NOTIFY wakes it: the fallback only. */
  notifyPollMs: 1000,
  batchSize: args.number("batch", 1000),
  workers: args.number("workers", 1),
  prefetch: args.number("prefetch", 32),
  /** Producer connections: the most transactions in flight at once. */
  producerConnections: 8,
}

interface LatencyLine {
  readonly event: "ready" | "stats" | "report"
  readonly processed?: number
  readonly latencies?: ReadonlyArray<[number, number]>
}

interface Scenario {
  readonly wake: "notify" | "poll"
  readonly rate: number
  readonly produced: number
  readonly achievedRate: number
  readonly measured: number
  readonly p50: number
  readonly p95: number
  readonly p99: number
  readonly max: number
  /** Payload timestamp → COMMIT acknowledged, p50: the part of the latency before the commit. */
  readonly commitLagP50: number
  /** The producer reached ≥ 95 % of the offered rate and p99 stayed under a second: the box keeps up. */
  readonly keepsUp: boolean
  readonly cpu: CpuUse
  readonly perSecond: ReadonlyArray<{ second: number; p50: number; max: number }>
}

main(() =>
  withServices(async (services) => {
    const meter = cpuMeter({
      postgresPort: portOf(services.databaseUrl),
      rabbitPort: portOf(services.amqpUrl),
    })
    const bench = await createBenchDatabase(services.databaseUrl, "latency")
    const client = postgres(bench.url, { max: config.producerConnections, onnotice: () => {} })
    // biome-ignore lint/suspicious/noExplicitAny: the producer's own database
    const db = new Kysely<any>({ dialect: new PostgresJSDialect({ postgres: client }) })
    try {
      const scenarios: Scenario[] = []
      const exchange = uniqueName("bench.latency")
      const consumer = uniqueName("latency")
      // One consuming service for the whole run, as in production; the relay is restarted per wake mode.
      const inbox = spawnChild<LatencyLine>("inboxProcess.ts", {
        DB_URL: bench.url,
        AMQP_URL: services.amqpUrl,
        EXCHANGE: exchange,
        CONSUMER: consumer,
        MODE: "idempotent",
        PREFETCH: String(config.prefetch),
        STATS_MS: "50",
      })
      // Serials run on across scenarios; the inbox counts every message it has handled.
      let produced = 0
      try {
        // The consumer's queue must exist before anything is published (else: unroutable, retried).
        await inbox.ready
        for (const wake of ["notify", "poll"] as const) {
          const relay = spawnRelay({
            dbUrl: bench.url,
            amqpUrl: services.amqpUrl,
            exchange,
            batchSize: config.batchSize,
            workers: config.workers,
            listen: wake === "notify",
            pollMs: wake === "notify" ? config.notifyPollMs : config.pollMs,
          })
          try {
            await relay.ready
            relay.send("go")
            await relay.waitFor("the relay to start", (line) => line.event === "stats", 30_000)
            for (const rate of config.rates) {
              scenarios.push(await scenario(wake, rate, relay.pid))
            }
          } finally {
            await relay.stop()
          }
        }
      } finally {
        await inbox.stop()
        await deleteTopology(services.amqpUrl, {
          queues: [queueName(consumer), deadQueueName(consumer)],
          exchanges: [exchange],
        })
      }

      async function scenario(wake: "notify" | "poll", rate: number, relayPid: number): Promise<Scenario> {
        const commitLag: number[] = []
        const inFlight = new Set<Promise<void>>()
        const produce = (serial: number) => {
          const p = db
            .transaction()
            .execute(async (trx) => {
              const payload = makePayload(serial, wallMs())
              await Effect.runPromise(Outbox.enqueue(trx, OrderPlaced, payload))
              return payload.committedAt
            })
            .then((committedAt) => {
              commitLag.push(wallMs() - committedAt)
            })
            .finally(() => inFlight.delete(p))
          inFlight.add(p)
        }
        const pids = [relayPid, inbox.pid]
        const first = produced
        const measureFrom = first + Math.floor(config.warmupSeconds * rate)
        const last = measureFrom + Math.floor(config.seconds * rate)
        let measureStart = performance.now()
        let before = meter.sample(pids)
        const started = performance.now()
        // A steady rate: at each tick start every transaction that is due by now. A producer
        // that falls behind catches up as fast as it can; the achieved rate tells.
        while (produced < last) {
          const due = Math.min(first + Math.floor(((performance.now() - started) / 1000) * rate), last)
          while (produced < due && inFlight.size < config.producerConnections * 4) {
            if (produced === measureFrom) {
              measureStart = performance.now()
              before = meter.sample(pids)
            }
            produce(produced++)
          }
          await sleep(1)
        }
        await Promise.all(inFlight)
        const measureSeconds = (performance.now() - measureStart) / 1000
        const cpu = meter.use(before, meter.sample(pids))
        await inbox.waitFor(
          `all ${produced} messages handled`,
          (line) => (line.processed ?? 0) >= produced,
          60_000,
        )
        inbox.send("report")
        const report = await inbox.waitFor(
          "the latency report",
          (line) => line.event === "report" && (line.latencies ?? []).some(([serial]) => serial === last - 1),
          30_000,
        )
        const pairs = (report.latencies ?? []).filter(([serial]) => serial >= measureFrom)
        const measured = pairs.map(([, ms]) => ms)
        // Per second of the run (by the message's place in the steady stream): p50 and max, so a
        // tail can be told apart as periodic stalls or as a queue that keeps growing.
        const perSecond: Array<{ second: number; p50: number; max: number }> = []
        for (let second = 0; second * rate < last - measureFrom; second++) {
          const from = measureFrom + second * rate
          const slice = pairs.filter(([serial]) => serial >= from && serial < from + rate).map(([, ms]) => ms)
          if (slice.length > 0) {
            perSecond.push({
              second,
              p50: round(percentile(slice, 50), 1),
              max: round(percentile(slice, 100), 1),
            })
          }
        }
        if (measured.length !== last - measureFrom) {
          throw new Error(`${measured.length} latencies for ${last - measureFrom} messages`)
        }
        const result: Scenario = {
          wake,
          rate,
          produced: last - first,
          achievedRate: (last - measureFrom) / measureSeconds,
          measured: measured.length,
          p50: percentile(measured, 50),
          p95: percentile(measured, 95),
          p99: percentile(measured, 99),
          max: percentile(measured, 100),
          commitLagP50: percentile(commitLag, 50),
          keepsUp: (last - measureFrom) / measureSeconds >= 0.95 * rate && percentile(measured, 99) < 1000,
          cpu,
          perSecond,
        }
        log(
          `${wake} @ ${rate}/s: p50 ${result.p50.toFixed(1)} ms, p95 ${result.p95.toFixed(1)}, p99 ${result.p99.toFixed(1)}`,
        )
        return result
      }

      printTable(
        `Latency commit → handler start, ms (idempotent Inbox, prefetch ${config.prefetch}; relay batch ${config.batchSize} × ${config.workers}; ` +
          `poll: LISTEN off, pollInterval ${config.pollMs} ms; notify: pollInterval ${config.notifyPollMs} ms fallback)`,
        [
          "wake",
          "offered/s",
          "achieved/s",
          "keeps up",
          "messages",
          "p50",
          "p95",
          "p99",
          "max",
          "commit lag p50",
          "producer",
          "relay",
          "inbox",
          "pg",
          "rabbit",
          "other",
        ],
        scenarios.map((s) => [
          s.wake,
          s.rate,
          Math.round(s.achievedRate),
          s.keepsUp ? "yes" : "no",
          s.measured,
          round(s.p50, 1),
          round(s.p95, 1),
          round(s.p99, 1),
          round(s.max, 1),
          round(s.commitLagP50, 2),
          round(s.cpu.bench, 2),
          s.cpu.perChild[0] === undefined ? undefined : round(s.cpu.perChild[0], 2),
          s.cpu.perChild[1] === undefined ? undefined : round(s.cpu.perChild[1], 2),
          s.cpu.postgres === undefined ? undefined : round(s.cpu.postgres, 2),
          s.cpu.rabbitmq === undefined ? undefined : round(s.cpu.rabbitmq, 2),
          s.cpu.other === undefined ? undefined : round(s.cpu.other, 2),
        ]),
      )
      const summary: Record<string, number> = {}
      for (const s of scenarios) {
        summary[`${s.wake}.${s.rate}.p50`] = round(s.p50, 2)
        summary[`${s.wake}.${s.rate}.p95`] = round(s.p95, 2)
        summary[`${s.wake}.${s.rate}.p99`] = round(s.p99, 2)
        summary[`${s.wake}.${s.rate}.achieved`] = round(s.achievedRate)
      }
      writeResult("latency", args, services, { summary, config, results: scenarios })
    } finally {
      await db.destroy()
      await bench.drop()
    }
  }),
)
