// What rows of blocked keys cost the claims of everything else (issue #22): an inbox with N
// ordered rows that have waited a minute for a predecessor that never comes (1,000 keys, their #1
// missing), and batches of 100 unordered rows claimed and marked processed one after the other:
// the first third before the inbox's sweep (`InboxStore.sweep`, every 5 s in a running inbox) set
// the waiting rows aside, off the front of `inbox_due`; the rest after it.
//
//   bun bench/blocked.ts [--quick] [--blocked 10000] [--claims 30]
import { type Effect, ManagedRuntime } from "effect"
import { sql } from "kysely"
import { type InboxRow, InboxStore, type InboxStoreShape } from "../src/ports/InboxStore.ts"
import * as PgStore from "../src/storage/drivers/pg/PgStore.ts"
import { createBenchDatabase } from "./support/db.ts"
import {
  log,
  main,
  median,
  parseArgs,
  printTable,
  round,
  withServices,
  writeResult,
} from "./support/harness.ts"

const args = parseArgs()
const quick = args.quick
const config = {
  blocked: args.number("blocked", quick ? 2_000 : 10_000),
  claims: args.number("claims", quick ? 12 : 30),
  batch: 100,
}

/** Claims before the sweep; the rest after. */
const sweepAt = Math.floor(config.claims / 3)

const row = (key: string, partitionKey: string | null, seq: number | null): InboxRow => ({
  key,
  consumer: "c",
  type: "bench.blocked",
  version: 1,
  payload: "{}",
  raw: null,
  headers: {},
  partitionKey,
  position: seq === null ? null : { epoch: 1, seq },
  tenantId: null,
  attempts: 0,
  lastError: null,
})

/** Claim times (ms) of `claims` batches of unordered rows, each marked processed before the next. */
const measure = async (databaseUrl: string, blocked: number): Promise<number[]> => {
  const bench = await createBenchDatabase(databaseUrl, "blocked")
  const runtime = ManagedRuntime.make(PgStore.layer({ url: bench.url }))
  const use = <A>(f: (s: InboxStoreShape) => Effect.Effect<A, unknown>) =>
    runtime.runPromise(InboxStore.use(f))
  try {
    const waiting = Array.from({ length: blocked }, (_, i) =>
      row(`b${i}`, `k${i % 1_000}`, 2 + Math.floor(i / 1_000)),
    )
    for (let i = 0; i < waiting.length; i += 1_000)
      await use((s) => s.insertPending(waiting.slice(i, i + 1_000)))
    await sql`UPDATE txbox.inbox SET received_at = now() - interval '1 minute'`.execute(bench.db)
    await sql`ANALYZE txbox.inbox`.execute(bench.db)
    const times: number[] = []
    for (let n = 0; n < config.claims; n++) {
      if (n === sweepAt) await use((s) => s.sweep("c"))
      await use((s) =>
        s.insertPending(Array.from({ length: config.batch }, (_, j) => row(`u${n}-${j}`, null, null))),
      )
      const started = performance.now()
      const claim = await use((s) => s.claim("c", config.batch, 30_000))
      times.push(performance.now() - started)
      if (claim.rows.length !== config.batch)
        throw new Error(`claimed ${claim.rows.length} of ${config.batch}`)
      await use((s) =>
        s.transaction((tx) =>
          tx.markProcessedAll(
            "c",
            claim.token,
            claim.rows.map((r) => ({ key: r.key, attempts: 1 })),
          ),
        ),
      )
    }
    return times
  } finally {
    await runtime.dispose()
    await bench.drop()
  }
}

main(() =>
  withServices(async (services) => {
    const rows: Array<[string, number, number, number]> = []
    const summary: Record<string, number> = {}
    const results: Record<string, number[]> = {}
    for (const blocked of [0, config.blocked]) {
      const times = await measure(services.databaseUrl, blocked)
      results[String(blocked)] = times
      const before = times.slice(0, sweepAt)
      const after = times.slice(sweepAt)
      log(`${blocked} blocked rows: claims ${times.map((t) => t.toFixed(1)).join(" ")} ms`)
      rows.push([
        blocked.toLocaleString("en"),
        round(median(before), 1),
        round(median(after), 1),
        round(Math.max(...after), 1),
      ])
      summary[`claim_ms_before_sweep_${blocked}`] = round(median(before), 2)
      summary[`claim_ms_after_sweep_${blocked}`] = round(median(after), 2)
    }
    printTable(
      `Claiming ${config.batch} unordered rows with blocked keys' rows in front (1,000 keys, #1 missing), ms`,
      ["blocked rows", "median before the sweep", "median after", "max after"],
      rows,
    )
    writeResult("blocked", args, services, { summary, config, results })
  }),
)
