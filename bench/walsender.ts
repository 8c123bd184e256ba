// What logical decoding costs PostgreSQL per transaction (issue #27): the WAL relay's slot makes a
// WAL sender decode every transaction of the database, not only those that write the outbox. Here
// pgbench commits transactions at a fixed rate on a PostgreSQL of the bench's own
// (wal_level = logical, synchronous_commit = on: a WAL sender sees a commit once it is flushed),
// with txbox's schema, a publication of the outbox's inserts and a pgoutput slot that
// pg_recvlogical reads, and the WAL sender's CPU is read from /proc. Two kinds of transaction: one
// that inserts an order only (nothing the publication sends) and one that inserts an order and an
// outbox row (the producer's transaction of bench/cost.ts). Beside it, for scale, what PostgreSQL
// spends on a polling relay's claims and marks per message: bench/cost.ts with
// BENCH_PG_STATEMENTS.
//
//   bun bench/walsender.ts [--quick] [--rates 250,1000,3000] [--seconds 15]
import { type ChildProcess, spawn, spawnSync } from "node:child_process"
import { join } from "node:path"
import { postgresBinary, startLocalPostgres } from "../test/support/postgres.ts"
import { treeSeconds } from "./support/cpu.ts"
import { createBenchDatabase } from "./support/db.ts"
import { log, main, parseArgs, printTable, round, sleep, writeResult } from "./support/harness.ts"

const args = parseArgs()
const quick = args.quick
const config = {
  rates: args
    .string("rates", quick ? "500" : "250,1000,3000")
    .split(",")
    .map((r) => Number(r.trim())),
  seconds: args.number("seconds", quick ? 3 : 15),
}

const binary = (name: string): string => {
  const path = postgresBinary(name)
  if (path === undefined)
    throw new Error(`${name} not found (install postgresql-15 or set TXBOX_TEST_PG_BINDIR)`)
  return path
}

/** pgbench scripts: an order alone, and an order with its outbox row (one transaction each). */
const SCRIPTS = {
  "order only": `INSERT INTO orders (customer_id, total) VALUES ('c' || (random() * 200)::int, 12345);\n`,
  "order + outbox row": [
    "BEGIN;",
    "INSERT INTO orders (customer_id, total) VALUES ('c' || (random() * 200)::int, 12345);",
    `INSERT INTO txbox.outbox (id, type, version, payload, headers) VALUES (gen_random_uuid(), 'bench.order-placed', 1, '{"orderId":"0192f0a8-aaaa-7bbb-8ccc-000000000000","customerId":"c42","total":12345,"serial":1}', '{}');`,
    "COMMIT;",
    "",
  ].join("\n"),
} as const
type Kind = keyof typeof SCRIPTS

interface Row {
  readonly kind: Kind
  readonly rate: number
  readonly transactions: number
  /** WAL sender CPU µs per committed transaction. */
  readonly walSenderUs: number
  /** pg_recvlogical's CPU µs per transaction (the reading client, for scale). */
  readonly readerUs: number
}

const cpuOf = (pid: number): number => treeSeconds(pid) ?? Number.NaN

main(async () => {
  const local = await startLocalPostgres({
    name: "bench-walsender",
    settings: [
      "wal_level = logical",
      "synchronous_commit = on",
      "max_wal_senders = 4",
      "max_replication_slots = 4",
    ],
  })
  const rows: Row[] = []
  let reader: ChildProcess | undefined
  try {
    const bench = await createBenchDatabase(local.url, "walsender")
    const { sql } = bench
    await sql`CREATE TABLE orders (id bigserial PRIMARY KEY, customer_id text NOT NULL, total int NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`
    await sql`CREATE PUBLICATION bench_pub FOR TABLE txbox.outbox WITH (publish = 'insert', publish_via_partition_root = true)`
    await sql`SELECT pg_create_logical_replication_slot('bench_slot', 'pgoutput')`
    const url = new URL(bench.url)
    const server = ["-h", url.hostname, "-p", url.port, "-U", "postgres"]
    reader = spawn(
      binary("pg_recvlogical"),
      [
        ...server,
        "-d",
        bench.name,
        "-S",
        "bench_slot",
        "--start",
        "-o",
        "proto_version=1",
        "-o",
        "publication_names=bench_pub",
        "-f",
        "/dev/null",
      ],
      { stdio: ["ignore", "ignore", "inherit"] },
    )
    await sleep(1000)
    const sender = await sql<
      { pid: number }[]
    >`SELECT pid FROM pg_stat_replication WHERE application_name = 'pg_recvlogical'`
    const senderPid = sender[0]?.pid
    if (senderPid === undefined) throw new Error("pg_recvlogical did not start streaming")
    for (const rate of config.rates) {
      for (const kind of Object.keys(SCRIPTS) as Kind[]) {
        const scriptPath = join(local.dir, `${kind.replace(/\W+/g, "_")}.sql`)
        await Bun.write(scriptPath, SCRIPTS[kind])
        const before = { sender: cpuOf(senderPid), reader: cpuOf(reader.pid!) }
        const run = spawnSync(
          binary("pgbench"),
          // pgbench's -d is --debug: the database goes last.
          [
            ...server,
            "-n",
            "-c",
            "4",
            "-j",
            "1",
            "-R",
            String(rate),
            "-T",
            String(config.seconds),
            "-f",
            scriptPath,
            bench.name,
          ],
          { encoding: "utf8" },
        )
        // The sender is done once the slot has caught up with what was committed.
        for (let i = 0; i < 50; i++) {
          const lag = await sql<{ lag: number }[]>`
            SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::float8 AS lag
            FROM pg_replication_slots WHERE slot_name = 'bench_slot'`
          if ((lag[0]?.lag ?? 0) < 8192) break
          await sleep(100)
        }
        const after = { sender: cpuOf(senderPid), reader: cpuOf(reader.pid!) }
        const done = /number of transactions actually processed: (\d+)/.exec(run.stdout)
        if (run.status !== 0 || done === null)
          throw new Error(
            `pgbench failed: ${run.stderr
              .split("\n")
              .filter((l) => /ERROR|error|abort/.test(l))
              .join("\n")}`,
          )
        const transactions = Number(done[1])
        const row: Row = {
          kind,
          rate,
          transactions,
          walSenderUs: ((after.sender - before.sender) * 1e6) / transactions,
          readerUs: ((after.reader - before.reader) * 1e6) / transactions,
        }
        rows.push(row)
        log(
          `${rate} tx/s, ${kind}: ${transactions} transactions, WAL sender ${round(row.walSenderUs)} µs and reader ${round(row.readerUs)} µs per transaction`,
        )
      }
    }
    // The cluster is the bench's own and goes with `local.stop()`: no slot or database to drop.
    await sql.end({ timeout: 5 })
  } finally {
    reader?.kill("SIGKILL")
    await local.stop()
  }
  printTable(
    `Logical decoding's cost per transaction: a pgoutput slot read by pg_recvlogical, pgbench at a fixed rate for ${config.seconds} s (4 clients), CPU µs per committed transaction`,
    ["transaction", "tx/s offered", "transactions", "WAL sender µs", "reader µs"],
    rows.map((r) => [r.kind, r.rate, r.transactions, round(r.walSenderUs), round(r.readerUs)]),
  )
  const summary: Record<string, number> = {}
  for (const r of rows) {
    const kind = r.kind === "order only" ? "unpublished" : "published"
    summary[`walsender_us_per_tx_${kind}_${r.rate}`] = round(r.walSenderUs)
  }
  writeResult("walsender", args, undefined, { summary, config, results: rows })
})
