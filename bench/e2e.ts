// End to end at fixed offered rates (issue #13): producers, relay and inbox as separate processes,
// as services would run them, on real PostgreSQL and RabbitMQ. The producers
// (support/producerProcess.ts) run business transactions — `INSERT INTO orders …` and
// `Outbox.enqueue` in one transaction — at 250, 500, 1,000, 2,000 msg/s, flat out, and at half
// the flat-out rate; a relay (support/relayProcess.ts) and an idempotent Inbox
// (support/inboxProcess.ts, handler inserts the order's effect row into `bench.handled` in the
// inbox's transaction) run with the library's defaults. Latency is the handler's commit minus the
// producer's commit, both read from the database (`pg_xact_commit_timestamp` of the two rows), so
// no two processes' clocks are compared. The same producers also run order-only transactions flat
// out (the producer rate the pipeline is compared with).
//
// Two passes, each on a PostgreSQL of its own started here (the test cluster's binaries and
// settings, plus track_commit_timestamp=on): the test settings (fsync=off, synchronous_commit=off,
// full_page_writes=off), and durable (fsync=on, synchronous_commit=on, full_page_writes=on: the
// defaults a user runs). Without local PostgreSQL binaries the test pass runs on the services'
// server with insert-time clock_timestamp() instead of commit times, and the durable pass is skipped.
//
// With `--sources polling,wal` each pass runs twice, once with the default polling relay and once
// with the relay reading the outbox's WAL (issue #27; its server then runs with wal_level=logical),
// and a last table compares the two: commit → marked sent (the relay's mark or settle committed,
// after the broker's confirm) and PostgreSQL's CPU per message. A WAL relay sees a commit once its
// WAL is flushed: with synchronous_commit=off (the test pass) that waits for the WAL writer, so the
// durable pass is the one to read for it.
//
//   bun bench/e2e.ts [--quick] [--rates 250,500,1000,2000,max,half] [--seconds 10] [--warmup 2]
//                    [--settings test,durable] [--producers 1] [--connections 8] [--keyed]
//                    [--prefetch 32] [--transactions 4] [--relay-workers 1]
//                    [--sources polling,wal] [--batch-every <ms>]
import { sql } from "kysely"
import postgres from "postgres"
import { defaultRetryPolicy } from "../src/Retry.ts"
import { deadQueueName, delayQueueName, queueName } from "../src/transport/amqp/subscriber.ts"
import { type LocalPostgres, startLocalPostgres } from "../test/support/postgres.ts"
import { deleteTopology, uniqueName } from "./support/amqp.ts"
import { type Child, type ProducerLine, spawnChild, spawnRelay } from "./support/children.ts"
import { type CpuUse, cpuMeter, portOf } from "./support/cpu.ts"
import { createBenchDatabase, dropIdleSlots } from "./support/db.ts"
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

const args = parseArgs()
const quick = args.quick
type Rate = number | "max" | "half"
const rates: ReadonlyArray<Rate> = args
  .string("rates", quick ? "100,max,half" : "250,500,1000,2000,max,half")
  .split(",")
  .map((part) => {
    const p = part.trim()
    if (p === "max" || p === "half") return p
    const n = Number(p.replaceAll("_", ""))
    if (!Number.isFinite(n) || n <= 0) throw new Error(`--rates: ${p} is not a rate, "max" or "half"`)
    return n
  })
if (rates.includes("half") && rates.indexOf("half") < rates.indexOf("max")) {
  throw new Error(`--rates: "half" needs "max" before it`)
}
type Pass = "test" | "durable"
const passes = args.choices<Pass>("settings", ["test", "durable"], ["test", "durable"])
type Source = "polling" | "wal"
const sources = args.choices<Source>("sources", ["polling"], ["polling", "wal"])
const config = {
  rates,
  passes,
  sources,
  /** The WAL relay's batchEvery (ms); unset: the library's default. */
  batchEveryMs: args.given["batch-every"] === undefined ? undefined : args.number("batch-every", 25),
  /** Measured seconds per rate (the steady window), after the warm-up. */
  seconds: args.number("seconds", quick ? 0.7 : 10),
  warmupSeconds: args.number("warmup", quick ? 0.3 : 2),
  /** The producers go on this long after the window, so the window does not end on their ramp-down. */
  tailSeconds: quick ? 0.1 : 0.5,
  /** Producer processes; the offered rate is split evenly over them. */
  producers: args.number("producers", 1),
  /** Pooled connections per producer process: the most transactions in flight, and the loops flat out. */
  connections: args.number("connections", 8),
  /** partitionKey = the order id on every message: a key per order (the worst case of the keyed path). */
  keyed: args.given.keyed === true,
  /** The library's defaults, spelled out for the relay child (README "Configuration and defaults"). */
  relay: { batchSize: 1000, workers: args.number("relay-workers", 1), pollMs: 1000, listen: true },
  /** The Inbox defaults; inboxProcess.ts needs them spelled out. */
  prefetch: args.number("prefetch", 32),
  transactions: args.number("transactions", 4),
  drainTimeoutMs: args.number("drain-timeout", quick ? 60 : 300) * 1000,
}

const SETTINGS: Record<Pass, Record<string, string>> = {
  test: { fsync: "off", synchronous_commit: "off", full_page_writes: "off" },
  durable: { fsync: "on", synchronous_commit: "on", full_page_writes: "on" },
}

interface InboxLine {
  readonly event: "ready" | "stats" | "report"
  readonly processed?: number
  readonly duplicates?: number
  readonly dead?: number
}

interface Measurement {
  readonly pass: Pass
  readonly mode: "order-only" | "end to end"
  /** "max" = flat out; a number = msg/s offered by all producers together. */
  readonly offered: number | "max"
  /** Orders committed per second in the window (by their commit time). */
  readonly produced: number
  /** Handler effects committed per second in the window (end to end only). */
  readonly achieved: number | undefined
  readonly latency:
    | {
        n: number
        p50: number
        p95: number
        p99: number
        max: number
        /** Producer commit → the relay's mark committed (published and confirmed), p50 / p99. */
        markedP50: number
        markedP99: number
        /**
         * Producer commit → `published_at`, the start of the statement that wrote it sent, p50 / p99.
         * The WAL relay settles a batch as soon as the broker confirmed it: its publish. The polling
         * relay's mark rides its next look, up to one look later.
         */
        publishedP50: number
        publishedP99: number
        /** Producer commit → the handler's transaction began (inbox row's received_at), p50 / p99. */
        begunP50: number
        begunP99: number
      }
    | undefined
  /** Handled ≥ 95 % of the offered (flat out: of the produced) rate and p99 under a second. */
  readonly keepsUp: boolean | undefined
  /** The producers' transaction time, BEGIN → COMMIT acknowledged: p50 and p99 over all their transactions. */
  readonly txP50: number
  readonly txP99: number
  readonly cpu: CpuUse
  readonly perSecond: ReadonlyArray<{
    second: number
    handled: number
    p50: number
    p99: number
    max: number
  }>
  /** Messages handled after the window (the producers stopping) and the seconds they took. */
  readonly drain: { messages: number; seconds: number } | undefined
}

interface PassResult {
  readonly pass: Pass
  readonly source: Source
  readonly server: string
  readonly settings: Record<string, string>
  /** "commit" = pg_xact_commit_timestamp of both rows; "insert" = clock_timestamp() at each row's insert. */
  readonly clock: "commit" | "insert"
  readonly measurements: Measurement[]
}

main(() =>
  withServices(async (services) => {
    const results: PassResult[] = []
    const skipped: string[] = []
    for (const pass of config.passes) {
      let local: LocalPostgres | undefined
      try {
        local = await startLocalPostgres({ name: `bench-e2e-${pass}` })
      } catch (error) {
        const why = error instanceof Error ? error.message.split("\n")[0] : String(error)
        if (pass === "durable") {
          skipped.push(`durable: no PostgreSQL of the bench's own (${why})`)
          log(`durable pass skipped: ${why}`)
          continue
        }
        log(`no local PostgreSQL (${why}): the test pass runs on the services' server, insert-time clock`)
      }
      try {
        if (local) {
          const admin = postgres(local.url, { max: 1, onnotice: () => {} })
          try {
            const wal = config.sources.includes("wal") ? { wal_level: "logical" } : {}
            for (const [name, value] of Object.entries({
              ...SETTINGS[pass],
              ...wal,
              track_commit_timestamp: "on",
            })) {
              await admin.unsafe(`ALTER SYSTEM SET ${name} = '${value}'`)
            }
          } finally {
            await admin.end({ timeout: 5 })
          }
          // track_commit_timestamp and wal_level take a restart; the rest would do with a reload.
          await local.restart()
        }
        for (const source of config.sources) {
          results.push(
            await runPass(
              pass,
              source,
              local?.url ?? services.databaseUrl,
              services.amqpUrl,
              local !== undefined,
            ),
          )
        }
      } finally {
        await local?.stop()
      }
    }

    for (const r of results) {
      printTable(
        `End to end, ${r.source} relay, ${r.pass} settings (${Object.entries(r.settings)
          .map(([k, v]) => `${k}=${v}`)
          .join(", ")}): ${config.producers} producer process(es) × ${config.connections} connections` +
          `${config.keyed ? ", partitionKey = order id" : ""}; relay batch ${config.relay.batchSize} × ${config.relay.workers}, NOTIFY; ` +
          `Inbox idempotent, prefetch ${config.prefetch}, ${config.transactions} transactions; ${config.seconds} s windows after ${config.warmupSeconds} s warm-up. ` +
          `Latency ms, ${r.clock === "commit" ? "producer commit → handler commit (commit timestamps)" : "order insert → handler insert (clock_timestamp)"}; CPU in cores`,
        [
          "run",
          "offered/s",
          "produced/s",
          "achieved/s",
          "keeps up",
          "drain/s",
          "p50",
          "p95",
          "p99",
          "max",
          "marked p50",
          "marked p99",
          "begun p50",
          "tx p50",
          "tx p99",
          "producers",
          "relay",
          "inbox",
          "pg",
          "rabbit",
          "other",
        ],
        r.measurements.map((m) => {
          const child = (i: number) => m.cpu.perChild[i]
          const producers = Array.from({ length: config.producers }, (_, i) => child(i)).reduce<
            number | undefined
          >((a, b) => (a === undefined || b === undefined ? undefined : a + b), 0)
          const cores = (n: number | undefined) => (n === undefined ? undefined : round(n, 2))
          return [
            m.mode,
            m.offered === "max" ? "flat out" : m.offered,
            Math.round(m.produced),
            m.achieved === undefined ? undefined : Math.round(m.achieved),
            m.keepsUp === undefined ? undefined : m.keepsUp ? "yes" : "no",
            m.drain === undefined || m.drain.messages < 100 || m.drain.seconds <= 0
              ? undefined
              : Math.round(m.drain.messages / m.drain.seconds),
            m.latency === undefined ? undefined : round(m.latency.p50, 1),
            m.latency === undefined ? undefined : round(m.latency.p95, 1),
            m.latency === undefined ? undefined : round(m.latency.p99, 1),
            m.latency === undefined ? undefined : round(m.latency.max, 1),
            m.latency === undefined ? undefined : round(m.latency.markedP50, 1),
            m.latency === undefined ? undefined : round(m.latency.markedP99, 1),
            m.latency === undefined ? undefined : round(m.latency.begunP50, 1),
            round(m.txP50, 2),
            round(m.txP99, 1),
            cores(producers),
            cores(child(config.producers)),
            cores(child(config.producers + 1)),
            cores(m.cpu.postgres),
            cores(m.cpu.rabbitmq),
            // The bench process only orchestrates (sleeps); it counts as other.
            cores(m.cpu.other === undefined ? undefined : m.cpu.other + m.cpu.bench),
          ]
        }),
      )
    }

    const summary: Record<string, number> = {}
    const goals: Array<Array<string | number | undefined>> = []
    for (const r of results) {
      const orderOnly = r.measurements.find((m) => m.mode === "order-only")
      const e2e = r.measurements.filter((m) => m.mode === "end to end")
      const flat = e2e.find((m) => m.offered === "max")
      const halfIndex = config.rates.indexOf("half")
      const half = halfIndex < 0 ? undefined : e2e[halfIndex]
      const prefix = r.source === "polling" ? r.pass : `${r.pass}.wal`
      for (const [i, m] of e2e.entries()) {
        const rate = config.rates[i]!
        const key = `${prefix}.${rate === "max" ? "flatOut" : rate === "half" ? "half" : rate}`
        summary[`${key}.achieved`] = round(m.achieved ?? 0)
        if (m.latency) {
          summary[`${key}.p50`] = round(m.latency.p50, 2)
          summary[`${key}.p99`] = round(m.latency.p99, 2)
          summary[`${key}.markedP99`] = round(m.latency.markedP99, 2)
          summary[`${key}.publishedP99`] = round(m.latency.publishedP99, 2)
        }
      }
      // Issue #13's goals are the default (polling) relay's.
      if (r.source !== "polling") continue
      if (orderOnly) summary[`${r.pass}.orderOnly`] = round(orderOnly.produced)
      const ratio = flat?.achieved !== undefined && orderOnly ? flat.achieved / orderOnly.produced : undefined
      if (ratio !== undefined) summary[`${r.pass}.flatOutOverOrderOnly`] = round(ratio, 3)
      goals.push([
        r.pass,
        orderOnly === undefined ? undefined : Math.round(orderOnly.produced),
        flat?.achieved === undefined ? undefined : Math.round(flat.achieved),
        ratio === undefined ? undefined : round(ratio, 2),
        ratio === undefined ? undefined : ratio >= 0.6 ? "yes" : "no",
        half === undefined || half.offered === "max" ? undefined : half.offered,
        half?.latency === undefined ? undefined : round(half.latency.p99, 1),
        half?.latency === undefined ? undefined : half.latency.p99 <= 50 ? "yes" : "no",
      ])
    }
    printTable(
      "Goals (issue #13): end to end flat out ≥ 0.6 × order-only producer rate; at half that rate p99 commit → handler ≤ 50 ms",
      [
        "settings",
        "order only tx/s",
        "e2e flat out msg/s",
        "ratio",
        "≥ 0.6",
        "half rate/s",
        "p99 ms there",
        "≤ 50 ms",
      ],
      goals,
    )
    if (config.sources.includes("wal")) printWalComparison(results)
    for (const note of skipped) log(`skipped: ${note}`)
    writeResult("e2e", args, services, { summary, config: { ...config, skipped }, results })
  }),
)

/**
 * Issue #27's figures, the WAL relay against the polling relay of the same settings, rate by rate:
 * producer commit → marked sent p50 / p99 (goal: p99 ≤ 10 ms at 1,000 msg/s) and PostgreSQL's CPU
 * per message handled in the window (goal: ≤ 0.7 × polling's).
 */
function printWalComparison(results: ReadonlyArray<PassResult>): void {
  const rows: Array<Array<string | number | undefined>> = []
  for (const wal of results.filter((r) => r.source === "wal")) {
    const polling = results.find((r) => r.source === "polling" && r.pass === wal.pass)
    const perMessage = (m: Measurement | undefined) =>
      m?.cpu.postgres === undefined || !m.achieved ? undefined : (m.cpu.postgres / m.achieved) * 1e6
    const e2e = (r: PassResult | undefined) => r?.measurements.filter((m) => m.mode === "end to end") ?? []
    const walRuns = e2e(wal)
    const pollingRuns = e2e(polling)
    for (const [i, w] of walRuns.entries()) {
      const p = pollingRuns[i]
      const pgWal = perMessage(w)
      const pgPolling = perMessage(p)
      rows.push([
        wal.pass,
        w.offered === "max" ? "flat out" : w.offered,
        p?.achieved === undefined ? undefined : Math.round(p.achieved),
        w.achieved === undefined ? undefined : Math.round(w.achieved),
        p?.latency === undefined
          ? undefined
          : `${round(p.latency.markedP50, 1)} / ${round(p.latency.markedP99, 1)}`,
        w.latency === undefined
          ? undefined
          : `${round(w.latency.markedP50, 1)} / ${round(w.latency.markedP99, 1)}`,
        w.latency === undefined
          ? undefined
          : `${round(w.latency.publishedP50, 1)} / ${round(w.latency.publishedP99, 1)}`,
        pgPolling === undefined ? undefined : Math.round(pgPolling),
        pgWal === undefined ? undefined : Math.round(pgWal),
        pgWal === undefined || pgPolling === undefined ? undefined : round(pgWal / pgPolling, 2),
      ])
    }
  }
  printTable(
    "The WAL relay against the polling relay (issue #27): commit → marked sent (after the broker's confirm) p50 / p99 ms; " +
      "the WAL relay's commit → published (its settle's statement_timestamp(), right after the confirm); " +
      "PostgreSQL CPU µs per message handled. Goals: p99 ≤ 10 ms at 1,000 msg/s; PostgreSQL ≤ 0.7 × polling",
    [
      "settings",
      "offered/s",
      "polling msg/s",
      "wal msg/s",
      "polling marked",
      "wal marked",
      "wal published",
      "polling pg µs",
      "wal pg µs",
      "wal / polling pg",
    ],
    rows,
  )
}

/** One pass: a bench database on `databaseUrl`, the children, order-only flat out, then every rate. */
async function runPass(
  pass: Pass,
  source: Source,
  databaseUrl: string,
  amqpUrl: string,
  ownServer: boolean,
): Promise<PassResult> {
  const bench = await createBenchDatabase(databaseUrl, `e2e_${pass}_${source}`)
  const exchange = uniqueName(`bench.e2e.${pass}`)
  const consumer = uniqueName(`e2e-${pass}`)
  const children: Array<Child<{ readonly event: string }>> = []
  try {
    const shown = await sql<{ name: string; setting: string }>`
      SELECT name, setting FROM pg_settings
      WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'track_commit_timestamp', 'wal_level')`.execute(
      bench.db,
    )
    const settings = Object.fromEntries(shown.rows.map((r) => [r.name, r.setting]))
    const clock: "commit" | "insert" = settings.track_commit_timestamp === "on" ? "commit" : "insert"
    if (ownServer) {
      for (const [name, value] of Object.entries(SETTINGS[pass])) {
        if (settings[name] !== value)
          throw new Error(`${pass}: ${name} is ${settings[name]}, wanted ${value}`)
      }
    }
    if (source === "wal" && settings.wal_level !== "logical")
      throw new Error(
        `${pass}: the WAL relay needs wal_level = logical, the server has ${settings.wal_level}`,
      )
    log(
      `${pass}, ${source} relay: PostgreSQL ${Object.entries(settings)
        .map(([k, v]) => `${k}=${v}`)
        .join(", ")}${ownServer ? " (the bench's own server)" : " (the services' server)"}`,
    )
    // The order table of bench/enqueue.ts, plus the run and the message's serial (to join the effect).
    await sql`
      CREATE TABLE orders (
        id uuid PRIMARY KEY, customer_id uuid NOT NULL, total numeric NOT NULL,
        created_at timestamptz NOT NULL DEFAULT clock_timestamp(), serial int NOT NULL, run int NOT NULL
      )`.execute(bench.db)
    // The handler's effect: support/inboxProcess.ts with RECORD=1 inserts (serial, key, seq).
    await sql`CREATE SCHEMA bench`.execute(bench.db)
    await sql`
      CREATE TABLE bench.handled (
        id bigserial PRIMARY KEY, serial int NOT NULL, key text, seq bigint,
        handled_at timestamptz NOT NULL DEFAULT clock_timestamp()
      )`.execute(bench.db)

    const meter = cpuMeter({ postgresPort: portOf(databaseUrl), rabbitPort: portOf(amqpUrl) })
    const inbox = spawnChild<InboxLine>("inboxProcess.ts", {
      DB_URL: bench.url,
      AMQP_URL: amqpUrl,
      EXCHANGE: exchange,
      CONSUMER: consumer,
      MODE: "idempotent",
      PREFETCH: String(config.prefetch),
      TRANSACTIONS: String(config.transactions),
      STATS_MS: "100",
      RECORD: "1",
    })
    children.push(inbox)
    // The consumer's queue must exist before anything is published (else: unroutable, retried).
    await inbox.ready
    const relay = spawnRelay({
      dbUrl: bench.url,
      amqpUrl,
      exchange,
      ...config.relay,
      statsMs: 1000,
      source,
      ...(config.batchEveryMs === undefined ? {} : { batchEveryMs: config.batchEveryMs }),
    })
    children.push(relay)
    const producers = Array.from({ length: config.producers }, (_, i) =>
      spawnChild<ProducerLine>("producerProcess.ts", {
        DB_URL: bench.url,
        CONNECTIONS: String(config.connections),
        INDEX: String(i),
        PROCESSES: String(config.producers),
        KEYED: config.keyed ? "1" : "0",
      }),
    )
    children.push(...producers)
    await Promise.all([relay.ready, ...producers.map((p) => p.ready)])
    relay.send("go")
    await relay.waitFor("the relay to start", (line) => line.event === "stats", 30_000)
    const pids = [...producers.map((p) => p.pid), relay.pid, inbox.pid]

    const commitOf = (alias: string) =>
      clock === "commit" ? sql.raw(`pg_xact_commit_timestamp(${alias}.xmin)`) : sql.raw(`${alias}.created_at`)
    const handledAt =
      clock === "commit" ? sql.raw("pg_xact_commit_timestamp(h.xmin)") : sql.raw("h.handled_at")
    const now = async () =>
      (await sql<{ t: string }>`SELECT clock_timestamp()::text AS t`.execute(bench.db)).rows[0]!.t

    let run = 0
    let enqueued = 0
    const measure = async (
      mode: "order-only" | "end to end",
      offered: number | "max",
    ): Promise<Measurement> => {
      run++
      const perProducer = offered === "max" ? 0 : offered / config.producers
      const seconds = config.warmupSeconds + config.seconds + config.tailSeconds
      for (const p of producers) {
        p.send(
          JSON.stringify({
            cmd: "run",
            run,
            mode: mode === "order-only" ? "order-only" : "enqueue",
            rate: perProducer,
            seconds,
          }),
        )
      }
      await sleep(config.warmupSeconds * 1000)
      const before = meter.sample(pids)
      const t0 = await now()
      await sleep(config.seconds * 1000)
      const t1 = await now()
      const cpu = meter.use(before, meter.sample(pids))
      const done = await Promise.all(
        producers.map((p) =>
          p.waitFor(
            `producer run ${run}`,
            (line) => line.event === "done" && line.run === run,
            seconds * 1000 + 60_000,
          ),
        ),
      )
      const errors = done.reduce((a, d) => a + (d.errors ?? 0), 0)
      if (errors > 0)
        throw new Error(
          `${errors} producer transactions failed: ${done.find((d) => d.firstError)?.firstError}`,
        )
      const transactions = done.reduce((a, d) => a + (d.transactions ?? 0), 0)
      const txP50 = Math.max(...done.map((d) => d.p50 ?? 0))
      const txP99 = Math.max(...done.map((d) => d.p99 ?? 0))
      const window = (Date.parse(t1) - Date.parse(t0)) / 1000
      const producedRows = await sql<{ n: string }>`
        SELECT count(*) AS n FROM orders o
        WHERE o.run = ${run} AND ${commitOf("o")} >= ${t0}::timestamptz AND ${commitOf("o")} < ${t1}::timestamptz`.execute(
        bench.db,
      )
      const produced = Number(producedRows.rows[0]!.n) / window
      if (mode === "order-only") {
        log(`${pass}: order only, flat out: ${Math.round(produced)} tx/s`)
        return {
          pass,
          mode,
          offered,
          produced,
          achieved: undefined,
          latency: undefined,
          keepsUp: undefined,
          txP50,
          txP99,
          cpu,
          perSecond: [],
          drain: undefined,
        }
      }
      enqueued += transactions
      // Every message handled before the numbers are read (and before the next rate starts).
      await inbox.waitFor(
        `${pass}: all ${enqueued} messages handled`,
        (line) => (line.processed ?? 0) + (line.duplicates ?? 0) + (line.dead ?? 0) >= enqueued,
        config.drainTimeoutMs,
      )
      const handled = await sql<{ n: string }>`
        SELECT count(*) AS n FROM bench.handled h
        WHERE ${handledAt} >= ${t0}::timestamptz AND ${handledAt} < ${t1}::timestamptz`.execute(bench.db)
      const achieved = Number(handled.rows[0]!.n) / window
      // After the window the producers stop (after a short tail): how fast the pipeline then works
      // off what is left, with the box to itself. Far above `achieved` = the parties compete.
      const after = await sql<{ n: string; seconds: number | null }>`
        SELECT count(*) AS n, extract(epoch FROM max(${handledAt}) - ${t1}::timestamptz) AS seconds
        FROM bench.handled h WHERE ${handledAt} >= ${t1}::timestamptz`.execute(bench.db)
      const drainSeconds = Number(after.rows[0]!.seconds ?? 0)
      const drain = { messages: Number(after.rows[0]!.n), seconds: drainSeconds }
      // Per message committed in the window: its handler's commit minus its own.
      // Per message committed in the window: its handler's commit minus its own; and, to say where
      // the time went, when the relay's mark committed (after the broker's confirm) and when the
      // handler's transaction began (the inbox row's received_at = that transaction's now()).
      const markedAt =
        clock === "commit" ? sql.raw("pg_xact_commit_timestamp(x.xmin)") : sql.raw("x.published_at")
      const latencies = sql`
        SELECT extract(epoch FROM (${handledAt} - ${commitOf("o")})) * 1000 AS ms,
               extract(epoch FROM (${markedAt} - ${commitOf("o")})) * 1000 AS marked_ms,
               extract(epoch FROM (x.published_at - ${commitOf("o")})) * 1000 AS published_ms,
               extract(epoch FROM (i.received_at - ${commitOf("o")})) * 1000 AS begun_ms,
               floor(extract(epoch FROM (${commitOf("o")} - ${t0}::timestamptz)))::int AS second
        FROM orders o JOIN bench.handled h USING (serial)
        LEFT JOIN txbox.outbox x ON (x.payload->>'serial')::int = o.serial
        LEFT JOIN txbox.inbox i ON i.message_id = x.id::text
        WHERE o.run = ${run} AND ${commitOf("o")} >= ${t0}::timestamptz AND ${commitOf("o")} < ${t1}::timestamptz`
      const stats = await sql<{
        n: string
        p: number[] | null
        marked: number[] | null
        published: number[] | null
        begun: number[] | null
        missing: string
      }>`
        SELECT count(*) AS n, percentile_disc(ARRAY[0.5, 0.95, 0.99, 1]) WITHIN GROUP (ORDER BY ms) AS p,
               percentile_disc(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY marked_ms) AS marked,
               percentile_disc(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY published_ms) AS published,
               percentile_disc(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY begun_ms) AS begun,
               (SELECT count(*) FROM orders o WHERE o.run = ${run}
                  AND NOT EXISTS (SELECT 1 FROM bench.handled h WHERE h.serial = o.serial)) AS missing
        FROM (${latencies}) l`.execute(bench.db)
      const s = stats.rows[0]!
      if (Number(s.missing) > 0)
        throw new Error(`${pass}: ${s.missing} orders of run ${run} have no handler effect`)
      const p = (s.p ?? []).map(Number)
      const marked = (s.marked ?? []).map(Number)
      const published = (s.published ?? []).map(Number)
      const begun = (s.begun ?? []).map(Number)
      const latency =
        Number(s.n) === 0
          ? undefined
          : {
              n: Number(s.n),
              p50: p[0]!,
              p95: p[1]!,
              p99: p[2]!,
              max: p[3]!,
              markedP50: marked[0]!,
              markedP99: marked[1]!,
              publishedP50: published[0]!,
              publishedP99: published[1]!,
              begunP50: begun[0]!,
              begunP99: begun[1]!,
            }
      const series = await sql<{ second: number; handled: string; p: number[] }>`
        SELECT second, count(*) AS handled,
               percentile_disc(ARRAY[0.5, 0.99, 1]) WITHIN GROUP (ORDER BY ms) AS p
        FROM (${latencies}) l GROUP BY second ORDER BY second`.execute(bench.db)
      const perSecond = series.rows.map((r) => {
        const q = r.p.map(Number)
        return {
          second: r.second,
          handled: Number(r.handled),
          p50: round(q[0]!, 1),
          p99: round(q[1]!, 1),
          max: round(q[2]!, 1),
        }
      })
      const target = offered === "max" ? produced : offered
      const keepsUp = achieved >= 0.95 * target && latency !== undefined && latency.p99 < 1000
      log(
        `${pass} @ ${offered === "max" ? "flat out" : `${offered}/s`}: produced ${Math.round(produced)}/s, ` +
          `handled ${Math.round(achieved)}/s (then ${drain.messages} in ${drainSeconds.toFixed(1)} s), p50 ${latency?.p50.toFixed(1)} ms, p99 ${latency?.p99.toFixed(1)} ms`,
      )
      return {
        pass,
        mode,
        offered,
        produced,
        achieved,
        latency,
        keepsUp,
        txP50,
        txP99,
        cpu,
        perSecond,
        drain,
      }
    }

    const measurements: Measurement[] = [await measure("order-only", "max")]
    for (const rate of config.rates) {
      if (rate === "half") {
        const flat = measurements.find((m) => m.mode === "end to end" && m.offered === "max")
        measurements.push(await measure("end to end", Math.max(1, Math.round((flat?.achieved ?? 0) / 2))))
      } else {
        measurements.push(await measure("end to end", rate))
      }
    }
    return { pass, source, server: ownServer ? "own" : "services", settings, clock, measurements }
  } finally {
    for (const child of children.reverse()) await child.stop()
    await deleteTopology(amqpUrl, {
      queues: [
        queueName(consumer),
        deadQueueName(consumer),
        ...Array.from({ length: defaultRetryPolicy.maxAttempts }, (_, i) => delayQueueName(consumer, i + 1)),
      ],
      exchanges: [exchange],
    })
    if (source === "wal") await dropIdleSlots(bench.db)
    await bench.drop()
  }
}
