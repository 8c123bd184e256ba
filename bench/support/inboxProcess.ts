// A txbox Inbox in a process of its own, as a consuming service runs it (for the latency and
// ordered benches): prints {"event":"ready"} once subscribed, {"event":"stats", ...} every
// STATS_MS, and on a "report" line {"event":"report", latencies: [[serial, ms], ...]}: for every
// handled message with a `committedAt`, the handler's start time minus that commit time.
// With RECORD=1 the handler also inserts (serial, partition key, seq) into `bench.handled` through
// the inbox's transaction: an effect that commits with the inbox row, counted and checked by the bench.
//
// env: DB_URL, LISTEN_URL (LISTEN straight to the database when DB_URL is a pooler), AMQP_URL, EXCHANGE, CONSUMER, MODE (idempotent | store-then-process),
//      MODE, PREFETCH, TRANSACTIONS and QUEUE_TYPE (unset or empty: the library's defaults), STATS_MS (default 1000), RECORD (default 0);
//      BATCH, POLL_MS, CONCURRENCY: the processor's batchSize, pollInterval (ms) and
//      processorConcurrency, only when set (else the Inbox defaults); FAIL_FRACTION (0..1, default 0):
//      the share of handler runs that fail on purpose, counted in the stats as `handlerRuns`/`handlerFailures`
import { Effect, Exit, Layer, ManagedRuntime, Scope } from "effect"
import { CompiledQuery } from "kysely"
import * as Inbox from "../../src/Inbox.ts"
import * as PgStore from "../../src/storage/drivers/pg/PgStore.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { onCommands } from "./childIo.ts"
import { HANDLED_INSERT } from "./hand.ts"
import { OrderPlaced, wallMs } from "./payload.ts"

const env = (name: string, fallback?: string): string => {
  const value = process.env[name] ?? fallback
  if (value === undefined) throw new Error(`${name} is required`)
  return value
}
const emit = (event: Record<string, unknown>) => {
  process.stdout.write(`${JSON.stringify(event)}\n`)
}

const runtime = ManagedRuntime.make(
  Layer.mergeAll(
    PgStore.layer({
      url: env("DB_URL"),
      // A pooler's URL in DB_URL: LISTEN straight to the database.
      ...(process.env.LISTEN_URL ? { listenUrl: process.env.LISTEN_URL } : {}),
    }),
    AmqpTransport.layer({
      url: env("AMQP_URL"),
      exchange: env("EXCHANGE"),
      ...(process.env.QUEUE_TYPE ? { queueType: process.env.QUEUE_TYPE as "quorum" | "classic" } : {}),
      failFast: true,
    }),
  ),
)
const latencies: Array<[number, number]> = []
const record = env("RECORD", "0") === "1"
const optional = (name: string): number | undefined =>
  process.env[name] === undefined || process.env[name] === "" ? undefined : Number(process.env[name])
const batchSize = optional("BATCH")
const pollMs = optional("POLL_MS")
const concurrency = optional("CONCURRENCY")
const transactions = optional("TRANSACTIONS")
const prefetch = optional("PREFETCH")
const failFraction = optional("FAIL_FRACTION") ?? 0
const runs = { handlerRuns: 0, handlerFailures: 0 }
const scope = await runtime.runPromise(Scope.make())
const handle = await runtime.runPromise(
  Inbox.make({
    consumer: env("CONSUMER"),
    ...(process.env.MODE ? { mode: process.env.MODE as "idempotent" | "store-then-process" } : {}),
    ...(prefetch === undefined ? {} : { prefetch }),
    ...(batchSize === undefined ? {} : { batchSize }),
    ...(pollMs === undefined ? {} : { pollInterval: pollMs }),
    ...(concurrency === undefined ? {} : { processorConcurrency: concurrency }),
    ...(transactions === undefined ? {} : { transactions }),
    handlers: [
      // Combinators, as the README writes a handler: under Bun an `Effect.gen` body run per message
      // is compiled again every second or two for as long as the process runs (bench/README.md).
      Inbox.handler(OrderPlaced, ({ payload, envelope, trx }) =>
        Effect.suspend(() => {
          runs.handlerRuns++
          if (failFraction > 0 && Math.random() < failFraction) {
            runs.handlerFailures++
            return Effect.fail(new Error("injected handler failure"))
          }
          if (payload.committedAt > 0) latencies.push([payload.serial, wallMs() - payload.committedAt])
          if (!record) return Effect.void
          // SQL text through the inbox's transaction: the same statement the hand-written inbox sends
          // (bench/cost.ts compares the inbox, not Kysely's `sql` template).
          return Effect.asVoid(
            Effect.tryPromise(() =>
              trx.executeQuery(
                CompiledQuery.raw(HANDLED_INSERT, [
                  payload.serial,
                  envelope.partitionKey ?? null,
                  envelope.position?.seq ?? null,
                ]),
              ),
            ),
          )
        }),
      ),
    ],
  }).pipe(Scope.provide(scope)),
)

const report = async (event: string) => {
  const stats = await runtime.runPromise(handle.stats)
  // rss() alone: process.memoryUsage() walks the heap too (2.7 % of this process's samples at 10
  // reports a second in bench/cost.ts, a cost the hand-written inbox does not pay).
  emit({ event, ...stats, ...runs, rss: process.memoryUsage.rss() })
}

let timer: ReturnType<typeof setInterval> | undefined
let stopping: Promise<void> | undefined
const stop = () => {
  stopping ??= (async () => {
    clearInterval(timer)
    await runtime.runPromise(Scope.close(scope, Exit.void))
    await runtime.dispose()
    process.exit(0)
  })()
  return stopping
}
onCommands((line) => {
  // Each report hands over what was recorded since the last one.
  if (line === "report") emit({ event: "report", latencies: latencies.splice(0) })
}, stop)
await report("ready")
timer = setInterval(
  () => {
    if (!stopping) report("stats").catch(() => {})
  },
  Number(env("STATS_MS", "1000")),
)
