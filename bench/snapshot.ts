// A claim under a long snapshot, by EXPLAIN (ANALYZE, BUFFERS) (issue #26): the outbox's claim and
// the inbox's (the heads of one consumer's due rows), each as a full claim and as one that looks
// back 3 s (storage/sql/claimWindow.ts), on an empty table and after `--rows` rows went through the
// due index (stored pending, then sent / processed) while a REPEATABLE READ transaction stayed open.
//
//   bun bench/snapshot.ts [--rows 200000] [--quick]
//
// The rows are due 10 minutes back, as under a snapshot that began then: every one leaves a dead
// entry at the front of the due index that neither vacuum nor an index scan may remove.
import postgres from "postgres"
import { RECENT_MS } from "../src/storage/sql/claimWindow.ts"
import { startLocalPostgres } from "../test/support/postgres.ts"
import { createBenchDatabase } from "./support/db.ts"
import { log, main, parseArgs, percentile, printTable, round, writeResult } from "./support/harness.ts"

const args = parseArgs()
const config = { rows: args.number("rows", args.quick ? 20_000 : 200_000), runs: args.quick ? 5 : 20 }

type Table = "outbox" | "inbox"

const claimOf = (table: Table, bounded: boolean) => {
  const window = bounded ? `AND visible_at >= now() - ${RECENT_MS} * interval '1 millisecond'` : ""
  const consumer = table === "inbox" ? "consumer = 'bench' AND" : ""
  const key = table === "inbox" ? "message_id" : "id"
  return `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT ${key} FROM txbox.${table}
    WHERE ${consumer} status = 'pending' AND visible_at <= now() ${window}
    ORDER BY visible_at LIMIT 100 FOR UPDATE SKIP LOCKED`
}

interface Probe {
  readonly p50: number
  readonly max: number
  readonly buffers: number
}

/** The claim `runs` times, each rolled back: its execution time and the buffers it touched. */
const probe = async (client: postgres.Sql, statement: string): Promise<Probe> => {
  const times: number[] = []
  let buffers = 0
  for (let i = 0; i < config.runs; i++) {
    const rows = await client.begin(async (tx) => {
      const r = await tx.unsafe(statement)
      await tx.unsafe("ROLLBACK")
      return r
    })
    // biome-ignore lint/suspicious/noExplicitAny: EXPLAIN's JSON
    const plan = (rows[0] as any)["QUERY PLAN"][0]
    times.push(plan["Execution Time"])
    buffers = plan.Plan["Shared Hit Blocks"] + plan.Plan["Shared Read Blocks"]
  }
  return { p50: round(percentile(times, 50), 3), max: round(Math.max(...times), 3), buffers }
}

/** Rows through the due index: stored pending (due 10 minutes back), then done, 10,000 at a time. */
const churn = async (client: postgres.Sql, table: Table, rows: number) => {
  for (let done = 0; done < rows; done += 10_000) {
    if (table === "outbox") {
      await client.unsafe(`INSERT INTO txbox.outbox (id, type, version, payload, visible_at)
        SELECT gen_random_uuid(), 'bench.ping', 1, '{}', clock_timestamp() - interval '10 minutes'
        FROM generate_series(1, 10000)`)
      await client.unsafe(
        `UPDATE txbox.outbox SET status = 'sent', published_at = now() WHERE status = 'pending'`,
      )
    } else {
      await client.unsafe(`INSERT INTO txbox.inbox (message_id, consumer, type, version, payload, status, visible_at)
        SELECT gen_random_uuid()::text, 'bench', 'bench.ping', 1, '{}', 'pending', clock_timestamp() - interval '10 minutes'
        FROM generate_series(1, 10000)`)
      await client.unsafe(
        `UPDATE txbox.inbox SET status = 'processed', processed_at = now() WHERE consumer = 'bench' AND status = 'pending'`,
      )
    }
  }
}

main(async () => {
  const local = await startLocalPostgres({ name: "bench-snapshot" })
  const bench = await createBenchDatabase(local.url, "snapshot")
  const holder = postgres(bench.url, { max: 1, onnotice: () => {} })
  const client = postgres(bench.url, { max: 1, onnotice: () => {} })
  const rows: Array<[string, string, number, number, number]> = []
  const results: Record<string, Probe> = {}
  const measure = async (state: string) => {
    for (const table of ["outbox", "inbox"] as const)
      for (const bounded of [false, true]) {
        const p = await probe(client, claimOf(table, bounded))
        const claim = bounded ? `bounded (${RECENT_MS / 1000} s)` : "full"
        results[`${state}.${table}.${bounded ? "bounded" : "full"}`] = p
        rows.push([`${table}, ${state}`, claim, p.p50, p.max, p.buffers])
      }
  }
  let release: () => void = () => {}
  try {
    await measure("empty")
    // The snapshot, held open while the rows go through.
    const held = holder
      .begin("isolation level repeatable read", async (tx) => {
        await tx.unsafe("SELECT count(*) FROM txbox.outbox")
        await new Promise<void>((resolve) => {
          release = resolve
        })
      })
      .catch(() => {})
    for (const table of ["outbox", "inbox"] as const) await churn(client, table, config.rows)
    log(`${config.rows} rows through each due index with the snapshot open`)
    await measure(`${config.rows} done under a snapshot`)
    release()
    await held
    printTable(
      `The claim's front of the due index, ${config.runs} runs each (EXPLAIN ANALYZE, rolled back)`,
      ["table", "claim", "p50 ms", "max ms", "buffers"],
      rows,
    )
    writeResult("snapshot", args, undefined, {
      summary: Object.fromEntries(Object.entries(results).map(([k, p]) => [k, p.p50])),
      config,
      results,
    })
  } finally {
    await Promise.all([holder.end({ timeout: 5 }), client.end({ timeout: 5 })])
    await bench.drop()
    await local.stop()
  }
})
