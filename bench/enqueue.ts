// The producer's cost: a business transaction (insert an order) with and without the outbox
// insert, transactions per second from 8 concurrent connections. One more row splits that cost:
// the same outbox row inserted by hand (no validation, no Effect, no wake-up check: the library's
// own overhead).
//
//   bun bench/enqueue.ts [--quick] [--seconds 10] [--rounds 2] [--connections 8]
import { Effect } from "effect"
import { Kysely, sql, type Transaction } from "kysely"
import { PostgresJSDialect } from "kysely-postgres-js"
import postgres from "postgres"
import { uuidv7 } from "../src/core/uuid.ts"
import * as Outbox from "../src/Outbox.ts"
import { type Child, spawnChild } from "./support/children.ts"
import { type CpuUse, combineCpu, cpuMeter, portOf } from "./support/cpu.ts"
import { createBenchDatabase } from "./support/db.ts"
import { HAND_OUTBOX_INSERT, ORDER_INSERT } from "./support/hand.ts"
import {
  log,
  main,
  parseArgs,
  percentile,
  printTable,
  round,
  withServices,
  writeResult,
} from "./support/harness.ts"
import { makePayload, OrderPlaced } from "./support/payload.ts"

const args = parseArgs()
const quick = args.quick
const config = {
  seconds: args.number("seconds", quick ? 1 : 10),
  warmupSeconds: args.number("warmup", quick ? 0.2 : 1),
  connections: args.number("connections", 8),
  /** The measured seconds of each variant are split over this many interleaved rounds. */
  rounds: args.number("rounds", quick ? 1 : 2),
}

// biome-ignore lint/suspicious/noExplicitAny: the bench's own tables
type Trx = Transaction<any>

const insertOrder = (trx: Trx, id: string, total: number) =>
  trx.insertInto("orders").values({ id, customer_id: crypto.randomUUID(), total }).execute()

interface Variant {
  readonly name: string
  readonly body: (trx: Trx, serial: number) => Promise<void>
}

const variants: ReadonlyArray<Variant> = [
  {
    name: "order only",
    body: async (trx, serial) => {
      await insertOrder(trx, crypto.randomUUID(), serial)
    },
  },
  {
    name: "order + Outbox.enqueue",
    body: async (trx, serial) => {
      const payload = makePayload(serial)
      await insertOrder(trx, payload.orderId, payload.total)
      await Effect.runPromise(Outbox.enqueue(trx, OrderPlaced, payload))
    },
  },
  {
    name: "order + outbox row by hand",
    body: async (trx, serial) => {
      const payload = makePayload(serial)
      await insertOrder(trx, payload.orderId, payload.total)
      await trx
        .withSchema("txbox")
        .insertInto("outbox")
        .values({
          id: uuidv7(),
          type: OrderPlaced.type,
          version: 1,
          payload: sql`${JSON.stringify(payload)}::text::jsonb`,
          headers: sql`'{}'::jsonb`,
        })
        .execute()
    },
  },
]

/**
 * The library's own CPU per call, apart from any database: `Outbox.enqueue` through
 * `Effect.runPromise` (what a producer outside Effect writes, as bench/cost.ts's does) on a client
 * that answers every statement at once, against the hand-written producer's outbox INSERT on the
 * same client: a floor for the library's share of the producer's gap in bench/cost.ts, measured
 * hot (a process under load pays more per call; docs/benchmarks.md).
 */
const perCall = async (): Promise<ReadonlyArray<{ readonly name: string; readonly us: number }>> => {
  // `on`: Outbox.transaction's one-time question (whether a text of two statements runs both).
  const answer = { rows: [{ notified: false, on: "on" }], rowCount: 1 }
  const client = { query: (_text: string, _values?: unknown[]) => Promise.resolve(answer) }
  const payload = makePayload(1)
  const calls: ReadonlyArray<readonly [string, () => Promise<unknown>]> = [
    [
      "hand-written outbox INSERT",
      () =>
        client.query(HAND_OUTBOX_INSERT, [crypto.randomUUID(), OrderPlaced.type, JSON.stringify(payload)]),
    ],
    [
      "Effect.runPromise(Outbox.enqueue(…))",
      () => Effect.runPromise(Outbox.enqueue(client, OrderPlaced, payload)),
    ],
    // Whole transactions (BEGIN … COMMIT, the order's statement included): the hand-written one, and
    // Outbox.transaction, whose INSERT goes with the COMMIT (literals in the text, one call less).
    [
      "hand-written transaction (4 calls)",
      async () => {
        await client.query("BEGIN")
        await client.query(ORDER_INSERT, [payload.orderId, payload.customerId, payload.total, 1, 1])
        await client.query(HAND_OUTBOX_INSERT, [
          crypto.randomUUID(),
          OrderPlaced.type,
          JSON.stringify(payload),
        ])
        await client.query("COMMIT")
      },
    ],
    [
      "Effect.runPromise(Outbox.transaction(…)) (3 calls)",
      () =>
        Effect.runPromise(
          Outbox.transaction(client, (trx) =>
            Effect.andThen(
              Effect.tryPromise(() =>
                trx.query(ORDER_INSERT, [payload.orderId, payload.customerId, payload.total, 1, 1]),
              ),
              Outbox.enqueue(trx, OrderPlaced, payload),
            ),
          ),
        ),
    ],
  ]
  const n = quick ? 2_000 : 100_000
  const out: Array<{ name: string; us: number }> = []
  // Three passes, the last one counted: the first two let the compiler settle.
  for (let pass = 0; pass < 3; pass++) {
    for (const [name, call] of calls) {
      const before = process.cpuUsage()
      for (let i = 0; i < n; i++) await call()
      const used = process.cpuUsage(before)
      if (pass === 2) out.push({ name, us: (used.user + used.system) / n })
    }
  }
  return out
}

interface Run {
  readonly name: string
  readonly transactions: number
  readonly rate: number
  readonly p50: number
  readonly p99: number
  readonly cpu: CpuUse
}

main(() =>
  withServices(async (services) => {
    const meter = cpuMeter({
      postgresPort: portOf(services.databaseUrl),
      rabbitPort: portOf(services.amqpUrl),
    })
    const bench = await createBenchDatabase(services.databaseUrl, "enqueue")
    const client = postgres(bench.url, { max: config.connections, onnotice: () => {} })
    // biome-ignore lint/suspicious/noExplicitAny: the bench's own tables
    const db = new Kysely<any>({ dialect: new PostgresJSDialect({ postgres: client }) })
    let listener: Child<{ event: string; notifications: number }> | undefined
    try {
      await sql`
        CREATE TABLE orders (
          id uuid PRIMARY KEY, customer_id uuid NOT NULL, total numeric NOT NULL,
          created_at timestamptz NOT NULL DEFAULT now()
        )`.execute(db)
      // Someone must LISTEN for NOTIFY to cost what it costs in production (a relay does), in a
      // process of its own: delivering notifications must not cost the producer being measured.
      listener = spawnChild<{ event: string; notifications: number }>("listenProcess.ts", {
        DB_URL: bench.url,
        CHANNEL: "txbox.outbox",
      })
      await listener.ready
      // Rounds interleave the variants, so a slow spell on the machine (or JIT warming up the
      // first variant to use enqueue) is spread over all of them rather than landing on one.
      const measured = variants.map(() => ({ latencies: [] as number[], uses: [] as CpuUse[] }))
      for (let round = 0; round < config.rounds; round++) {
        for (const [index, variant] of variants.entries()) {
          await sql`TRUNCATE orders, txbox.outbox`.execute(db)
          let serial = 0
          let measuring = false
          const latencies = measured[index]!.latencies
          let stop = false
          const loop = async () => {
            while (!stop) {
              const started = performance.now()
              await db.transaction().execute((trx) => variant.body(trx, serial++))
              if (measuring) latencies.push(performance.now() - started)
            }
          }
          const loops = Array.from({ length: config.connections }, loop)
          await new Promise((resolve) => setTimeout(resolve, config.warmupSeconds * 1000))
          measuring = true
          const before = meter.sample([listener.pid])
          await new Promise((resolve) => setTimeout(resolve, (config.seconds / config.rounds) * 1000))
          measuring = false
          measured[index]!.uses.push(meter.use(before, meter.sample([listener.pid])))
          stop = true
          await Promise.all(loops)
        }
      }
      const runs: Run[] = variants.map((variant, index) => {
        const { latencies, uses } = measured[index]!
        const cpu = combineCpu(uses)
        const run: Run = {
          name: variant.name,
          transactions: latencies.length,
          rate: latencies.length / cpu.seconds,
          p50: percentile(latencies, 50),
          p99: percentile(latencies, 99),
          cpu,
        }
        log(`${variant.name}: ${Math.round(run.rate)} tx/s`)
        return run
      })

      const base = runs[0]!.rate
      printTable(
        `Producer transactions, ${config.connections} connections, ${config.seconds} s each (CPU per transaction and in cores; PostgreSQL runs with fsync=off, synchronous_commit=off)`,
        [
          "transaction",
          "tx/s",
          "vs order only",
          "p50 ms",
          "p99 ms",
          "bench µs/tx",
          "pg µs/tx",
          "bench",
          "pg",
          "listener",
          "other",
        ],
        runs.map((r) => [
          r.name,
          Math.round(r.rate),
          round(r.rate / base, 3),
          round(r.p50, 2),
          round(r.p99, 2),
          round((r.cpu.bench / r.rate) * 1e6),
          r.cpu.postgres === undefined ? undefined : round((r.cpu.postgres / r.rate) * 1e6),
          round(r.cpu.bench, 2),
          r.cpu.postgres === undefined ? undefined : round(r.cpu.postgres, 2),
          r.cpu.perChild[0] === undefined ? undefined : round(r.cpu.perChild[0], 2),
          r.cpu.other === undefined ? undefined : round(r.cpu.other, 2),
        ]),
      )
      const calls = await perCall()
      printTable(
        "Per call on a client that answers at once (no database): the library's own CPU",
        ["call", "µs CPU per call"],
        calls.map((c) => [c.name, round(c.us, 2)]),
      )
      const summary: Record<string, number> = {
        handInsertCallUs: round(calls[0]!.us, 2),
        enqueueCallUs: round(calls[1]!.us, 2),
        handTransactionCallUs: round(calls[2]!.us, 2),
        outboxTransactionCallUs: round(calls[3]!.us, 2),
        orderOnly: round(runs[0]!.rate),
        orderWithEnqueue: round(runs[1]!.rate),
        orderWithRawOutboxInsert: round(runs[2]!.rate),
        enqueueOverOrderOnly: round(runs[1]!.rate / base, 3),
      }
      writeResult("enqueue", args, services, { summary, config, results: runs })
    } finally {
      await listener?.stop()
      await db.destroy()
      await bench.drop()
    }
  }),
)
