// Retention at scale (issue #26): removing a day of old rows by DELETE (what `txbox purge` does)
// against dropping the day's partitions (`txbox partitions drop`), while the whole pipeline runs at
// a steady rate beside it; then the same pipeline with a long REPEATABLE READ snapshot open.
//
//   bun bench/retention.ts [--rows 10000000] [--days 10] [--rate 300] [--window 20]
//                          [--snapshot 300] [--probes 300] [--quick]
//
// - The outbox and the inbox get `--days` partitions of past days, `--rows` sent outbox rows and as
//   many processed inbox rows over them (UUIDv7 ids of their day; the inbox's consumer is not the
//   bench's, so the running inbox never meets them).
// - One producer process at `--rate` msg/s, one relay and one inbox process (txbox's defaults), as
//   bench/cost.ts runs them. Windows of `--window` s: a quiet one; one during which a day's rows
//   are deleted in batches of 5,000 (`txbox purge`'s statement shape); one during which another
//   day's partitions are dropped; one with a REPEATABLE READ transaction opened `--snapshot` s
//   before it ends and held open. Per window: the pipeline's msg/s and its commit → handler p50/p99
//   (from the tables: pg_xact_commit_timestamp), and for the removals their time and WAL bytes.
// - The claim statement's mean time (pg_stat_statements) per window, and its p99 measured here by
//   running the relay's claim shape against the table (a probe that claims nothing due: it reads
//   the front of `outbox_due`), on the filled table with and without the snapshot and on an empty
//   table.
import { execFileSync } from "node:child_process"
import { Effect, Schedule } from "effect"
import { type Kysely, sql } from "kysely"
import postgres from "postgres"
import { RECENT_MS } from "../src/storage/sql/claimWindow.ts"
import { DAY_MS, idBound, partitionName } from "../src/storage/sql/partitionBounds.ts"
import { dropPartitions } from "../src/storage/sql/partitions.ts"
import { type LocalPostgres, startLocalPostgres } from "../test/support/postgres.ts"
import { uniqueName } from "./support/amqp.ts"
import {
  type Child,
  defaultInboxEnv,
  defaultRelayEnv,
  type ProducerLine,
  type RelayStatsLine,
  spawnChild,
} from "./support/children.ts"
import { createBenchDatabase, uuidv7Text } from "./support/db.ts"
import { PIPELINE_TABLES_SQL } from "./support/hand.ts"
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

const args = parseArgs()
const quick = args.quick
const config = {
  rows: args.number("rows", quick ? 60_000 : 10_000_000),
  days: args.number("days", quick ? 3 : 10),
  rate: args.number("rate", 300),
  windowSeconds: args.number("window", quick ? 4 : 20),
  snapshotSeconds: args.number("snapshot", quick ? 8 : 300),
  probes: args.number("probes", quick ? 40 : 300),
}

// biome-ignore lint/suspicious/noExplicitAny: the bench's own tables and txbox's, by name
type Db = Kysely<any>

interface InboxLine {
  readonly event: string
  readonly processed?: number
}

interface Window {
  readonly name: string
  readonly messages: number
  readonly rate: number
  readonly p50: number
  readonly p99: number
  readonly removalSeconds?: number
  readonly removalWalMb?: number
  readonly claimMeanMs?: number
}

const walLsn = async (db: Db): Promise<string> =>
  (await sql<{ lsn: string }>`SELECT pg_current_wal_lsn()::text AS lsn`.execute(db)).rows[0]!.lsn
const walSince = async (db: Db, from: string): Promise<number> =>
  Number(
    (await sql<{ b: string }>`SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), ${from})::text AS b`.execute(db))
      .rows[0]!.b,
  )

/** A past day's partitions of both tables, filled with `perDay` old rows each (SQL-made UUIDv7 ids of that day). */
const fillDay = async (db: Db, dayMs: number, perDay: number) => {
  for (const table of ["outbox", "inbox"] as const) {
    const name = partitionName(table, dayMs, DAY_MS)
    await sql
      .raw(
        `CREATE TABLE txbox.${name} (LIKE txbox.${table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
         ALTER TABLE txbox.${table} ATTACH PARTITION txbox.${name} FOR VALUES FROM ('${idBound(dayMs)}') TO ('${idBound(dayMs + DAY_MS)}')`,
      )
      .execute(db)
  }
  const ms = `(${dayMs}::bigint + (g * ${Math.floor(DAY_MS / perDay)})::bigint)`
  const v7 = uuidv7Text(ms)
  const at = `to_timestamp(${ms} / 1000.0)`
  await sql
    .raw(
      `INSERT INTO txbox.outbox (id, type, version, payload, status, occurred_at, visible_at, published_at)
       SELECT ${v7}::uuid, 'bench.old', 1, '{"orderId":"x","total":1}', 'sent', ${at}, ${at}, ${at}
       FROM generate_series(0, ${perDay - 1}) g`,
    )
    .execute(db)
  await sql
    .raw(
      `INSERT INTO txbox.inbox (message_id, consumer, type, version, status, received_at, visible_at, processed_at)
       SELECT ${v7}, 'old-consumer', 'bench.old', 1, 'processed', ${at}, ${at}, ${at}
       FROM generate_series(0, ${perDay - 1}) g`,
    )
    .execute(db)
}

/** `txbox purge`'s shape for one day's rows: batches of 5,000 by the partial indexes, until none is left. */
const deleteDay = async (db: Db, dayMs: number) => {
  const from = new Date(dayMs).toISOString()
  const to = new Date(dayMs + DAY_MS).toISOString()
  for (;;) {
    const r = await sql`WITH picked AS (SELECT id FROM txbox.outbox WHERE status = 'sent'
        AND published_at >= ${from}::timestamptz AND published_at < ${to}::timestamptz
        ORDER BY published_at LIMIT 5000 FOR UPDATE SKIP LOCKED)
      DELETE FROM txbox.outbox o USING picked WHERE o.id = picked.id`.execute(db)
    if (Number(r.numAffectedRows ?? 0) < 5000) break
  }
  for (;;) {
    const r =
      await sql`WITH picked AS (SELECT message_id, consumer FROM txbox.inbox WHERE status = 'processed'
        AND processed_at >= ${from}::timestamptz AND processed_at < ${to}::timestamptz
        ORDER BY processed_at LIMIT 5000 FOR UPDATE SKIP LOCKED)
      DELETE FROM txbox.inbox i USING picked WHERE i.message_id = picked.message_id AND i.consumer = picked.consumer`.execute(
        db,
      )
    if (Number(r.numAffectedRows ?? 0) < 5000) break
  }
}

/**
 * The relay's claim shapes, probing the front of the due rows: what a claim pays before it finds a
 * row. `sinceMs`: a full claim (undefined) walks `outbox_due` from its oldest entry; a bounded one
 * (storage/sql/claimWindow.ts) from `now() - sinceMs`.
 */
const claimProbeMs = async (
  url: string,
  count: number,
  sinceMs?: number,
): Promise<{ p50: number; p99: number }> => {
  const client = postgres(url, { max: 1, onnotice: () => {} })
  const times: number[] = []
  const bound = sinceMs === undefined ? "" : `AND visible_at >= now() - ${sinceMs} * interval '1 millisecond'`
  try {
    for (let i = 0; i < count; i++) {
      const started = performance.now()
      await client
        .begin(async (tx) => {
          await tx.unsafe(`SELECT id FROM txbox.outbox WHERE status = 'pending' AND visible_at <= now() ${bound}
          ORDER BY visible_at LIMIT 100 FOR UPDATE SKIP LOCKED`)
          await tx.unsafe("ROLLBACK")
        })
        .catch(() => {})
      times.push(performance.now() - started)
      await sleep(20)
    }
  } finally {
    await client.end({ timeout: 5 })
  }
  return { p50: round(percentile(times, 50), 2), p99: round(percentile(times, 99), 2) }
}

const claimMeanMs = async (db: Db): Promise<number | undefined> => {
  try {
    const r = await sql<{ mean: number }>`SELECT sum(total_exec_time) / nullif(sum(calls), 0) AS mean
      FROM pg_stat_statements WHERE query ILIKE '%skip locked%' AND query ILIKE '%"outbox"%'
        AND query NOT ILIKE '%picked%' AND query NOT ILIKE '%pg_stat_statements%'`.execute(db)
    await sql`SELECT pg_stat_statements_reset()`.execute(db)
    const mean = r.rows[0]?.mean
    return mean === null || mean === undefined ? undefined : round(Number(mean), 3)
  } catch {
    return undefined
  }
}

main(() =>
  withServices(async (services) => {
    let local: LocalPostgres | undefined
    local = await startLocalPostgres({ name: "bench-retention" })
    const admin = postgres(local.url, { max: 1, onnotice: () => {} })
    await admin.unsafe(`ALTER SYSTEM SET track_commit_timestamp = 'on'`)
    await admin.unsafe(`ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'`)
    await admin.end({ timeout: 5 })
    await local.restart()
    const children: Array<Child<{ readonly event: string }>> = []
    try {
      const bench = await createBenchDatabase(local.url, "retention")
      const db = bench.db
      await sql`CREATE EXTENSION IF NOT EXISTS pg_stat_statements`.execute(db)
      await bench.sql.unsafe(PIPELINE_TABLES_SQL)

      const emptyClaim = await claimProbeMs(bench.url, config.probes)
      log(`claim probe on an empty table: p50 ${emptyClaim.p50} ms, p99 ${emptyClaim.p99} ms`)

      const today = Math.floor(Date.now() / DAY_MS) * DAY_MS
      const perDay = Math.floor(config.rows / config.days)
      const filling = performance.now()
      for (let d = 0; d < config.days; d++) {
        await fillDay(db, today - (config.days + 2 - d) * DAY_MS, perDay)
        log(`filled day ${d + 1} of ${config.days} (${perDay} outbox + ${perDay} inbox rows)`)
      }
      await sql`VACUUM ANALYZE txbox.outbox`.execute(db)
      await sql`VACUUM ANALYZE txbox.inbox`.execute(db)
      log(`filled ${perDay * config.days} rows per table in ${round((performance.now() - filling) / 1000)} s`)
      const fullClaim = await claimProbeMs(bench.url, config.probes)
      log(
        `claim probe with ${perDay * config.days} sent rows: p50 ${fullClaim.p50} ms, p99 ${fullClaim.p99} ms`,
      )

      const exchange = uniqueName("bench.retention")
      const consumer = uniqueName("retention")
      const inbox = spawnChild<InboxLine>(
        "inboxProcess.ts",
        defaultInboxEnv({
          dbUrl: bench.url,
          listenUrl: bench.url,
          amqpUrl: services.amqpUrl,
          exchange,
          consumer,
          statsMs: 500,
        }),
      )
      children.push(inbox)
      await inbox.ready
      const relay = spawnChild<RelayStatsLine>(
        "relayProcess.ts",
        defaultRelayEnv({ dbUrl: bench.url, listenUrl: bench.url, amqpUrl: services.amqpUrl, exchange }),
      )
      children.push(relay)
      const producer = spawnChild<ProducerLine>("producerProcess.ts", {
        DB_URL: bench.url,
        CONNECTIONS: "4",
        INDEX: "0",
        PROCESSES: "1",
        KEYED: "0",
      })
      children.push(producer)
      await Promise.all([relay.ready, producer.ready])
      relay.send("go")
      await relay.waitFor("the relay to start", (line) => line.event === "stats", 30_000)

      let run = 0
      /** One window: the producer at the rate for the window, `during` beside it; figures from the tables. */
      const window = async (name: string, during?: () => Promise<void>): Promise<Window> => {
        run++
        await claimMeanMs(db)
        producer.send(
          JSON.stringify({
            cmd: "run",
            run,
            mode: "enqueue",
            rate: config.rate,
            seconds: config.windowSeconds,
          }),
        )
        let removalSeconds: number | undefined
        let removalWalMb: number | undefined
        if (during !== undefined) {
          await sleep(2000)
          const started = performance.now()
          const before = await walLsn(db)
          await during()
          removalSeconds = round((performance.now() - started) / 1000, 2)
          removalWalMb = round((await walSince(db, before)) / 1e6, 1)
        }
        const done = await producer.waitFor(
          `${name}: the producer`,
          (l) => l.event === "done" && (l as unknown as { run: number }).run === run,
          (config.windowSeconds + 600) * 1000,
        )
        const sent = (done as unknown as { transactions: number }).transactions
        const deadline = Date.now() + 120_000
        for (;;) {
          const h = await sql<{
            n: string
          }>`SELECT count(*)::text AS n FROM orders o JOIN bench.handled h USING (serial) WHERE o.run = ${run}`.execute(
            db,
          )
          if (Number(h.rows[0]!.n) >= sent || Date.now() > deadline) break
          await sleep(250)
        }
        const stats = await sql<{ p: number[] | null; n: string; span: number | null }>`
          SELECT percentile_disc(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM pg_xact_commit_timestamp(h.xmin) - pg_xact_commit_timestamp(o.xmin)) * 1000) AS p,
                 count(*)::text AS n,
                 extract(epoch FROM max(pg_xact_commit_timestamp(h.xmin)) - min(pg_xact_commit_timestamp(o.xmin))) AS span
          FROM orders o JOIN bench.handled h USING (serial) WHERE o.run = ${run}`.execute(db)
        const s = stats.rows[0]!
        const w: Window = {
          name,
          messages: Number(s.n),
          rate: round(Number(s.n) / Math.max(Number(s.span ?? 1), config.windowSeconds), 1),
          p50: round(s.p?.[0] ?? 0, 1),
          p99: round(s.p?.[1] ?? 0, 1),
          ...(removalSeconds === undefined ? {} : { removalSeconds }),
          ...(removalWalMb === undefined ? {} : { removalWalMb }),
          ...(await claimMeanMs(db).then((m) => (m === undefined ? {} : { claimMeanMs: m }))),
        }
        log(`${name}: ${JSON.stringify(w)}`)
        return w
      }

      const windows: Window[] = []
      // Start-up (first claims, JIT) out of the figures.
      await window("warm-up")
      windows.push(await window("quiet"))
      windows.push(await window("DELETE a day (batches of 5,000)", () => deleteDay(db, today - 3 * DAY_MS)))
      windows.push(await window("quiet, after the DELETE"))
      windows.push(
        await window("DROP a day's partitions", async () => {
          // The oldest day, alone: its range ended at `end`; the next day's ends a day later.
          const end = today - (config.days + 1) * DAY_MS
          // A drop waits 250 ms at most for its lock and then gives up, as retention's pass does:
          // tried again, as the next pass would.
          const drop = dropPartitions(
            { db, schema: "txbox" },
            { olderThanMs: Date.now() - end - 60_000, dedupeWindowMs: 0 },
          ).pipe(
            Effect.tapError((e) => Effect.sync(() => log(`drop: ${e.message}; trying again`))),
            Effect.retry({ times: 20, schedule: Schedule.spaced("200 millis") }),
          )
          const decisions = await Effect.runPromise(drop)
          log(
            `dropped ${decisions
              .filter((d) => d.dropped)
              .map((d) => d.name)
              .join(", ")}`,
          )
        }),
      )
      // The long snapshot: opened, held through a window, closed.
      const holder = postgres(bench.url, { max: 1, onnotice: () => {} })
      const reserved = await holder.reserve()
      await reserved.unsafe("BEGIN ISOLATION LEVEL REPEATABLE READ")
      await reserved.unsafe("SELECT count(*) FROM txbox.partition_counters")
      const held = performance.now()
      log(`a REPEATABLE READ snapshot is open; the pipeline runs beside it for ${config.snapshotSeconds} s`)
      // The pipeline runs through the whole snapshot: windows back to back until it is that old.
      let last: Window | undefined
      while ((performance.now() - held) / 1000 < config.snapshotSeconds)
        last = await window("under the snapshot")
      if (last !== undefined)
        windows.push({ ...last, name: `with a ${config.snapshotSeconds} s snapshot (last window)` })
      const snapshotClaim = await claimProbeMs(bench.url, config.probes)
      const snapshotBounded = await claimProbeMs(bench.url, config.probes, RECENT_MS)
      await reserved.unsafe("ROLLBACK")
      reserved.release()
      await holder.end({ timeout: 5 })

      const header = [
        "window",
        "messages",
        "msg/s",
        "p50 ms",
        "p99 ms",
        "removal s",
        "removal WAL MB",
        "claim mean ms",
      ]
      printTable(
        `Retention beside a running pipeline: ${perDay * config.days} old rows per table over ${config.days} day partitions, ${config.rate} msg/s offered, windows of ${config.windowSeconds} s`,
        header,
        windows.map((w) => [
          w.name,
          w.messages,
          w.rate,
          w.p50,
          w.p99,
          w.removalSeconds,
          w.removalWalMb,
          w.claimMeanMs,
        ]),
      )
      printTable(
        `The claim's probe (the relay's claim shapes; ${config.probes} runs each)`,
        ["table", "p50 ms", "p99 ms", "p99 / empty"],
        [
          ["empty", emptyClaim.p50, emptyClaim.p99, 1],
          [
            `${perDay * config.days} sent rows`,
            fullClaim.p50,
            fullClaim.p99,
            round(fullClaim.p99 / emptyClaim.p99, 2),
          ],
          [
            `${perDay * config.days} sent rows, a ${config.snapshotSeconds} s snapshot open: full claim`,
            snapshotClaim.p50,
            snapshotClaim.p99,
            round(snapshotClaim.p99 / emptyClaim.p99, 2),
          ],
          [
            `… the same, a claim looking back ${RECENT_MS / 1000} s`,
            snapshotBounded.p50,
            snapshotBounded.p99,
            round(snapshotBounded.p99 / emptyClaim.p99, 2),
          ],
        ],
      )
      const quietP99 = windows[0]!.p99
      writeResult("retention", args, services, {
        summary: {
          deleteSeconds: windows[1]!.removalSeconds ?? 0,
          deleteWalMb: windows[1]!.removalWalMb ?? 0,
          deleteP99x: round(windows[1]!.p99 / quietP99, 2),
          dropSeconds: windows[3]!.removalSeconds ?? 0,
          dropWalMb: windows[3]!.removalWalMb ?? 0,
          dropP99x: round(windows[3]!.p99 / quietP99, 2),
          claimP99xEmpty: round(snapshotClaim.p99 / emptyClaim.p99, 2),
          boundedClaimP99xEmpty: round(snapshotBounded.p99 / emptyClaim.p99, 2),
        },
        config,
        results: {
          windows,
          claim: { empty: emptyClaim, full: fullClaim, snapshot: snapshotClaim, snapshotBounded },
        },
      })
      for (const c of children) await c.stop()
      await bench.drop()
    } finally {
      for (const c of children) await c.stop().catch(() => 0)
      try {
        execFileSync("sync")
      } catch {}
      await local?.stop()
      local = undefined
    }
  }),
)
