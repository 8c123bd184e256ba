// Ordered against unordered, end to end: producer transactions → outbox → relay → RabbitMQ → Inbox
// (idempotent mode) → handler, in one run. The same N messages go through twice: without a
// partition key, and with one of K keys (each key N/K messages, interleaved at random), numbered
// at enqueue and resequenced by the inbox (an ordered delivery is stored pending; the processor
// claims a key's next row only after its predecessor is processed). Three processes, as three
// services would run: this one (producer, then the clock), a relay (support/relayProcess.ts) and
// an Inbox (support/inboxProcess.ts) whose handler inserts a row into `bench.handled` through the
// inbox's transaction. Each run is timed from the relay's start until the inbox has handled every
// message; the outbox is filled by the producers beforehand (timed separately, not included).
//
// `--keys` takes a list: each count is one ordered run per round (few keys, each with a long
// backlog, and many). `--rate R` offers the messages at R msg/s while the relay and the inbox run
// (the producers paced, every kind at the same rate) instead of filling the outbox first; the
// table then says how long the pipeline took to drain once the producers stopped.
//
//   bun bench/ordered.ts [--quick] [--messages 20000] [--keys 64,10000] [--rounds 2] [--producers 4]
//                        [--tx-size 100] [--spread shuffled|round-robin] [--seed 1] [--rate 0]
//                        [--inbox-batch n] [--inbox-poll-ms n] [--inbox-concurrency n]
//                        [--handler-failures F]  (the share of handler runs that fail and are retried, 0..1)
import { Effect } from "effect"
import { Kysely, sql } from "kysely"
import { PostgresJSDialect } from "kysely-postgres-js"
import postgres from "postgres"
import * as Outbox from "../src/Outbox.ts"
import { defaultRetryPolicy } from "../src/Retry.ts"
import { deadQueueName, delayQueueName, queueName } from "../src/transport/amqp/subscriber.ts"
import { deleteTopology, uniqueName } from "./support/amqp.ts"
import { spawnChild, spawnRelay } from "./support/children.ts"
import { type CpuUse, cpuMeter, portOf } from "./support/cpu.ts"
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
import { makePayload, OrderPlaced } from "./support/payload.ts"

const args = parseArgs()
const quick = args.quick
const optional = (name: string): number | undefined =>
  args.given[name] === undefined ? undefined : args.number(name, Number.NaN)
const config = {
  messages: args.number("messages", quick ? 2_000 : 20_000),
  keys: args
    .string("keys", quick ? "16,1000" : "64,10000")
    .split(",")
    .map((k) => Number(k)),
  /** Messages per second offered while everything runs; 0: fill the outbox first, then time the drain. */
  rate: args.number("rate", 0),
  /** Unordered and ordered alternate, `rounds` times each; the summary takes medians. */
  rounds: args.number("rounds", quick ? 1 : 2),
  /** Concurrent producer transactions while the outbox is filled. */
  producers: args.number("producers", 4),
  /** Messages per producer transaction (one Outbox.enqueueMany). */
  txSize: args.number("tx-size", 100),
  /** How keys are laid over the messages: each key gets N/K either way. */
  spread: args.string("spread", "shuffled") as "shuffled" | "round-robin",
  seed: args.number("seed", 1),
  /** Inbox processor settings, only when given (else the Inbox defaults: 100, 1 s, 4). */
  inboxBatch: optional("inbox-batch"),
  inboxPollMs: optional("inbox-poll-ms"),
  inboxConcurrency: optional("inbox-concurrency"),
  /** The share of handler runs that fail on purpose (a flaky downstream): each is retried. */
  handlerFailures: args.number("handler-failures", 0),
  /** The relay runs with the library's defaults; the bench states them (relayProcess.ts needs them). */
  relay: { batchSize: 1000, workers: 1, pollMs: 1000, listen: true },
  /** The Inbox default; inboxProcess.ts needs it spelled out. */
  prefetch: 32,
  /** How often the children report their counters: the clock's resolution. */
  statsMs: 25,
  timeoutMs: 600_000,
}
if (!["shuffled", "round-robin"].includes(config.spread)) throw new Error(`--spread: ${config.spread}`)
for (const keys of config.keys)
  if (!Number.isInteger(keys) || keys < 1 || config.messages < keys)
    throw new Error("--keys must be in 1..messages")

/** "unordered", or "ordered" over `keys` partition keys. */
interface Kind {
  readonly ordered: boolean
  readonly keys: number
}
const kindName = (kind: Kind) =>
  kind.ordered ? `ordered ${kind.keys.toLocaleString("en-US")} keys` : "unordered"

interface InboxLine {
  readonly event: "ready" | "stats" | "report"
  readonly processed?: number
  readonly duplicates?: number
  readonly retried?: number
  readonly dead?: number
  readonly stored?: number
  readonly handlerRuns?: number
}

interface Run {
  readonly kind: Kind
  readonly round: number
  /** Messages per second end to end: N / (relay start → last handler effect committed). */
  readonly rate: number
  readonly seconds: number
  /** Seconds from the relay's start until it had published every message. */
  readonly relayDone: number
  /** With `--rate`: seconds from the producers' last commit until the last message was handled. */
  readonly drain: number | undefined
  /** Ordered: seconds until the inbox had stored every delivery (the consume side alone). */
  readonly storedDone: number | undefined
  /** The producers' msg/s while filling the outbox (not part of `rate`). */
  readonly enqueueRate: number
  readonly retried: number
  /** Handler runs per message: 1 when none failed; a failure in a shared transaction runs its neighbours again. */
  readonly runsPerMessage: number
  /**
   * ANALYZEs of txbox.inbox during the run (autovacuum's, normally): the processor's statements are
   * planned from the table's statistics, and a backlog of pending rows the statistics do not know
   * about yet can make the planner pick the partial due index for single-row updates.
   */
  readonly inboxAnalyzed: number
  readonly cpu: CpuUse
}

/** mulberry32: a small seeded PRNG, so a run's key layout can be repeated. */
const prng = (seed: number) => {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/** Message i's key index: i mod K, shuffled (Fisher–Yates) unless round-robin. */
const keyLayout = (n: number, keys: number, spread: "shuffled" | "round-robin", seed: number): Int32Array => {
  const layout = new Int32Array(n)
  for (let i = 0; i < n; i++) layout[i] = i % keys
  if (spread === "shuffled") {
    const random = prng(seed)
    for (let i = n - 1; i > 0; i--) {
      const j = Math.floor(random() * (i + 1))
      const t = layout[i]!
      layout[i] = layout[j]!
      layout[j] = t
    }
  }
  return layout
}

main(() =>
  withServices(async (services) => {
    const meter = cpuMeter({
      postgresPort: portOf(services.databaseUrl),
      rabbitPort: portOf(services.amqpUrl),
    })
    const bench = await createBenchDatabase(services.databaseUrl, "ordered")
    await sql`CREATE SCHEMA IF NOT EXISTS bench`.execute(bench.db)
    await sql`
      CREATE TABLE bench.handled (id bigserial PRIMARY KEY, serial int NOT NULL, key text, seq bigint)`.execute(
      bench.db,
    )
    const client = postgres(bench.url, { max: config.producers, onnotice: () => {} })
    // biome-ignore lint/suspicious/noExplicitAny: the producer's own database
    const db = new Kysely<any>({ dialect: new PostgresJSDialect({ postgres: client }) })
    const n = config.messages
    const layouts = new Map(config.keys.map((k) => [k, keyLayout(n, k, config.spread, config.seed)]))
    const keyName = (keys: number, i: number) => `customer-${String(layouts.get(keys)![i]).padStart(5, "0")}`
    const topology: { queues: string[]; exchanges: string[] } = { queues: [], exchanges: [] }
    const runs: Run[] = []

    /**
     * Fills the outbox: `producers` concurrent transactions of `txSize` messages each; with `--rate`,
     * each transaction starts no earlier than its first message's turn at that rate.
     */
    const produce = async (kind: Kind): Promise<number> => {
      let next = 0
      const started = performance.now()
      await Promise.all(
        Array.from({ length: config.producers }, async () => {
          while (next < n) {
            const from = next
            next = Math.min(n, next + config.txSize)
            const to = next
            if (config.rate > 0) {
              const due = started + (from / config.rate) * 1000 - performance.now()
              if (due > 0) await new Promise((resolve) => setTimeout(resolve, due))
            }
            const events: Outbox.EventInput[] = []
            for (let i = from; i < to; i++) {
              events.push({
                contract: OrderPlaced,
                payload: makePayload(i),
                ...(kind.ordered ? { options: { partitionKey: keyName(kind.keys, i) } } : {}),
              })
            }
            await db.transaction().execute((trx) => Effect.runPromise(Outbox.enqueueMany(trx, events)))
          }
        }),
      )
      return n / ((performance.now() - started) / 1000)
    }

    const run = async (kind: Kind, round: number): Promise<Run> => {
      await sql`TRUNCATE txbox.outbox, txbox.inbox, txbox.inbox_cursors, txbox.partition_counters, bench.handled`.execute(
        bench.db,
      )
      const tag = kind.ordered ? `ordered${kind.keys}` : "unordered"
      const exchange = uniqueName(`bench.ordered.${tag}`)
      const consumer = uniqueName(`ordered-${tag}`)
      topology.exchanges.push(exchange)
      topology.queues.push(
        queueName(consumer),
        deadQueueName(consumer),
        ...Array.from({ length: defaultRetryPolicy.maxAttempts }, (_, i) => delayQueueName(consumer, i + 1)),
      )
      const optionalEnv = (name: string, value: number | undefined) =>
        value === undefined ? {} : { [name]: String(value) }
      const inbox = spawnChild<InboxLine>("inboxProcess.ts", {
        DB_URL: bench.url,
        AMQP_URL: services.amqpUrl,
        EXCHANGE: exchange,
        CONSUMER: consumer,
        MODE: "idempotent",
        PREFETCH: String(config.prefetch),
        STATS_MS: String(config.statsMs),
        RECORD: "1",
        ...optionalEnv("BATCH", config.inboxBatch),
        ...optionalEnv("POLL_MS", config.inboxPollMs),
        ...optionalEnv("CONCURRENCY", config.inboxConcurrency),
        ...(config.handlerFailures > 0 ? { FAIL_FRACTION: String(config.handlerFailures) } : {}),
      })
      const relay = spawnRelay({
        dbUrl: bench.url,
        amqpUrl: services.amqpUrl,
        exchange,
        ...config.relay,
        statsMs: config.statsMs,
      })
      try {
        // The consumer's queue must exist before anything is published (else: unroutable, retried).
        await Promise.all([inbox.ready, relay.ready])
        const paced = config.rate > 0
        let enqueueRate = 0
        if (!paced) {
          enqueueRate = await produce(kind)
          await sql`VACUUM ANALYZE txbox.outbox`.execute(bench.db)
          log(
            `${kindName(kind)} #${round}: outbox filled with ${n} messages at ${Math.round(enqueueRate)} msg/s`,
          )
        }

        const analyzed = async () =>
          Number(
            (
              await sql<{ n: string }>`
                SELECT autoanalyze_count + analyze_count AS n FROM pg_stat_user_tables
                WHERE relid = 'txbox.inbox'::regclass`.execute(bench.db)
            ).rows[0]?.n ?? 0,
          )
        const analyzedBefore = await analyzed()
        const pids = [relay.pid, inbox.pid]
        const before = meter.sample(pids)
        const started = performance.now()
        relay.send("go")
        let producedAt: number | undefined
        const producing = paced
          ? produce(kind).then((rate) => {
              enqueueRate = rate
              producedAt = (performance.now() - started) / 1000
            })
          : Promise.resolve()
        let relayDone: number | undefined
        let storedDone: number | undefined
        const done = await inbox.waitFor(
          `${kindName(kind)}: all ${n} messages handled`,
          (line) => {
            const at = (performance.now() - started) / 1000
            if (relayDone === undefined && (relay.latest()?.published ?? 0) >= n) relayDone = at
            if (storedDone === undefined && (line.stored ?? 0) >= n) storedDone = at
            return (line.processed ?? 0) + (line.duplicates ?? 0) + (line.dead ?? 0) >= n
          },
          config.timeoutMs,
        )
        const cpu = meter.use(before, meter.sample(pids))
        const seconds = (performance.now() - started) / 1000
        await producing
        relayDone ??= seconds

        // Every message's effect committed exactly once, and each key's in its numbers' order.
        const check = await sql<{ rows: string; serials: string; keyed: string; out_of_order: string }>`
          SELECT count(*) AS rows, count(DISTINCT serial) AS serials, count(key) AS keyed,
                 count(*) FILTER (WHERE key IS NOT NULL AND seq IS DISTINCT FROM rn) AS out_of_order
          FROM (SELECT serial, key, seq, row_number() OVER (PARTITION BY key ORDER BY id) AS rn
                FROM bench.handled) h`.execute(bench.db)
        const c = check.rows[0]!
        const expectKeyed = kind.ordered ? n : 0
        if (
          Number(c.rows) !== n ||
          Number(c.serials) !== n ||
          Number(c.keyed) !== expectKeyed ||
          Number(c.out_of_order) !== 0 ||
          (done.dead ?? 0) > 0
        ) {
          const counts = await sql<{ outbox: string; inbox: string }>`
            SELECT (SELECT count(*) FROM txbox.outbox) AS outbox, (SELECT count(*) FROM txbox.inbox) AS inbox`.execute(
            bench.db,
          )
          throw new Error(
            `${kindName(kind)}: outbox ${counts.rows[0]!.outbox}, inbox ${counts.rows[0]!.inbox}, handled rows ${c.rows}, distinct ${c.serials}, keyed ${c.keyed}, out of order ${c.out_of_order}, dead ${done.dead}`,
          )
        }
        const result: Run = {
          kind,
          round,
          rate: n / seconds,
          seconds,
          relayDone,
          drain: producedAt === undefined ? undefined : seconds - producedAt,
          storedDone: kind.ordered ? storedDone : undefined,
          enqueueRate,
          retried: done.retried ?? 0,
          runsPerMessage: (done.handlerRuns ?? n) / n,
          inboxAnalyzed: (await analyzed()) - analyzedBefore,
          cpu,
        }
        log(
          `${kindName(kind)} #${round}: ${Math.round(result.rate)} msg/s end to end (${seconds.toFixed(1)} s; relay done at ${relayDone.toFixed(1)} s)`,
        )
        return result
      } finally {
        await relay.stop()
        await inbox.stop()
      }
    }

    const kinds: Kind[] = [
      { ordered: false, keys: 0 },
      ...config.keys.map((keys) => ({ ordered: true, keys })),
    ]
    try {
      for (let r = 1; r <= config.rounds; r++) {
        for (const kind of kinds) runs.push(await run(kind, r))
      }

      const inboxSettings =
        [
          config.inboxBatch === undefined ? undefined : `batchSize ${config.inboxBatch}`,
          config.inboxPollMs === undefined ? undefined : `pollInterval ${config.inboxPollMs} ms`,
          config.inboxConcurrency === undefined
            ? undefined
            : `processorConcurrency ${config.inboxConcurrency}`,
          config.handlerFailures > 0 ? `${config.handlerFailures * 100} % of handler runs fail` : undefined,
        ]
          .filter((s) => s !== undefined)
          .join(", ") || "defaults"
      const perMessage = (cores: number | undefined, r: Run) =>
        cores === undefined ? undefined : round((cores / r.rate) * 1e6)
      printTable(
        `Ordered vs unordered end to end, ${n.toLocaleString("en-US")} messages per run ` +
          (config.rate > 0
            ? `offered at ${config.rate.toLocaleString("en-US")} msg/s while everything runs `
            : "from a filled outbox ") +
          `(ordered: ${config.keys.map((k) => `${k.toLocaleString("en-US")} keys × ${round(n / k, 1)}`).join(", ")} messages per key, ${config.spread}); ` +
          `relay defaults (batch ${config.relay.batchSize} × ${config.relay.workers}, NOTIFY), ` +
          `Inbox idempotent, prefetch ${config.prefetch}, processor ${inboxSettings}; ` +
          `handler inserts one row through the inbox's transaction (CPU in cores, and µs per message)`,
        [
          "run",
          "msg/s",
          "seconds",
          "relay done s",
          "drain s",
          "stored s",
          "runs/msg",
          "enqueue msg/s",
          "inbox analyzed",
          "relay",
          "inbox",
          "pg",
          "rabbit",
          "other",
          "total µs/msg",
        ],
        runs.map((r) => [
          `${kindName(r.kind)} #${r.round}`,
          Math.round(r.rate),
          round(r.seconds, 1),
          round(r.relayDone, 1),
          r.drain === undefined ? undefined : round(r.drain, 1),
          r.storedDone === undefined ? undefined : round(r.storedDone, 1),
          round(r.runsPerMessage, 2),
          Math.round(r.enqueueRate),
          r.inboxAnalyzed,
          r.cpu.perChild[0] === undefined ? undefined : round(r.cpu.perChild[0], 2),
          r.cpu.perChild[1] === undefined ? undefined : round(r.cpu.perChild[1], 2),
          r.cpu.postgres === undefined ? undefined : round(r.cpu.postgres, 2),
          r.cpu.rabbitmq === undefined ? undefined : round(r.cpu.rabbitmq, 2),
          r.cpu.other === undefined ? undefined : round(r.cpu.other, 2),
          perMessage(
            r.cpu.machineBusy === undefined || r.cpu.other === undefined
              ? undefined
              : r.cpu.machineBusy - r.cpu.other,
            r,
          ),
        ]),
      )
      const same = (a: Kind, b: Kind) => a.ordered === b.ordered && a.keys === b.keys
      const rateOf = (kind: Kind) => median(runs.filter((r) => same(r.kind, kind)).map((r) => r.rate))
      const enqueueOf = (kind: Kind) =>
        median(runs.filter((r) => same(r.kind, kind)).map((r) => r.enqueueRate))
      const unordered = kinds[0]!
      printTable(
        `Medians of ${config.rounds} round(s); the goal: ordered ≥ 0.5 × unordered`,
        ["", "msg/s end to end", "/ unordered", "enqueue msg/s", "/ unordered"],
        kinds.map((kind) => [
          kindName(kind),
          Math.round(rateOf(kind)),
          round(rateOf(kind) / rateOf(unordered), 2),
          Math.round(enqueueOf(kind)),
          round(enqueueOf(kind) / enqueueOf(unordered), 2),
        ]),
      )
      const summary: Record<string, number> = {}
      for (const kind of kinds) {
        const name = kind.ordered ? `ordered${kind.keys}` : "unordered"
        summary[name] = round(rateOf(kind))
        summary[`${name}Enqueue`] = round(enqueueOf(kind))
        if (kind.ordered) summary[`${name}OverUnordered`] = round(rateOf(kind) / rateOf(unordered), 3)
      }
      writeResult("ordered", args, services, { summary, config, results: runs })
    } finally {
      await db.destroy()
      await deleteTopology(services.amqpUrl, topology)
      await bench.drop()
    }
  }),
)
