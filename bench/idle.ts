// What a relay costs with nothing to do (issue #27): one relay process with txbox's defaults, the
// polling source against the WAL source, on an empty outbox, CPU from /proc for the relay and for
// PostgreSQL (and what the WAL slot holds at the end). A PostgreSQL of the bench's own with
// wal_level = logical, for both sources. Source "inbox": one idle consumer process instead (an
// idempotent inbox with the defaults, nothing published), what each consumer process costs with
// nothing to do (issue #25). Sources "hand-relay" and "hand-inbox": bench/cost.ts's hand-written
// relay and inbox (support/hand*.ts), the floor a process with no timers of its own sits on.
//
//   bun bench/idle.ts [--quick] [--seconds 30] [--settle 5] [--sources poll,wal,inbox,hand-relay,hand-inbox]

import { startLocalPostgres } from "../test/support/postgres.ts"
import { deleteTopology, uniqueName } from "./support/amqp.ts"
import { defaultInboxEnv, defaultRelayEnv, type RelayStatsLine, spawnChild } from "./support/children.ts"
import { cpuMeter, portOf } from "./support/cpu.ts"
import { createBenchDatabase } from "./support/db.ts"
import { HAND_SCHEMA_SQL, PIPELINE_TABLES_SQL } from "./support/hand.ts"
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
const config = {
  seconds: args.number("seconds", quick ? 3 : 30),
  settleSeconds: args.number("settle", quick ? 1 : 5),
  sources: args.string("sources", "poll,wal,inbox,hand-relay,hand-inbox").split(",") as Array<Source>,
}

type Source = "poll" | "wal" | "inbox" | "hand-relay" | "hand-inbox"

interface Row {
  readonly source: string
  /** CPU ms per second of wall time. */
  readonly relayMsPerS: number | undefined
  readonly postgresMsPerS: number | undefined
  /** The relay's claims (a consumer's processor does not count its own). */
  readonly claims: number | undefined
  readonly retainedBytes: number | undefined
}

main(() =>
  withServices(async (services) => {
    const local = await startLocalPostgres({ name: "bench-idle", settings: ["wal_level = logical"] })
    const rows: Row[] = []
    try {
      const meter = cpuMeter({ postgresPort: portOf(local.url), rabbitPort: portOf(services.amqpUrl) })
      for (const source of config.sources) {
        const bench = await createBenchDatabase(local.url, `idle_${source}`)
        const exchange = uniqueName("bench_idle")
        const handQueue = uniqueName("bench_idle_hand")
        if (source.startsWith("hand-")) await bench.sql.unsafe(`${PIPELINE_TABLES_SQL}${HAND_SCHEMA_SQL}`)
        const relay =
          source === "hand-relay"
            ? spawnChild<RelayStatsLine>("handRelayProcess.ts", {
                DB_URL: bench.url,
                AMQP_URL: services.amqpUrl,
                EXCHANGE: exchange,
                STATS_MS: "1000",
              })
            : source === "hand-inbox"
              ? spawnChild<RelayStatsLine>("handInboxProcess.ts", {
                  DB_URL: bench.url,
                  AMQP_URL: services.amqpUrl,
                  EXCHANGE: exchange,
                  QUEUE: handQueue,
                  STATS_MS: "1000",
                })
              : source === "inbox"
                ? spawnChild<RelayStatsLine>(
                    "inboxProcess.ts",
                    defaultInboxEnv({
                      dbUrl: bench.url,
                      listenUrl: bench.url,
                      amqpUrl: services.amqpUrl,
                      exchange,
                      consumer: uniqueName("bench_idle_inbox"),
                      statsMs: 1000,
                    }),
                  )
                : spawnChild<RelayStatsLine>("relayProcess.ts", {
                    ...defaultRelayEnv({
                      dbUrl: bench.url,
                      listenUrl: bench.url,
                      amqpUrl: services.amqpUrl,
                      exchange,
                    }),
                    ...(source === "wal" ? { SOURCE: "wal" } : {}),
                  })
        try {
          await relay.ready
          // An inbox consumes once subscribed (its ready line); a relay waits for the word.
          if (!source.endsWith("inbox")) relay.send("go")
          await relay.waitFor("the process to start", (line) => line.event === "stats", 30_000)
          await sleep(config.settleSeconds * 1000)
          const claimsBefore = relay.latest()?.claims ?? 0
          const from = meter.sample([relay.pid])
          await sleep(config.seconds * 1000)
          const to = meter.sample([relay.pid])
          const use = meter.use(from, to)
          const retained = await bench.sql<{ bytes: number | null }[]>`
            SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::float8 AS bytes
            FROM pg_replication_slots WHERE database = current_database()`
          const row: Row = {
            source,
            relayMsPerS: use.perChild[0] === undefined ? undefined : use.perChild[0] * 1000,
            postgresMsPerS: use.postgres === undefined ? undefined : use.postgres * 1000,
            claims:
              source !== "poll" && source !== "wal"
                ? undefined
                : (relay.latest()?.claims ?? 0) - claimsBefore,
            retainedBytes: retained[0]?.bytes ?? undefined,
          }
          rows.push(row)
          log(
            `${source}: relay ${round(row.relayMsPerS ?? Number.NaN, 2)} ms/s, PostgreSQL ${round(row.postgresMsPerS ?? Number.NaN, 2)} ms/s, ` +
              `${row.claims ?? "-"} claims in ${config.seconds} s`,
          )
        } finally {
          await relay.stop()
          if (source === "wal") {
            await bench.sql`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
              WHERE NOT active AND database = current_database()`.catch(() => undefined)
          }
          await deleteTopology(services.amqpUrl, {
            queues: source === "hand-inbox" ? [handQueue] : [],
            exchanges: [exchange],
          })
          await bench.drop()
        }
      }
    } finally {
      await local.stop()
    }
    printTable(
      `An idle relay (empty outbox) or consumer, txbox's defaults, ${config.seconds} s: CPU ms per second of wall time`,
      ["source", "process ms/s", "PostgreSQL ms/s", "claims", "slot retains B"],
      rows.map((r) => [
        r.source,
        r.relayMsPerS === undefined ? undefined : round(r.relayMsPerS, 2),
        r.postgresMsPerS === undefined ? undefined : round(r.postgresMsPerS, 2),
        r.claims ?? "-",
        r.retainedBytes === undefined ? "-" : Math.round(r.retainedBytes),
      ]),
    )
    const summary: Record<string, number> = {}
    for (const r of rows) {
      if (r.relayMsPerS !== undefined) summary[`${r.source}_relay_ms_per_s`] = round(r.relayMsPerS, 2)
      if (r.postgresMsPerS !== undefined)
        summary[`${r.source}_postgres_ms_per_s`] = round(r.postgresMsPerS, 2)
    }
    writeResult("idle", args, services, { summary, config, results: rows })
  }),
)
