// Cost per message (issue #21): the CPU every party spends per message end to end, txbox with its
// defaults against a minimal hand-written outbox + inbox on the same driver (node-postgres `pg` and
// amqplib), on the same services, one after the other in one run.
//
// - hand: support/hand.ts (tables, the producer's transaction), support/handRelayProcess.ts
//   (SKIP LOCKED batches of 200, confirms, one UPDATE, polls every 50 ms),
//   support/handInboxProcess.ts (one transaction per delivery, prefetch 32, 4 connections, quorum queue);
// - txbox: support/producerProcess.ts mode "enqueue" (the hand-written producer's transaction on the
//   same `pg` client, Outbox.enqueue in place of its INSERT), support/relayProcess.ts and
//   support/inboxProcess.ts (idempotent, RECORD=1) with no options: the library's defaults;
// - txbox-kysely (only when asked for, --pipelines hand,txbox,txbox-kysely): txbox with the
//   producer's transaction through Kysely, as the README's quickstart writes it;
// - txbox-wal (only when asked for): txbox's defaults but the relay's `source: "wal"` (issue #27),
//   reading a logical replication slot; the bench's PostgreSQL then runs with wal_level = logical
//   for every pipeline of the run, so the comparison stays on one server.
//
// Each run: a fresh database and exchange/queue; one producer process (4 connections) and N relay +
// N inbox processes ("1+1", "2+2"); CPU sampled from /proc from the producers' start until every
// committed order has its handler row; then checked from the tables (every order handled exactly once).
//
// The whole matrix runs `--rounds` times (hand and txbox back to back in each cell); the tables
// show medians, the JSON every run.
//
//   bun bench/cost.ts [--quick] [--seconds 10] [--warmup 6] [--settle 10] [--loads max,250,1000] [--topologies 1+1,2+2] [--partitions 0]
//                     [--batch-every <ms>] [--pipelines hand,txbox] [--rounds 3] [--outside-limit 0.15] [--outside-retries 2] [--connections 4] [--drain-timeout 300]
//                     [--pooler direct|pgbouncer[:N]] [--sync-commit off|on]
import { execFileSync } from "node:child_process"
import { mkdirSync, readFileSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { type Kysely, sql } from "kysely"
import postgres from "postgres"
import { defaultRetryPolicy } from "../src/Retry.ts"
import { DAY_MS, idBound, partitionName, partitionStart } from "../src/storage/sql/partitionBounds.ts"
import { deadQueueName, delayQueueName, queueName } from "../src/transport/amqp/subscriber.ts"
import { startPgBouncer } from "../test/support/pgbouncer.ts"
import { type LocalPostgres, startLocalPostgres } from "../test/support/postgres.ts"
import { deleteTopology, uniqueName } from "./support/amqp.ts"
import {
  type Child,
  defaultInboxEnv,
  defaultRelayEnv,
  type ProducerLine,
  type RelayStatsLine,
  spawnChild,
} from "./support/children.ts"
import {
  type CpuMeter,
  type CpuUse,
  cpuMeter,
  portOf,
  threadSeconds,
  threadsUsed,
  treeSeconds,
} from "./support/cpu.ts"
import { createBenchDatabase, dropIdleSlots } from "./support/db.ts"
import { HAND_SCHEMA_SQL, PIPELINE_TABLES_SQL } from "./support/hand.ts"
import {
  type Cell,
  log,
  main,
  median,
  parseArgs,
  printTable,
  round,
  sleep,
  until,
  withServices,
  writeResult,
} from "./support/harness.ts"

const args = parseArgs()
const quick = args.quick

/** "txbox-kysely": txbox with the producer's transaction through Kysely (the quickstart's wiring). */
type Pipeline = "hand" | "txbox" | "txbox-kysely" | "txbox-wal"
type Load = number | "max"
interface Topology {
  readonly name: string
  readonly relays: number
  readonly inboxes: number
}

const listOf = <T>(name: string, fallback: string, parse: (part: string) => T): T[] =>
  args
    .string(name, fallback)
    .split(",")
    .map((p) => p.trim())
    .filter((p) => p !== "")
    .map(parse)

const config = {
  pipelines: args.choices<Pipeline>(
    "pipelines",
    ["hand", "txbox"],
    ["hand", "txbox", "txbox-kysely", "txbox-wal"],
  ),
  loads: listOf("loads", quick ? "max" : "max,250,1000", (p): Load => {
    if (p === "max") return p
    const n = Number(p.replaceAll("_", ""))
    if (!Number.isFinite(n) || n <= 0) throw new Error(`--loads: ${p} is not a rate or "max"`)
    return n
  }),
  topologies: listOf("topologies", "1+1,2+2", (p): Topology => {
    const m = /^(\d+)\+(\d+)$/.exec(p)
    if (!m || Number(m[1]) < 1 || Number(m[2]) < 1)
      throw new Error(`--topologies: ${p} (relays+inboxes, e.g. 1+1)`)
    return { name: p, relays: Number(m[1]), inboxes: Number(m[2]) }
  }),
  /** Times the whole matrix runs; the tables show the median of each figure. */
  rounds: args.number("rounds", quick ? 1 : 3),
  /**
   * A run during which the machine was busier than the five parties and the bench by more than
   * `--outside-limit` cores (another tenant, a kernel thread: `other`) runs again, up to
   * `--outside-retries` times; the last one counts. Work on the same two cores makes every party's
   * CPU per message dearer: in one 250 msg/s round with 0.49 cores of it, txbox's producer took
   * 36 % more CPU per message than in the round after, with none (2026-12-06).
   */
  outsideLimit: args.number("outside-limit", 0.15),
  outsideRetries: args.number("outside-retries", quick ? 0 : 2),
  /** Seconds the producer runs (flat out or at the offered rate). */
  seconds: args.number("seconds", quick ? 1.5 : 10),
  /**
   * Seconds flat out before the measured run, whatever its load, drained before the clock starts:
   * every party's JIT has compiled its hot paths, as in a service that has run a while. (At the
   * offered load a 2 s warm-up left JavaScriptCore compiling through the whole measured window:
   * at 1,000 msg/s txbox's inbox still spent a tenth of its CPU in its compiler threads after a
   * minute, most of it at the top tier, which a function reaches only after many calls.)
   */
  /**
   * "pgbouncer[:N]": every party's pool goes through PgBouncer in transaction mode (N server
   * connections, default 8) in front of the bench database, txbox's LISTEN straight to it (`listenUrl`).
   */
  pooler: args.string("pooler", "direct"),
  /**
   * The bench's PostgreSQL's synchronous_commit: "off" as in the tests (the default here), or "on",
   * PostgreSQL's own default. A WAL relay sees a commit only once its WAL is flushed: with "off"
   * that waits for the WAL writer (wal_writer_delay, 200 ms).
   */
  syncCommit: args.string("sync-commit", "off"),
  warmupSeconds: args.number("warmup", quick ? 0.3 : 6),
  /**
   * Then, at an offered load, seconds at that load before the clock starts (not measured): the
   * steady state at the load, not the way down from flat out. Right after the flat-out warm-up
   * JavaScriptCore was still compiling the paths a low rate takes (small batches, waits between
   * looks): at 250 msg/s txbox's total cost was 1.22× the hand-written one's in the first 10 s and
   * 0.94–0.97× over 40–60 s (2026-11-27); the hand-written pipeline's, with far less code, settles at once.
   */
  settleSeconds: args.number("settle", quick ? 0 : 10),
  /** Pooled connections of the producer process: its loops flat out, its most in flight at a rate. */
  connections: args.number("connections", 4),
  /**
   * Day partitions of txbox's outbox and inbox besides the default one: the days before today, today
   * and the three ahead, as retention keeps them (`retention.olderThan` of N − 4 days). 0: the
   * default partition only, txbox's default without retention.
   */
  partitions: args.number("partitions", 0),
  /** txbox's relays' `batchEvery` (ms): the latency / cost trade of RelayConfig.batchEvery; unset: the default. */
  batchEveryMs: args.given["batch-every"] === undefined ? undefined : args.number("batch-every", 25),
  drainTimeoutMs: args.number("drain-timeout", quick ? 60 : 300) * 1000,
}

/** `count` day partitions of txbox's outbox and inbox: the last ones up to today, and three days ahead. */
// biome-ignore lint/suspicious/noExplicitAny: the bench's own setup
const dayPartitions = async (db: Kysely<any>, count: number) => {
  const today = partitionStart(Date.now(), DAY_MS)
  for (let i = 0; i < count; i++) {
    const from = today + (i - (count - 4)) * DAY_MS
    for (const table of ["outbox", "inbox"]) {
      const name = partitionName(table, from, DAY_MS)
      await sql
        .raw(
          `CREATE TABLE txbox.${name} PARTITION OF txbox.${table} FOR VALUES FROM ('${idBound(from)}') TO ('${idBound(from + DAY_MS)}')`,
        )
        .execute(db)
    }
  }
}

const PARTIES = [
  "producer",
  "relay",
  "inbox",
  "postgres",
  "rabbitmq",
  "total",
  "other",
  "jit",
  "alloc",
] as const
type Party = (typeof PARTIES)[number]

/** The relays' claims in a run (bench/scaleout.ts reads them from results). */
export interface ClaimFigures {
  readonly perSecond: number
  readonly empty: number
  readonly steadyEmpty: number | undefined
}

interface Run {
  readonly round: number
  readonly pipeline: Pipeline
  readonly topology: string
  readonly load: Load
  /** Orders committed (= messages). */
  readonly committed: number
  /** The producer's own time, first BEGIN to last COMMIT. */
  readonly producerSeconds: number
  /** Producers' last commit → last handler commit, seconds (database clock). */
  readonly drainSeconds: number
  /** committed / (producerSeconds + drainSeconds). */
  readonly e2eRate: number
  /** Commit → handler latency, ms, over every message of the run. */
  readonly p50: number
  readonly p99: number
  readonly max: number
  /** The producer's transaction time, BEGIN to COMMIT acknowledged, ms. */
  readonly txP50: number
  readonly txP99: number
  /** CPU µs per message by party; undefined where /proc could not tell. */
  readonly usPerMessage: Readonly<Record<Party, number | undefined>>
  readonly cpu: CpuUse
  /** The whole machine in cores, by kind (/proc/stat): where _other_ went (softirq, steal, …). */
  readonly machine: Readonly<Record<string, number>> | undefined
  /**
   * txbox's relays (their stats, a second apart): claims per second, and the share that found
   * nothing over the whole window; `steadyEmpty`: that share from STEADY_AFTER_MS into the run to the
   * producer's end, without the start from idle (a NOTIFY wakes every relay process) and the drain.
   */
  readonly claims: ClaimFigures | undefined
  /**
   * txbox-wal: of PostgreSQL's CPU, its WAL sender's, µs per message (bench/walsender.ts has what
   * it costs per transaction of the database); undefined for the other pipelines.
   */
  readonly walSenderUs: number | undefined
  /** What PostgreSQL did per message: transactions, WAL bytes, rows written (pg_stat_*; approximate). */
  readonly database: DatabaseWork
}

interface DatabaseWork {
  readonly transactions: number
  readonly walBytes: number
  readonly rowWrites: number
}

/**
 * The bench database's transaction count, the server's WAL position and the rows inserted, updated
 * and deleted in the database's tables. PostgreSQL publishes a backend's counters at most once a
 * second, so the second sample waits for them (see the call).
 */
/**
 * BENCH_PG_STATEMENTS=<dir>: the bench's own PostgreSQL loads pg_stat_statements (statements in
 * functions and triggers too, planning time apart), reset before each measured run and written to
 * <dir>/<label>.txt after it: where the server's time per message goes, statement by statement.
 */
const STATEMENTS_DIR = process.env.BENCH_PG_STATEMENTS || undefined

/** Where the steady part of a run starts (`claims.steadyEmpty`): the relays' stats come a second apart. */
const STEADY_AFTER_MS = 2_000

/** BENCH_LATENCY_SPLIT=1: txbox runs also print where commit → handler goes (to the inbox transaction, in it; the relay's mark). */
const LATENCY_SPLIT = process.env.BENCH_LATENCY_SPLIT === "1"

const statementsReset = async (serverUrl: string) => {
  if (STATEMENTS_DIR === undefined) return
  const admin = postgres(serverUrl, { max: 1, onnotice: () => {} })
  try {
    await admin.unsafe("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    // Settable only once the library is loaded (after the restart that loads it).
    await admin.unsafe(`ALTER SYSTEM SET pg_stat_statements.track = 'all'`)
    await admin.unsafe(`ALTER SYSTEM SET pg_stat_statements.track_planning = 'on'`)
    await admin.unsafe("SELECT pg_reload_conf()")
    await admin.unsafe("SELECT pg_stat_statements_reset()")
  } finally {
    await admin.end({ timeout: 5 })
  }
}

const statementsWrite = async (serverUrl: string, label: string, messages: number) => {
  if (STATEMENTS_DIR === undefined) return
  const admin = postgres(serverUrl, { max: 1, onnotice: () => {} })
  try {
    const rows = await admin.unsafe<
      Array<{ calls: string; exec: number; plan: number; rows: string; query: string }>
    >(`SELECT calls::text, total_exec_time AS exec, total_plan_time AS plan, rows::text, query
         FROM pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC LIMIT 40`)
    const lines = rows.map(
      (r) =>
        `${((r.exec * 1000) / messages).toFixed(1).padStart(8)} µs/msg exec ${((r.plan * 1000) / messages).toFixed(1).padStart(7)} plan ` +
        `${(Number(r.calls) / messages).toFixed(3).padStart(8)} calls/msg ${(Number(r.rows) / Math.max(1, Number(r.calls))).toFixed(1).padStart(7)} rows/call  ` +
        r.query.replace(/\s+/g, " ").slice(0, 220),
    )
    mkdirSync(STATEMENTS_DIR, { recursive: true })
    writeFileSync(
      join(STATEMENTS_DIR, `${label.replace(/[^A-Za-z0-9+#_-]+/g, "_")}.txt`),
      `${lines.join("\n")}\n`,
    )
  } finally {
    await admin.end({ timeout: 5 })
  }
}

const databaseSample = async (db: Kysely<unknown>) => {
  const r = await sql<{ xacts: string; wal: string; writes: string }>`
    SELECT (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()) AS xacts,
           pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::text AS wal,
           (SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables)::text AS writes`.execute(
    db,
  )
  const row = r.rows[0]!
  return { transactions: Number(row.xacts), walBytes: Number(row.wal), rowWrites: Number(row.writes) }
}

interface InboxLine {
  readonly event: string
  readonly processed?: number
  readonly dead?: number
  readonly failed?: number
}

if (config.syncCommit !== "off" && config.syncCommit !== "on") throw new Error("--sync-commit: on or off")

main(() =>
  withServices(async (services) => {
    // A PostgreSQL of the bench's own with track_commit_timestamp (latency from both commits, read
    // from the database), as e2e.ts does; without local binaries the services' server, insert clock.
    let local: LocalPostgres | undefined
    try {
      local = await startLocalPostgres({ name: "bench-cost" })
      const admin = postgres(local.url, { max: 1, onnotice: () => {} })
      try {
        await admin.unsafe(`ALTER SYSTEM SET track_commit_timestamp = 'on'`)
        await admin.unsafe(`ALTER SYSTEM SET synchronous_commit = '${config.syncCommit}'`)
        if (config.pipelines.includes("txbox-wal"))
          await admin.unsafe(`ALTER SYSTEM SET wal_level = 'logical'`)
        if (STATEMENTS_DIR !== undefined) {
          await admin.unsafe(`ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'`)
        }
      } finally {
        await admin.end({ timeout: 5 })
      }
      await local.restart()
    } catch (error) {
      const why = error instanceof Error ? error.message.split("\n")[0] : String(error)
      log(`no local PostgreSQL (${why}): runs on the services' server, insert-time clock`)
      await local?.stop()
      local = undefined
    }
    const serverUrl = local?.url ?? services.databaseUrl
    const runs: Run[] = []
    // Runs made again because of the machine's other work (`outsideLimit`).
    let rerun = 0
    let clock: "commit" | "insert" = "insert"
    try {
      const meter = cpuMeter({ postgresPort: portOf(serverUrl), rabbitPort: portOf(services.amqpUrl) })
      for (let repeat = 1; repeat <= config.rounds; repeat++) {
        for (const topology of config.topologies) {
          for (const load of config.loads) {
            for (const pipeline of config.pipelines) {
              let r = await runOnce(repeat, pipeline, topology, load, serverUrl, services.amqpUrl, meter)
              for (let retry = 1; retry <= config.outsideRetries; retry++) {
                const outside = r.run.cpu.other
                if (outside === undefined || outside <= config.outsideLimit) break
                rerun++
                log(
                  `the machine did ${outside.toFixed(2)} cores of other work during that run (over ${config.outsideLimit}): running it again (${retry} of ${config.outsideRetries})`,
                )
                r = await runOnce(repeat, pipeline, topology, load, serverUrl, services.amqpUrl, meter)
              }
              clock = r.clock
              runs.push(r.run)
            }
          }
        }
      }
    } finally {
      await local?.stop()
    }

    const clockText =
      clock === "commit"
        ? "producer commit → handler commit (pg_xact_commit_timestamp)"
        : "order insert → handler insert (clock_timestamp(); no track_commit_timestamp)"
    const header = [
      "pipeline",
      "messages",
      "e2e msg/s",
      "drain s",
      "p50 ms",
      "p99 ms",
      ...PARTIES.map((p) => `${p === "postgres" ? "pg" : p === "rabbitmq" ? "rabbit" : p} µs`),
    ]
    const columnsOf = (r: Run): Array<number | undefined> => [
      r.committed,
      r.e2eRate,
      r.drainSeconds,
      r.p50,
      r.p99,
      ...PARTIES.map((p) => r.usPerMessage[p]),
    ]
    /** Each column's median over the rounds (undefined if any round has none). */
    const columns = (rs: ReadonlyArray<Run>): Array<number | undefined> =>
      columnsOf(rs[0]!).map((_, i) => {
        const values = rs.map((r) => columnsOf(r)[i])
        return values.some((v) => v === undefined || !Number.isFinite(v))
          ? undefined
          : median(values as number[])
      })
    const ratio = (a: number | undefined, b: number | undefined) =>
      a === undefined || b === undefined || !(b > 0) ? undefined : a / b
    const summary: Record<string, number> = {}
    const put = (key: string, value: number | undefined, digits: number) => {
      if (value !== undefined && Number.isFinite(value)) summary[key] = round(value, digits)
    }
    const keyOf = (load: Load, topology: string) => `${load}_${topology.replace("+", "p")}`
    for (const topology of config.topologies) {
      for (const load of config.loads) {
        const here = runs.filter((r) => r.topology === topology.name && r.load === load)
        const byPipeline = new Map(
          config.pipelines.map((p) => [p, columns(here.filter((r) => r.pipeline === p))] as const),
        )
        const rows: Cell[][] = [...byPipeline].map(([pipeline, cols]) => [
          pipeline,
          ...cols.map((v, i) => (v === undefined ? undefined : i === 2 ? round(v, 2) : Math.round(v))),
        ])
        const hand = byPipeline.get("hand")
        const txbox = byPipeline.get("txbox")
        if (hand && txbox) rows.push(["txbox / hand", ...txbox.map((v, i) => roundRatio(ratio(v, hand[i])))])
        const viaKysely = byPipeline.get("txbox-kysely")
        if (hand && viaKysely)
          rows.push(["txbox-kysely / hand", ...viaKysely.map((v, i) => roundRatio(ratio(v, hand[i])))])
        const viaWal = byPipeline.get("txbox-wal")
        if (hand && viaWal)
          rows.push(["txbox-wal / hand", ...viaWal.map((v, i) => roundRatio(ratio(v, hand[i])))])
        if (txbox && viaWal)
          rows.push(["txbox-wal / txbox", ...viaWal.map((v, i) => roundRatio(ratio(v, txbox[i])))])
        printTable(
          `${topology.relays} relay + ${topology.inboxes} inbox process(es), ${load === "max" ? "flat out" : `${load} msg/s offered`} for ${config.seconds} s, ` +
            `1 producer × ${config.connections} connections${config.rounds > 1 ? `; medians of ${config.rounds} runs` : ""}. ` +
            `CPU µs per message; latency ${clockText}`,
          header,
          rows,
        )
        const k = keyOf(load, topology.name)
        // The table's columns by name; messages and drain stay in the JSON's runs (the drain is
        // often ~0, no ratio), the summary has the rest, and the ratios of all but "other".
        const names = [
          undefined,
          "e2e_rate",
          undefined,
          "p50_ms",
          "p99_ms",
          ...PARTIES.map((p) => `cpu_${p}`),
        ]
        for (const [pipeline, cols] of byPipeline) {
          cols.forEach((v, i) => {
            if (names[i] !== undefined) put(`${pipeline}_${names[i]}_${k}`, v, 1)
          })
        }
        if (hand && txbox) {
          txbox.forEach((v, i) => {
            if (names[i] !== undefined && names[i] !== "cpu_other")
              put(`ratio_${names[i]}_${k}`, ratio(v, hand[i]), 3)
          })
        }
        // txbox's relays: claims per second and the share that found nothing (medians of the runs).
        const claims = here.flatMap((r) => (r.pipeline !== "hand" && r.claims ? [r.claims] : []))
        if (claims.length > 0) {
          put(`txbox_claims_per_s_${k}`, median(claims.map((c) => c.perSecond)), 1)
          put(`txbox_empty_claims_${k}`, median(claims.map((c) => c.empty)), 3)
          const steady = claims.flatMap((c) => (c.steadyEmpty === undefined ? [] : [c.steadyEmpty]))
          if (steady.length > 0) put(`txbox_empty_claims_steady_${k}`, median(steady), 3)
        }
        const sender = here.flatMap((r) => (r.walSenderUs === undefined ? [] : [r.walSenderUs]))
        if (sender.length > 0) put(`txbox-wal_cpu_walsender_${k}`, median(sender), 1)
      }
    }
    if (rerun > 0) {
      put("reruns_outside", rerun, 0)
      log(`${rerun} run(s) made again: the machine was busy with other work during them (--outside-limit)`)
    }
    writeResult("cost", args, services, {
      summary,
      config: { ...config, clock, server: local ? "own (track_commit_timestamp=on)" : "services" },
      results: runs,
    })
  }),
)

function roundRatio(v: number | undefined): number | undefined {
  return v === undefined ? undefined : round(v, 2)
}

const TICK_FIELDS = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"] as const

/** The first line of /proc/stat, in ticks per kind; undefined off Linux. */
const machineTicks = (): number[] | undefined => {
  try {
    const line = readFileSync("/proc/stat", "utf8").split("\n")[0]!
    return line
      .trim()
      .split(/\s+/)
      .slice(1, 1 + TICK_FIELDS.length)
      .map(Number)
  } catch {
    return undefined
  }
}

const machineUse = (
  from: number[] | undefined,
  to: number[] | undefined,
  seconds: number,
): Record<string, number> | undefined => {
  if (from === undefined || to === undefined) return undefined
  // Ticks are USER_HZ (100 on Linux) whatever the kernel's HZ.
  return Object.fromEntries(
    TICK_FIELDS.map((name, i) => [name, round(((to[i] ?? 0) - (from[i] ?? 0)) / 100 / seconds, 3)]),
  )
}

/** Whether a process (a child we started) still runs; a reaped child is gone. */
const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

async function runOnce(
  repeat: number,
  pipeline: Pipeline,
  topology: Topology,
  load: Load,
  serverUrl: string,
  amqpUrl: string,
  meter: CpuMeter,
): Promise<{ run: Run; clock: "commit" | "insert" }> {
  const label = `${config.rounds > 1 ? `#${repeat} ` : ""}${pipeline} ${topology.name} ${load === "max" ? "flat out" : `${load}/s`}${config.pooler === "direct" ? "" : ` via ${config.pooler}`}`
  const bench = await createBenchDatabase(serverUrl, "cost")
  if (config.partitions > 0) await dayPartitions(bench.db, config.partitions)
  const pooled = /^pgbouncer(?::(\d+))?$/.exec(config.pooler)
  if (config.pooler !== "direct" && pooled === null)
    throw new Error(`--pooler: ${config.pooler} (direct, pgbouncer or pgbouncer:N)`)
  const bouncer = pooled ? await startPgBouncer(bench.url, { poolSize: Number(pooled[1] ?? 8) }) : undefined
  // Where the parties' pools connect; LISTEN always goes straight to the database.
  const dbUrl = bouncer?.url ?? bench.url
  const exchange = uniqueName(`bench.cost.${pipeline}`)
  const consumer = uniqueName(`cost-${pipeline}`)
  const children: Array<Child<{ readonly event: string }>> = []
  try {
    const track = await sql<{ setting: string }>`
      SELECT setting FROM pg_settings WHERE name = 'track_commit_timestamp'`.execute(bench.db)
    const clock: "commit" | "insert" = track.rows[0]?.setting === "on" ? "commit" : "insert"
    // e2e.ts's order table and handler effect table; the hand-written outbox's tables.
    await bench.sql.unsafe(`${PIPELINE_TABLES_SQL}${HAND_SCHEMA_SQL}`)

    // Inboxes first: the queue must exist before anything is published.
    const inboxes = Array.from({ length: topology.inboxes }, () =>
      pipeline === "hand"
        ? spawnChild<InboxLine>("handInboxProcess.ts", {
            DB_URL: dbUrl,
            AMQP_URL: amqpUrl,
            EXCHANGE: exchange,
            QUEUE: consumer,
            STATS_MS: "100",
          })
        : spawnChild<InboxLine>(
            "inboxProcess.ts",
            defaultInboxEnv({ dbUrl, listenUrl: bench.url, amqpUrl, exchange, consumer, statsMs: 100 }),
          ),
    )
    children.push(...inboxes)
    await Promise.all(inboxes.map((c) => c.ready))
    const relays = Array.from({ length: topology.relays }, () =>
      spawnChild<RelayStatsLine>(
        pipeline === "hand" ? "handRelayProcess.ts" : "relayProcess.ts",
        pipeline === "hand"
          ? { DB_URL: dbUrl, AMQP_URL: amqpUrl, EXCHANGE: exchange, STATS_MS: "1000" }
          : {
              ...defaultRelayEnv({ dbUrl, listenUrl: bench.url, amqpUrl, exchange }),
              ...(pipeline === "txbox-wal" ? { SOURCE: "wal" } : {}),
              ...(config.batchEveryMs === undefined ? {} : { BATCH_EVERY: String(config.batchEveryMs) }),
            },
      ),
    )
    children.push(...relays)
    const producer = spawnChild<ProducerLine>("producerProcess.ts", {
      DB_URL: dbUrl,
      CONNECTIONS: String(config.connections),
      INDEX: "0",
      PROCESSES: "1",
      KEYED: "0",
    })
    children.push(producer)
    await Promise.all([...relays.map((c) => c.ready), producer.ready])
    for (const relay of relays) relay.send("go")
    await Promise.all(
      relays.map((relay) => relay.waitFor("the relay to start", (line) => line.event === "stats", 30_000)),
    )
    // The kernel writes earlier runs' dirty pages back (PostgreSQL's files, the dropped database)
    // in threads of its own, which would show as "other" in this run: flush them first.
    try {
      execFileSync("sync")
    } catch {}
    // Let start-up work (first claims, LISTEN, JIT of the idle path) settle before the clock runs.
    await sleep(300)
    const pids = [producer.pid, ...relays.map((c) => c.pid), ...inboxes.map((c) => c.pid)]
    const handledByStats = () =>
      inboxes.reduce((a, c) => {
        const line = [...c.lines].reverse().find((l) => l.processed !== undefined)
        return a + (line?.processed ?? 0) + (line?.dead ?? 0)
      }, 0)
    const drained = (label: string, count: number) =>
      until(
        `${label}: all ${count} messages handled`,
        () => {
          for (const c of children) {
            if (!alive(c.pid)) throw new Error(`${label}: a child process (pid ${c.pid}) exited`)
          }
          return handledByStats() >= count
        },
        config.drainTimeoutMs,
        10,
      ).catch((error: Error) => {
        throw new Error(`${error.message} (the inboxes report ${handledByStats()})`)
      })
    const mode = pipeline === "hand" ? "hand" : pipeline === "txbox-kysely" ? "enqueue-kysely" : "enqueue"
    const rate = load === "max" ? 0 : load
    // An unmeasured producer run (its orders' run number is never 1), drained before the next step.
    let warmed = 0
    const unmeasured = async (run: number, what: string, runRate: number, seconds: number) => {
      producer.send(JSON.stringify({ cmd: "run", run, mode, rate: runRate, seconds }))
      const done = await producer.waitFor(
        `${label}: ${what}`,
        (line) => line.event === "done" && line.run === run,
        seconds * 1000 + 60_000,
      )
      warmed += done.transactions ?? 0
      await drained(`${label} ${what}`, warmed)
    }
    if (config.warmupSeconds > 0) {
      await unmeasured(0, "the warm-up", 0, config.warmupSeconds)
      await sleep(200)
    }
    if (rate > 0 && config.settleSeconds > 0)
      await unmeasured(2, "the settling run", rate, config.settleSeconds)

    await sleep(1100)
    await statementsReset(serverUrl)
    const databaseBefore = await databaseSample(bench.db)
    // The relays' claims so far (each reports every STATS_MS): txbox's only, the hand-written relay counts none.
    const claimsSoFar = () => {
      let claims = 0
      let batches = 0
      for (const relay of relays) {
        const last = relay.lines.findLast((line) => line.event === "stats")
        if (last?.claims === undefined) return undefined
        claims += last.claims
        batches += last.batches
      }
      return { claims, batches, at: performance.now() }
    }
    type ClaimsSoFar = ReturnType<typeof claimsSoFar>
    const claimsBefore = claimsSoFar()
    // The share of the claims between two readings that found nothing (none made: undefined).
    const emptyShare = (from: ClaimsSoFar, to: ClaimsSoFar) =>
      from === undefined || to === undefined || to.claims === from.claims
        ? undefined
        : 1 - (to.batches - from.batches) / (to.claims - from.claims)
    // The steady part of the run: its first seconds come from idle (the producers' NOTIFY wakes a
    // worker in every relay process, and all but one find nothing), its drain goes back to idle.
    let steadyFrom: ClaimsSoFar
    const steadyTimer = setTimeout(() => {
      steadyFrom = claimsSoFar()
    }, STEADY_AFTER_MS)
    // The clients' JIT compiler threads: part of their CPU above, shown apart (JIT column).
    // (A compiler thread that exits in between takes its time with it: a lower bound.)
    const compiling = () => new Map(pids.flatMap((pid) => [...threadSeconds(pid, "JITWorker")]))
    const compilingBefore = compiling()
    // …and their allocator's background thread (Bun's mimalloc returning freed pages to the system).
    const purging = () => new Map(pids.flatMap((pid) => [...threadSeconds(pid, "mi-scavenger")]))
    const purgingBefore = purging()
    // The WAL relay's slot: the WAL sender decodes every transaction of the database for it.
    const senderPid =
      pipeline === "txbox-wal"
        ? (
            await sql<{
              pid: number
            }>`SELECT pid FROM pg_stat_replication WHERE pid IS NOT NULL LIMIT 1`.execute(bench.db)
          ).rows[0]?.pid
        : undefined
    const senderBefore = senderPid === undefined ? undefined : treeSeconds(senderPid)
    const before = meter.sample(pids)
    const machineBefore = machineTicks()
    producer.send(JSON.stringify({ cmd: "run", run: 1, mode, rate, seconds: config.seconds }))
    const done = await producer.waitFor(
      `${label}: the producer`,
      (line) => line.event === "done" && line.run === 1,
      config.seconds * 1000 + 60_000,
    )
    clearTimeout(steadyTimer)
    const steadyTo = claimsSoFar()
    if ((done.errors ?? 0) > 0)
      throw new Error(`${label}: ${done.errors} producer transactions failed: ${done.firstError}`)
    const committed = done.transactions ?? 0
    // Every committed message handled: the inboxes' counters (no database queries while the clock
    // runs), then the tables.
    await drained(label, warmed + committed)
    const count = async () => {
      const r = await sql<{ handled: string }>`SELECT count(*) AS handled FROM bench.handled`.execute(
        bench.db,
      )
      return Number(r.rows[0]!.handled)
    }
    await until(
      `${label}: bench.handled to hold ${committed} rows`,
      async () => (await count()) >= warmed + committed,
      10_000,
    )
    const cpu = meter.use(before, meter.sample(pids))
    const senderAfter = senderPid === undefined ? undefined : treeSeconds(senderPid)
    const compiled = threadsUsed(compilingBefore, compiling())
    const purged = threadsUsed(purgingBefore, purging())
    const machine = machineUse(machineBefore, machineTicks(), cpu.seconds)
    const claimsAfter = claimsSoFar()
    const claimed =
      claimsBefore === undefined || claimsAfter === undefined || claimsAfter.claims === claimsBefore.claims
        ? undefined
        : {
            perSecond:
              ((claimsAfter.claims - claimsBefore.claims) * 1000) / (claimsAfter.at - claimsBefore.at),
            empty: emptyShare(claimsBefore, claimsAfter)!,
            steadyEmpty: emptyShare(steadyFrom, steadyTo),
          }
    // Backends publish their counters within a second of their last transaction.
    await sleep(1100)
    const databaseAfter = await databaseSample(bench.db)
    await statementsWrite(serverUrl, label, committed)
    const database: DatabaseWork = {
      transactions: (databaseAfter.transactions - databaseBefore.transactions) / Math.max(1, committed),
      walBytes: (databaseAfter.walBytes - databaseBefore.walBytes) / Math.max(1, committed),
      rowWrites: (databaseAfter.rowWrites - databaseBefore.rowWrites) / Math.max(1, committed),
    }

    // Exactly once: one effect per order, none without an order.
    const check = await sql<{
      orders: string
      handled: string
      distinct: string
      missing: string
      stray: string
    }>`
      SELECT (SELECT count(*) FROM orders WHERE run = 1) AS orders,
             (SELECT count(*) FROM bench.handled) AS handled,
             (SELECT count(DISTINCT serial) FROM bench.handled) AS distinct,
             (SELECT count(*) FROM orders o WHERE o.run = 1 AND NOT EXISTS (SELECT 1 FROM bench.handled h WHERE h.serial = o.serial)) AS missing,
             (SELECT count(*) FROM bench.handled h WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.serial = h.serial)) AS stray`.execute(
      bench.db,
    )
    const c = check.rows[0]!
    const orders = Number(c.orders)
    const problems = [
      orders !== committed ? `${orders} orders in the table, the producer committed ${committed}` : "",
      Number(c.missing) > 0 ? `${c.missing} orders never handled` : "",
      Number(c.handled) > Number(c.distinct)
        ? `${Number(c.handled) - Number(c.distinct)} orders handled more than once`
        : "",
      Number(c.stray) > 0 ? `${c.stray} handler rows without an order` : "",
    ].filter((p) => p !== "")
    if (problems.length > 0) throw new Error(`${label}: ${problems.join("; ")}`)

    const commitOf = (alias: string) =>
      clock === "commit" ? sql.raw(`pg_xact_commit_timestamp(${alias}.xmin)`) : sql.raw(`${alias}.created_at`)
    const handledAt =
      clock === "commit" ? sql.raw("pg_xact_commit_timestamp(h.xmin)") : sql.raw("h.handled_at")
    const stats = await sql<{ p: number[] | null; drain: number | null }>`
      SELECT percentile_disc(ARRAY[0.5, 0.99, 1]) WITHIN GROUP (ORDER BY extract(epoch FROM ${handledAt} - ${commitOf("o")}) * 1000) AS p,
             extract(epoch FROM max(${handledAt}) - max(${commitOf("o")})) AS drain
      FROM orders o JOIN bench.handled h USING (serial) WHERE o.run = 1`.execute(bench.db)
    if (LATENCY_SPLIT && pipeline !== "hand" && clock === "commit") {
      // Per message, from the order's commit: to the inbox transaction's start (the inbox row's
      // received_at is its transaction's now(): the relay's wait for a look, its publish, the
      // broker, the delivery), then to the handler's commit; and, apart, to the commit of the
      // relay's mark (on node-postgres it rides with the relay's next look: MARK_WAIT_MS at most).
      // Not from the claim: a held claim's mark stamps published_at with its own statement's time.
      const split = await sql<{ arrive: number[]; inbox: number[]; marked: number[]; stamped: number[] }>`
        SELECT percentile_disc(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM i.received_at - pg_xact_commit_timestamp(o.xmin)) * 1000) AS arrive,
               percentile_disc(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM pg_xact_commit_timestamp(h.xmin) - i.received_at) * 1000) AS inbox,
               percentile_disc(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM pg_xact_commit_timestamp(x.xmin) - pg_xact_commit_timestamp(o.xmin)) * 1000) AS marked,
               percentile_disc(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM x.published_at - pg_xact_commit_timestamp(o.xmin)) * 1000) AS stamped
        FROM orders o JOIN bench.handled h USING (serial)
          JOIN txbox.outbox x ON (x.payload ->> 'serial')::int = o.serial
          JOIN txbox.inbox i ON i.message_id = x.id::text
        WHERE o.run = 1`.execute(bench.db)
      const r = split.rows[0]!
      const text = (xs: number[]) => xs.map((x) => Number(x).toFixed(1)).join(" / ")
      log(
        `${label}: latency split p50 / p90 / p99 ms: commit → inbox transaction start ${text(r.arrive)}; ` +
          `its start → handler commit ${text(r.inbox)}; commit → relay's mark committed ${text(r.marked)}; ` +
          `commit → published_at (the mark's statement, after the broker's confirm) ${text(r.stamped)}`,
      )
      // The tail, by when it happened: the seconds of the run whose messages took longest, and
      // where their time went (a stall of the whole pipeline, or one part of it).
      const worst = await sql<{
        second: string
        slow: string
        max_ms: number
        arrive_ms: number
        inbox_ms: number
      }>`
        SELECT to_char(date_trunc('second', pg_xact_commit_timestamp(o.xmin)), 'HH24:MI:SS') AS second,
               count(*) FILTER (WHERE pg_xact_commit_timestamp(h.xmin) - pg_xact_commit_timestamp(o.xmin) > interval '50 ms') AS slow,
               max(extract(epoch FROM pg_xact_commit_timestamp(h.xmin) - pg_xact_commit_timestamp(o.xmin)) * 1000) AS max_ms,
               max(extract(epoch FROM i.received_at - pg_xact_commit_timestamp(o.xmin)) * 1000) AS arrive_ms,
               max(extract(epoch FROM pg_xact_commit_timestamp(h.xmin) - i.received_at) * 1000) AS inbox_ms
        FROM orders o JOIN bench.handled h USING (serial)
          JOIN txbox.outbox x ON (x.payload ->> 'serial')::int = o.serial
          JOIN txbox.inbox i ON i.message_id = x.id::text
        WHERE o.run = 1 GROUP BY 1 ORDER BY 3 DESC LIMIT 6`.execute(bench.db)
      log(
        `${label}: slowest seconds (messages over 50 ms; max ms, of it max to the inbox transaction, max in it): ${worst.rows
          .map(
            (w) =>
              `${w.second} ${w.slow}; ${Number(w.max_ms).toFixed(0)}, ${Number(w.arrive_ms).toFixed(0)}, ${Number(w.inbox_ms).toFixed(0)}`,
          )
          .join(" | ")}`,
      )
    }
    const p = (stats.rows[0]!.p ?? []).map(Number)
    const drainSeconds = Math.max(0, Number(stats.rows[0]!.drain ?? 0))
    const producerSeconds = done.seconds ?? config.seconds
    const perMessage = (cores: number | undefined) =>
      cores === undefined || committed === 0 ? undefined : (cores * cpu.seconds * 1e6) / committed
    const sum = (xs: ReadonlyArray<number | undefined>) =>
      xs.some((x) => x === undefined) ? undefined : xs.reduce<number>((a, b) => a + b!, 0)
    const relayCores = sum(cpu.perChild.slice(1, 1 + topology.relays))
    const inboxCores = sum(cpu.perChild.slice(1 + topology.relays))
    const parties = [cpu.perChild[0], relayCores, inboxCores, cpu.postgres, cpu.rabbitmq]
    const total = sum(parties)
    const usPerMessage: Record<Party, number | undefined> = {
      producer: perMessage(cpu.perChild[0]),
      relay: perMessage(relayCores),
      inbox: perMessage(inboxCores),
      postgres: perMessage(cpu.postgres),
      rabbitmq: perMessage(cpu.rabbitmq),
      total: perMessage(total),
      // The machine's busy time the five did not use: the bench process, other people's work.
      other: perMessage(
        cpu.machineBusy === undefined || total === undefined
          ? undefined
          : Math.max(0, cpu.machineBusy - total),
      ),
      // Of producer + relay + inbox: JavaScriptCore compiling their code (Bun only; 0 under Node).
      jit: committed === 0 ? undefined : (compiled * 1e6) / committed,
      // Of producer + relay + inbox: the allocator's purge thread ("mi-scavenger"; Bun only).
      alloc: committed === 0 ? undefined : (purged * 1e6) / committed,
    }
    const run: Run = {
      round: repeat,
      pipeline,
      topology: topology.name,
      load,
      committed,
      producerSeconds,
      drainSeconds,
      e2eRate: committed / (producerSeconds + drainSeconds),
      p50: p[0] ?? Number.NaN,
      p99: p[1] ?? Number.NaN,
      max: p[2] ?? Number.NaN,
      txP50: done.p50 ?? Number.NaN,
      txP99: done.p99 ?? Number.NaN,
      usPerMessage,
      cpu,
      machine,
      database,
      claims: claimed,
      walSenderUs:
        senderBefore === undefined || senderAfter === undefined || committed === 0
          ? undefined
          : ((senderAfter - senderBefore) * 1e6) / committed,
    }
    log(
      `${label}: ${committed} messages, ${Math.round(run.e2eRate)} msg/s end to end (drain ${drainSeconds.toFixed(2)} s), ` +
        `p50 ${run.p50.toFixed(1)} ms, p99 ${run.p99.toFixed(1)} ms, ${usPerMessage.total === undefined ? "–" : Math.round(usPerMessage.total)} µs/msg, ` +
        `other ${cpu.machineBusy === undefined || total === undefined ? "–" : (cpu.machineBusy - total).toFixed(2)} cores` +
        (machine === undefined ? "" : ` (softirq ${machine.softirq}, steal ${machine.steal})`) +
        (run.walSenderUs === undefined
          ? ""
          : `; of PostgreSQL's CPU, its WAL sender ${Math.round(run.walSenderUs)} µs/msg`) +
        `; per message PostgreSQL ran ${database.transactions.toFixed(2)} transactions, wrote ${Math.round(database.walBytes)} B of WAL and ${database.rowWrites.toFixed(2)} rows` +
        (claimed === undefined
          ? ""
          : `; the relays claimed ${claimed.perSecond.toFixed(1)} times/s, ${Math.round(claimed.empty * 100)} % of them finding nothing${claimed.steadyEmpty === undefined ? "" : ` (${Math.round(claimed.steadyEmpty * 100)} % from ${STEADY_AFTER_MS / 1000} s in to the producer's end)`}`),
    )
    return { run, clock }
  } finally {
    for (const child of children.reverse()) await child.stop()
    await deleteTopology(amqpUrl, {
      queues:
        pipeline === "hand"
          ? [consumer]
          : [
              queueName(consumer),
              deadQueueName(consumer),
              ...Array.from({ length: defaultRetryPolicy.maxAttempts }, (_, i) =>
                delayQueueName(consumer, i + 1),
              ),
            ],
      exchanges: [exchange],
    })
    await bouncer?.stop()
    if (pipeline === "txbox-wal") await dropIdleSlots(bench.db)
    await bench.drop()
  }
}
