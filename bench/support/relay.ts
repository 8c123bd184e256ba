// The txbox relay, run in the bench's own process over the real PgStore and AmqpTransport,
// timed from the moment its workers start until it has marked `expected` rows sent.
import { Effect, Exit, Layer, ManagedRuntime, Scope, Tracer } from "effect"
import * as Relay from "../../src/Relay.ts"
import * as PgStore from "../../src/storage/drivers/pg/PgStore.ts"
import * as WalLog from "../../src/storage/drivers/pg/walLog.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import type { CpuMeter, CpuUse } from "./cpu.ts"
import { sleep } from "./harness.ts"

export interface Phase {
  readonly count: number
  readonly totalMs: number
  readonly meanMs: number
}

/**
 * A tracer that keeps the duration of every span by name: the relay's own spans (Relay.claim,
 * AmqpTransport.publish, Relay.mark) then tell where a batch's time goes, without touching src/.
 */
const phaseTracer = () => {
  const totals = new Map<string, { count: number; totalNs: bigint }>()
  class TimedSpan extends Tracer.NativeSpan {
    override end(endTime: bigint, exit: Exit.Exit<unknown, unknown>): void {
      if (this.status._tag === "Started") {
        const t = totals.get(this.name) ?? { count: 0, totalNs: 0n }
        t.count++
        t.totalNs += endTime - this.status.startTime
        totals.set(this.name, t)
      }
      super.end(endTime, exit)
    }
  }
  const tracer = Tracer.make({ span: (options) => new TimedSpan(options) })
  const phases = (): Record<string, Phase> => {
    const out: Record<string, Phase> = {}
    for (const [name, t] of totals) {
      const totalMs = Number(t.totalNs) / 1e6
      out[name] = { count: t.count, totalMs, meanMs: totalMs / t.count }
    }
    return out
  }
  return { tracer, phases }
}

export interface RelayRunOptions {
  readonly dbUrl: string
  readonly amqpUrl: string
  readonly exchange: string
  readonly batchSize: number
  readonly workers: number
  /** Rows to wait for (the backlog). */
  readonly expected: number
  readonly timeoutMs: number
  readonly meter: CpuMeter
  /** Record span durations per phase (a tracer costs a little per batch, nothing per message). */
  readonly phases?: boolean
  /**
   * "wal": the relay reads the outbox's log (the server needs wal_level = logical), its sweep held
   * off for the run, so the log's reader alone drains. @default "polling"
   */
  readonly source?: "polling" | "wal"
  /** Runs once the connections are open (a WAL relay's slot exists), before the clock starts: the fill. */
  readonly prepare?: () => Promise<void>
}

export interface RelayRun {
  readonly published: number
  readonly seconds: number
  readonly rate: number
  readonly batches: number
  readonly retried: number
  readonly cpu: CpuUse
  readonly phases: Record<string, Phase> | undefined
}

export const runRelayInProcess = async (o: RelayRunOptions): Promise<RelayRun> => {
  const wal = o.source === "wal"
  const infra = Layer.mergeAll(
    PgStore.layer({ url: o.dbUrl }),
    AmqpTransport.layer({ url: o.amqpUrl, exchange: o.exchange, failFast: true }),
    wal ? WalLog.layer({ url: o.dbUrl }) : Layer.empty,
  )
  const runtime = ManagedRuntime.make(infra)
  try {
    // Connections are opened here, before the clock starts: a relay's start-up is not its throughput.
    await runtime.runPromise(Effect.void)
    await o.prepare?.()
    const scope = await runtime.runPromise(Scope.make())
    const traced = o.phases ? phaseTracer() : undefined
    const make = Relay.make({
      batchSize: o.batchSize,
      workers: o.workers,
      ...(wal ? { source: "wal" as const, sweepAfter: "1 hour" } : {}),
    }).pipe(Scope.provide(scope))
    const before = o.meter.sample()
    const handle = await runtime.runPromise(traced ? Effect.withTracer(make, traced.tracer) : make)
    const deadline = performance.now() + o.timeoutMs
    let stats = await runtime.runPromise(handle.stats)
    while (stats.published + stats.dead < o.expected) {
      if (performance.now() > deadline) {
        throw new Error(`relay published ${stats.published}/${o.expected} within ${o.timeoutMs} ms`)
      }
      // Every 10 ms: precise enough for runs of seconds, and cheap enough not to show in the relay's CPU.
      await sleep(10)
      stats = await runtime.runPromise(handle.stats)
    }
    const after = o.meter.sample()
    await runtime.runPromise(Scope.close(scope, Exit.void))
    const cpu = o.meter.use(before, after)
    return {
      published: stats.published,
      seconds: cpu.seconds,
      rate: stats.published / cpu.seconds,
      batches: stats.batches,
      retried: stats.retried,
      cpu,
      phases: traced?.phases(),
    }
  } finally {
    await runtime.dispose()
  }
}
