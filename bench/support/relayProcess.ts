// A txbox relay in a process of its own (for memory, scale-out and latency), driven over stdio:
// it connects, prints {"event":"ready"}, starts its workers when a "go" line arrives on stdin, and
// prints {"event":"stats", ...} every STATS_MS with its counters and its own RSS, sampled here, in
// the relay's process. SIGTERM (or a "stop" line) closes the relay gracefully and exits 0.
//
// env: DB_URL, LISTEN_URL (LISTEN straight to the database when DB_URL is a pooler), AMQP_URL, EXCHANGE,
//      BATCH, WORKERS, LISTEN ("false" = polling only), POLL_MS,
//      STATS_MS (default 1000); BATCH, WORKERS, LISTEN and POLL_MS unset or empty = the library's defaults;
//      SOURCE=wal: the relay reads the outbox's log (WalLog on LISTEN_URL, else DB_URL: a direct URL),
//      BATCH_EVERY (ms, its batchEvery, polling or wal; unset: the default)
import { Effect, Exit, Layer, ManagedRuntime, Scope } from "effect"
import * as Relay from "../../src/Relay.ts"
import * as PgStore from "../../src/storage/drivers/pg/PgStore.ts"
import * as WalLog from "../../src/storage/drivers/pg/walLog.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { onCommands } from "./childIo.ts"

const env = (name: string, fallback?: string): string => {
  const value = process.env[name] ?? fallback
  if (value === undefined) throw new Error(`${name} is required`)
  return value
}

const emit = (event: Record<string, unknown>) => {
  process.stdout.write(`${JSON.stringify(event)}\n`)
}

const wal = process.env.SOURCE === "wal"
const runtime = ManagedRuntime.make(
  Layer.mergeAll(
    PgStore.layer({
      url: env("DB_URL"),
      // A pooler's URL in DB_URL: LISTEN straight to the database.
      ...(process.env.LISTEN_URL ? { listenUrl: process.env.LISTEN_URL } : {}),
      ...(process.env.LISTEN ? { listen: process.env.LISTEN !== "false" } : {}),
    }),
    AmqpTransport.layer({ url: env("AMQP_URL"), exchange: env("EXCHANGE"), failFast: true }),
    wal ? WalLog.layer({ url: process.env.LISTEN_URL || env("DB_URL") }) : Layer.empty,
  ),
)
await runtime.runPromise(Effect.void)

const optional = (name: string): number | undefined =>
  process.env[name] === undefined || process.env[name] === "" ? undefined : Number(process.env[name])
const batchSize = optional("BATCH")
const workers = optional("WORKERS")
const pollMs = optional("POLL_MS")

const scope = await runtime.runPromise(Scope.make())
let handle: Relay.RelayHandle | undefined
let startedAt = 0
const statsEvery = Number(env("STATS_MS", "1000"))

const report = async (event: string) => {
  const stats = handle ? await runtime.runPromise(handle.stats) : undefined
  // The heap's figures walk the heap (2.7 % of an inbox's samples at 10 reports a second, which the
  // hand-written processes do not pay): only memory.ts reads them; HEAP=0 leaves them out.
  const memory =
    process.env.HEAP === "0" ? { rss: process.memoryUsage.rss(), heapUsed: 0 } : process.memoryUsage()
  const cpu = process.cpuUsage()
  emit({
    event,
    t: startedAt === 0 ? 0 : (performance.now() - startedAt) / 1000,
    published: stats?.published ?? 0,
    retried: stats?.retried ?? 0,
    dead: stats?.dead ?? 0,
    batches: stats?.batches ?? 0,
    claims: stats?.claims ?? 0,
    rss: memory.rss,
    heapUsed: memory.heapUsed,
    cpuSeconds: (cpu.user + cpu.system) / 1e6,
  })
}

let timer: ReturnType<typeof setInterval> | undefined
let stopping: Promise<void> | undefined
const stop = () => {
  stopping ??= (async () => {
    clearInterval(timer)
    await runtime.runPromise(Scope.close(scope, Exit.void))
    await report("stopped")
    await runtime.dispose()
    process.exit(0)
  })()
  return stopping
}

const start = async () => {
  if (handle) return
  startedAt = performance.now()
  handle = await runtime.runPromise(
    Relay.make({
      ...(batchSize === undefined ? {} : { batchSize }),
      ...(workers === undefined ? {} : { workers }),
      ...(pollMs === undefined ? {} : { pollInterval: pollMs }),
      ...(wal ? { source: "wal" as const } : {}),
      ...(optional("BATCH_EVERY") !== undefined ? { batchEvery: optional("BATCH_EVERY")! } : {}),
    }).pipe(Scope.provide(scope)),
  )
  await report("stats")
  timer = setInterval(() => {
    if (!stopping) report("stats").catch(() => {})
  }, statsEvery)
}

onCommands((line) => {
  if (line === "go") void start()
}, stop)
await report("ready")
