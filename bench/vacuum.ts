// Autovacuum on a queue partition (issue #26, "per-table autovacuum settings where the defaults do
// not fit a queue table"): the partition of the day as a relay churns it, with PostgreSQL's
// default autovacuum settings and with the ones txbox gives its partitions (QUEUE_PARTITION_SETTINGS).
//
//   bun bench/vacuum.ts [--rows 3000000] [--rate 2000] [--seconds 240] [--quick]
//
// For each setting, on a database of its own on one local PostgreSQL 15 (autovacuum at its
// defaults otherwise: naptime 1 min):
// - today's outbox partition holds `--rows` sent rows already (a day partition late in its day);
// - for `--seconds`, `--rate` messages/s go through it in the relay's statement shapes: an INSERT
//   of pending rows (the producers), a `FOR UPDATE SKIP LOCKED` claim of the due ones and an
//   UPDATE of them to sent (the relay's mark), every 100 ms;
// - beside it a probe runs the relay's full claim (the front of `outbox_due`) every 50 ms;
// - every 5 s: the partition's dead tuples, autovacuum runs, heap and `outbox_due` sizes.
// Reported per setting: the heap and due index grown per 100,000 messages, the most dead tuples
// seen, the autovacuum runs, the claim probe's p50/p99, and the churn rate reached.
import { Effect } from "effect"
import postgres from "postgres"
import { DAY_MS, partitionName } from "../src/storage/sql/partitionBounds.ts"
import { ensurePartitions, QUEUE_PARTITION_SETTINGS } from "../src/storage/sql/partitions.ts"
import { type LocalPostgres, startLocalPostgres } from "../test/support/postgres.ts"
import { createBenchDatabase, uuidv7Text } from "./support/db.ts"
import { log, main, parseArgs, percentile, printTable, round, sleep, writeResult } from "./support/harness.ts"

const args = parseArgs()
const quick = args.quick
const config = {
  rows: args.number("rows", quick ? 50_000 : 3_000_000),
  rate: args.number("rate", quick ? 500 : 2_000),
  seconds: args.number("seconds", quick ? 8 : 240),
}

type Setting = "postgres-defaults" | "txbox"

interface Sample {
  readonly t: number
  readonly dead: number
  readonly autovacuums: number
  readonly heapMb: number
  readonly dueMb: number
}

interface Run {
  readonly setting: Setting
  readonly messages: number
  readonly rate: number
  readonly heapGrowthMbPer100k: number
  readonly dueGrowthMbPer100k: number
  readonly maxDead: number
  readonly autovacuums: number
  readonly claimP50: number
  readonly claimP99: number
  readonly samples: ReadonlyArray<Sample>
}

/** Sent rows of today before now: UUIDv7 ids of their ms, as enqueue would have made them. */
const fill = async (client: postgres.Sql, todayMs: number, rows: number) => {
  const span = Math.max(1, Date.now() - todayMs - 60_000)
  const ms = `(${todayMs}::bigint + (g::bigint * ${span} / ${rows}))`
  const v7 = uuidv7Text(ms)
  const at = `to_timestamp(${ms} / 1000.0)`
  for (let from = 0; from < rows; from += 500_000) {
    await client.unsafe(
      `INSERT INTO txbox.outbox (id, type, version, payload, status, occurred_at, visible_at, published_at)
       SELECT ${v7}::uuid, 'bench.old', 1, '{"orderId":"x","total":1}', 'sent', ${at}, ${at}, ${at}
       FROM generate_series(${from}, ${Math.min(rows, from + 500_000) - 1}) g`,
    )
  }
}

const sample = async (client: postgres.Sql, partition: string, t: number): Promise<Sample> => {
  const [row] = await client.unsafe(
    `SELECT s.n_dead_tup::float8 AS dead, s.autovacuum_count::float8 AS autovacuums,
            pg_relation_size(c.oid)::float8 / 1048576 AS heap_mb,
            (SELECT coalesce(sum(pg_relation_size(i.indexrelid)), 0)::float8 / 1048576 FROM pg_index i
              JOIN pg_class ic ON ic.oid = i.indexrelid
              WHERE i.indrelid = c.oid AND pg_get_indexdef(i.indexrelid) LIKE '%visible_at%'
                AND pg_get_indexdef(i.indexrelid) LIKE '%pending%') AS due_mb
     FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
     WHERE c.oid = 'txbox.${partition}'::regclass`,
  )
  return {
    t,
    dead: Number(row?.dead ?? 0),
    autovacuums: Number(row?.autovacuums ?? 0),
    heapMb: round(Number(row?.heap_mb ?? 0), 1),
    dueMb: round(Number(row?.due_mb ?? 0), 2),
  }
}

/** The relay's statements at `rate` msg/s: rows enqueued, claimed and marked sent, every 100 ms. */
const churn = async (client: postgres.Sql, rate: number, until: number): Promise<number> => {
  const perTick = Math.max(1, Math.round(rate / 10))
  let messages = 0
  let next = performance.now()
  while (performance.now() < until) {
    await client.unsafe(
      `INSERT INTO txbox.outbox (id, type, version, payload)
       SELECT ${uuidv7Text("m")}::uuid, 'bench.ping', 1, '{"orderId":"x","total":1}'
       FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS m FROM generate_series(1, ${perTick})) g`,
    )
    await client.begin(async (tx) => {
      const claimed = await tx.unsafe(
        `SELECT id FROM txbox.outbox WHERE status = 'pending' AND visible_at <= now()
         ORDER BY visible_at LIMIT ${perTick * 2} FOR UPDATE SKIP LOCKED`,
      )
      if (claimed.length > 0)
        await tx.unsafe(
          `UPDATE txbox.outbox SET status = 'sent', published_at = now(), attempts = attempts + 1
           WHERE id = ANY($1::uuid[])`,
          [claimed.map((r) => r.id as string)],
        )
      messages += claimed.length
    })
    next += 100
    const wait = next - performance.now()
    if (wait > 0) await sleep(wait)
  }
  return messages
}

/** The relay's full claim, read-only (rolled back): what a claim pays before it finds a row. */
const probe = async (client: postgres.Sql, until: number): Promise<number[]> => {
  const times: number[] = []
  while (performance.now() < until) {
    const started = performance.now()
    await client
      .begin(async (tx) => {
        await tx.unsafe(`SELECT id FROM txbox.outbox WHERE status = 'pending' AND visible_at <= now()
          ORDER BY visible_at LIMIT 100 FOR UPDATE SKIP LOCKED`)
        await tx.unsafe("ROLLBACK")
      })
      .catch(() => {})
    times.push(performance.now() - started)
    await sleep(50)
  }
  return times
}

const runSetting = async (local: LocalPostgres, setting: Setting): Promise<Run> => {
  const bench = await createBenchDatabase(local.url, `vacuum_${setting.replace("-", "_")}`)
  const worker = postgres(bench.url, { max: 1, onnotice: () => {} })
  const prober = postgres(bench.url, { max: 1, onnotice: () => {} })
  const watcher = postgres(bench.url, { max: 1, onnotice: () => {} })
  try {
    await Effect.runPromise(
      ensurePartitions(
        { db: bench.db, schema: "txbox" },
        { aheadMs: DAY_MS, everyMs: DAY_MS, tables: ["outbox"], includeCurrent: true },
      ),
    )
    const todayMs = Math.floor(Date.now() / DAY_MS) * DAY_MS
    const partition = partitionName("outbox", todayMs, DAY_MS)
    // txbox makes its partitions with its settings; the other run takes PostgreSQL's back.
    if (setting === "postgres-defaults")
      await worker.unsafe(
        `ALTER TABLE txbox.${partition} RESET (${Object.keys(QUEUE_PARTITION_SETTINGS).join(", ")})`,
      )
    const [options] = await worker.unsafe(
      `SELECT reloptions FROM pg_class WHERE oid = 'txbox.${partition}'::regclass`,
    )
    log(`${setting}: ${partition} options ${JSON.stringify(options?.reloptions ?? null)}`)
    await fill(worker, todayMs, config.rows)
    await worker.unsafe(`VACUUM ANALYZE txbox.${partition}`)
    log(
      `${setting}: ${config.rows} sent rows in ${partition}; churning ${config.rate} msg/s for ${config.seconds} s`,
    )

    const started = performance.now()
    const until = started + config.seconds * 1000
    const samples: Sample[] = [await sample(watcher, partition, 0)]
    const watching = (async () => {
      while (performance.now() < until) {
        await sleep(5_000)
        samples.push(await sample(watcher, partition, round((performance.now() - started) / 1000)))
      }
    })()
    const [messages, times] = await Promise.all([
      churn(worker, config.rate, until),
      probe(prober, until),
      watching,
    ])
    const elapsed = (performance.now() - started) / 1000
    const first = samples[0]!
    const last = samples[samples.length - 1]!
    const per100k = (mb: number) => (messages === 0 ? 0 : round((mb * 100_000) / messages, 2))
    return {
      setting,
      messages,
      rate: round(messages / elapsed),
      heapGrowthMbPer100k: per100k(last.heapMb - first.heapMb),
      dueGrowthMbPer100k: per100k(last.dueMb - first.dueMb),
      maxDead: Math.max(...samples.map((s) => s.dead)),
      autovacuums: last.autovacuums - first.autovacuums,
      claimP50: round(percentile(times, 50), 2),
      claimP99: round(percentile(times, 99), 2),
      samples,
    }
  } finally {
    await Promise.all([worker, prober, watcher].map((c) => c.end({ timeout: 5 })))
    await bench.drop()
  }
}

main(async () => {
  const local = await startLocalPostgres({ name: "bench-vacuum" })
  try {
    const runs: Run[] = []
    for (const setting of ["postgres-defaults", "txbox"] as const) runs.push(await runSetting(local, setting))
    printTable(
      `A day partition with ${config.rows.toLocaleString("en-US")} sent rows, ${config.rate} msg/s through it for ${config.seconds} s`,
      [
        "autovacuum settings",
        "msg/s",
        "heap MB / 100k msg",
        "outbox_due MB / 100k msg",
        "most dead tuples",
        "autovacuums",
        "claim p50 ms",
        "claim p99 ms",
      ],
      runs.map((r) => [
        r.setting,
        r.rate,
        r.heapGrowthMbPer100k,
        r.dueGrowthMbPer100k,
        r.maxDead,
        r.autovacuums,
        r.claimP50,
        r.claimP99,
      ]),
    )
    writeResult("vacuum", args, undefined, {
      summary: Object.fromEntries(
        runs.flatMap((r) => [
          [`${r.setting}.heapMbPer100k`, r.heapGrowthMbPer100k],
          [`${r.setting}.claimP99`, r.claimP99],
        ]),
      ),
      config,
      results: runs,
    })
  } finally {
    await local.stop()
  }
})
