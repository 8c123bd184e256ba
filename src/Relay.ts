/**
 * The relay: claim → publish → mark, as one Effect pipeline per worker.
 *
 * Guarantees: a row is marked `sent` only after the broker confirmed it; a
 * claimed row is never lost (a dead relay's lease runs out and the row comes
 * due again) and never marked twice (marks match the claim's token). So
 * delivery is at least once: a relay that dies between confirm and mark
 * publishes those messages again, and the consumer's inbox absorbs that.
 *
 * This module wires parts together: the batch is `core/relayCycle.ts`, the
 * loop `core/leaseLoop.ts`, the retry-or-dead rule `core/verdict.ts`.
 */
import { type Duration, Effect, Layer, Metric, Option, Schedule, type Scope } from "effect"
import { bounded } from "./core/bounded.ts"
import * as config from "./core/config.ts"
import { isLive, makeLoopState, runLeaseLoop } from "./core/leaseLoop.ts"
import { PARTITIONS_CHECK_MS } from "./core/partitioning.ts"
import {
  type Lag,
  lagProbe,
  makeRelayCounters,
  partitionsPass,
  type RelaySettings,
  relayCycle,
  retentionPass,
  type StopResend,
} from "./core/relayCycle.ts"
import { makeSignal, subscribeWakeups } from "./core/signal.ts"
import { uuidv7 } from "./core/uuid.ts"
import { runWalLoop } from "./core/walRelay.ts"
import { ConfigError } from "./Errors.ts"
import * as Metrics from "./Metrics.ts"
import { OutboxLog, type OutboxLogStatus } from "./ports/OutboxLog.ts"
import { type OutboxMark, type OutboxShard, OutboxStore, type OutboxStoreShape } from "./ports/OutboxStore.ts"
import { Transport } from "./ports/Transport.ts"
import { makeRetryPolicy, type RetryPolicy } from "./Retry.ts"

/** Options of a relay (`Relay.make`, `Relay.layer`, `txbox.relay()`); every one has a default. */
export interface RelayConfig {
  /** Rows claimed and published per cycle. @default 1000 */
  readonly batchSize?: number
  /** Concurrent claim → publish → mark loops in this process. @default 1 */
  readonly workers?: number
  /** How long a claim holds its rows; a relay that dies releases them after this. Keep it well above the publish timeout. @default "30 seconds" */
  readonly lease?: Duration.Input
  /** Fallback poll when no NOTIFY arrives. @default "1 second"; "100 millis" with `shard` */
  readonly pollInterval?: Duration.Input
  /**
   * This relay's share of the outbox; without it, every row. `{ tenants }`: the rows enqueued for
   * those tenants (on their own index: another tenant's backlog or poison never delays them).
   * `{ of, index }`: share `index` of `of`, by a stable hash of the partition key (the id for a
   * message without one), so a key is always in one share. Shares and relays without one may run
   * side by side; a row in no running relay's share waits for one. Producers skip their wake-up
   * while any relay published in the last 100 ms, so a sharded relay polls every 100 ms by default.
   * @default every row
   */
  readonly shard?: OutboxShard
  /**
   * Where the relay learns of new rows. `"poll"`: it claims due rows, woken by NOTIFY and a poll.
   * `"wal"`: it reads the outbox's inserts from PostgreSQL's WAL through a logical replication slot
   * (provide `WalLog.layer` from `txbox/pg`) and publishes each commit as the log brings it, with no
   * claim; a polling sweep beside it publishes delayed and retried rows, and any row still pending
   * `sweepAfter` after it was enqueued (docs/production.md, "A relay that tails the WAL").
   * Not with `shard`. @default "poll"
   */
  readonly source?: "poll" | "wal"
  /**
   * With `source: "wal"`: how long after its enqueue a row still pending is published by the
   * sweep instead (its reader away: a standby, a restart, a slot lost). @default "10 seconds"
   */
  readonly sweepAfter?: Duration.Input
  /**
   * The shortest time from one batch's start to the next under load; twice that while few rows
   * come in (fewer than 40 per twice that: below 800 msg/s per relay process at the default, with
   * either source). A batch is what committed meanwhile, so batches grow with the rate instead of
   * their number: each costs a claim, a publish, a confirm and a mark, and downstream a broker
   * message and a consumer delivery. Lower it for latency, raise it for cost per message: at 1,000
   * msg/s on one 2-core machine (one relay and one inbox process, bench/cost.ts, 2026-12-06) the
   * default looks every 25 ms, commit → handler p99 36–52 ms; "10 millis" (every 20 ms) gave 29 ms;
   * looks every 50 ms 66–77 ms. All five parties' CPU per message was 0.67–0.81× the hand-written
   * pipeline's at 25 ms, 0.65–0.69× at 50; the relay's own 1.4–1.8× the hand-written relay's at
   * 25 ms, 1.1–1.3× at 50; in a back-to-back A/B the 25 ms looks cost 7 % more CPU per message
   * in all (docs/benchmarks.md). The first commit after a quiet spell is published at once (its
   * NOTIFY wakes the relay). @default "25 millis"
   */
  readonly batchEvery?: Duration.Input
  /** Per-message retries, persisted in `visible_at`. @default defaultRetryPolicy */
  readonly retry?: Partial<RetryPolicy>
  /** Backoff of the whole loop while the database or broker is unreachable. @default 100 ms doubling to 10 s, jittered */
  readonly outageRetry?: Partial<RetryPolicy>
  /**
   * In-process retention: every `every`, delete sent rows published more than
   * `olderThan` ago, `batchSize` rows per statement. With several relay processes one at a
   * time runs it (a lease row, handed on within `3 × every` when its holder dies). Pending and
   * dead rows are never deleted. With it, the relay also keeps the outbox's day
   * partitions: made three days ahead, dropped once their range ended more than
   * `olderThan` ago and they hold no pending or dead row (their dead rows go to
   * the archive first). Without it no day partition is made: rows stay in the
   * default partition.
   * @default off
   */
  readonly retention?: {
    readonly olderThan: Duration.Input
    /** @default "1 hour" */
    readonly every?: Duration.Input
    /** @default 5000 */
    readonly batchSize?: number
  }
}

/** Counts since this relay started (not persisted), and its loop's last cycle. */
export interface RelayStats {
  /** Messages the broker confirmed and the relay marked sent. */
  readonly published: number
  /** Failed publishes scheduled for another attempt. */
  readonly retried: number
  /** Messages given up on (attempts exhausted, or refused for good). */
  readonly dead: number
  /** Marks that found their row already re-claimed by another relay (lease ran out). */
  readonly lostLeases: number
  /** Claims that found rows and went through publish and mark. */
  readonly batches: number
  /** Every claim made, rows or none: `claims - batches` looked and found nothing. */
  readonly claims: number
  /** When a worker's loop last ended a cycle (succeeded or failed); undefined before the first. */
  readonly lastCycleAt: Date | undefined
  /** The loop's last failure, cleared by its next successful cycle. */
  readonly lastError: string | undefined
}

/** A health check of a running relay, for readiness probes and dashboards. */
export interface RelayHealth {
  /** Use as a readiness probe: the broker is connected and the loop completed a cycle recently. */
  readonly ready: boolean
  /** Whether the transport's broker connection is up now. */
  readonly brokerConnected: boolean
  /** When a worker's loop last ended a cycle (succeeded or failed); undefined before the first. */
  readonly lastCycleAt: Date | undefined
  /**
   * Age of the oldest due, unpublished message, measured every few seconds by one relay process at
   * a time (the one holding the lag probe's lease: `lagMeasured`); 0 in the others.
   */
  readonly lagSeconds: number
  /** Whether this process measures the lag now (one relay process at a time does). */
  readonly lagMeasured: boolean
  /**
   * Whether NOTIFY wake-ups reach this process's loops. False means polling only: LISTEN is off or
   * could not start, or its self-test (a NOTIFY the store sends itself through the pool) went
   * unheard — typically a transaction pooler such as PgBouncer without a `listenUrl`. Not part of
   * `ready`: nothing is lost, only latency grows to the poll interval.
   */
  readonly listening: boolean
  /** The loop's last failure, cleared by its next successful cycle. */
  readonly lastError: string | undefined
  /** With `source: "wal"`: the log's reading (this process reads the slot, or stands by) and what the slot retains. */
  readonly wal?: OutboxLogStatus
}

/** What `Relay.make` returns: the running relay's stats and health, read on demand. */
export interface RelayHandle {
  /** Reads the counters since start. */
  readonly stats: Effect.Effect<RelayStats>
  /** Checks the broker connection, the loop's liveness and the outbox lag. */
  readonly health: Effect.Effect<RelayHealth>
}

/** The validated configuration, durations in milliseconds. */
export interface ResolvedRelayConfig extends RelaySettings {
  /** `RelayConfig.workers`: concurrent claim → publish → mark loops. */
  readonly workers: number
  /** `RelayConfig.pollInterval`, in ms. */
  readonly pollMs: number
  /** `RelayConfig.source`. */
  readonly source: "poll" | "wal"
  /** `RelayConfig.batchEvery`, in ms. */
  readonly batchEveryMs: number
  /** `RelayConfig.retention` in seconds and ms, with its defaults; undefined when off. */
  readonly retention:
    | { readonly olderThanSeconds: number; readonly everyMs: number; readonly batchSize: number }
    | undefined
}

/** The most tenants one relay's share may name: each is a key the claim's index is probed for. */
const MAX_SHARD_TENANTS = 1000

/** `RelayConfig.shard` checked, as a copy a caller's later change cannot reach. */
const resolveShard = (shard: OutboxShard | undefined): OutboxShard | undefined => {
  if (shard === undefined) return undefined
  config.check(
    typeof shard === "object" && shard !== null,
    "relay shard",
    "must be { tenants } or { of, index }",
    shard,
  )
  if ("tenants" in shard) {
    const { tenants } = shard
    config.check(
      Array.isArray(tenants) && tenants.length >= 1 && tenants.length <= MAX_SHARD_TENANTS,
      "relay shard.tenants",
      `must be an array of 1..${MAX_SHARD_TENANTS} tenant ids`,
      tenants,
    )
    for (const tenant of tenants) {
      config.check(
        typeof tenant === "string" && tenant.length > 0 && !tenant.includes("\0"),
        "relay shard.tenants",
        "must hold non-empty strings without NUL",
        tenant,
      )
    }
    return Object.freeze({ tenants: Object.freeze([...new Set(tenants)]) })
  }
  const of = config.integer("relay shard.of", (shard as { of?: number }).of, Number.NaN, 1, 1024)
  const index = config.integer(
    "relay shard.index",
    (shard as { index?: number }).index,
    Number.NaN,
    0,
    of - 1,
  )
  return Object.freeze({ of, index })
}

/** Validates every option once; a bad one is a `ConfigError` naming it. */
export const resolveConfig = (c: RelayConfig): Effect.Effect<ResolvedRelayConfig, ConfigError> =>
  config.validateConfig(() => {
    const leaseMs = config.millis("relay lease", c.lease, "30 seconds", { minMs: 1000 })
    const retention = c.retention && {
      olderThanSeconds:
        config.millis("relay retention.olderThan", c.retention.olderThan, 0, { minMs: 1 }) / 1000,
      everyMs: config.millis("relay retention.every", c.retention.every, "1 hour", { minMs: 1 }),
      batchSize: config.integer("relay retention.batchSize", c.retention.batchSize, 5000, 1, 1_000_000),
    }
    const source = config.oneOf("relay source", c.source, "poll", ["poll", "wal"])
    config.check(
      source === "poll" || c.shard === undefined,
      "relay shard",
      'is for polling relays: one reader reads the WAL (source: "wal")',
      c.shard,
    )
    const sweepAfterMs = config.millis("relay sweepAfter", c.sweepAfter, "10 seconds", { minMs: 100 })
    return {
      source,
      batchEveryMs: config.millis("relay batchEvery", c.batchEvery, "25 millis", { minMs: 0, maxMs: 10_000 }),
      batchSize: config.integer("relay batchSize", c.batchSize, 1000, 1, 50_000),
      workers: config.integer("relay workers", c.workers, 1, 1, 64),
      leaseMs,
      pollMs: config.millis(
        "relay pollInterval",
        c.pollInterval,
        c.shard === undefined ? "1 second" : "100 millis",
        { minMs: 1 },
      ),
      // A WAL relay's polling loop is its sweep: its share is what the log leaves (core/walRelay.ts).
      shard: source === "wal" ? { sweepAfterMs } : resolveShard(c.shard),
      statementTimeoutMs: Math.min(leaseMs / 4, 10_000),
      retry: makeRetryPolicy(c.retry, "relay retry"),
      outage: makeRetryPolicy(
        { initialDelay: "100 millis", maxDelay: "10 seconds", ...c.outageRetry },
        "relay outageRetry",
      ),
      retention,
    }
  })

/**
 * While fewer rows than this come in per 2 × `batchEvery`, the looks come every 2 × `batchEvery`:
 * a look costs about the same whatever its size, so at the default 25 ms, below 800 msg/s a
 * worker looks every 50 ms (the hand-written relay's cadence in bench/cost.ts) and its batches grow
 * instead; above, every 25 ms (from one look's start to the next), for the latency. Per relay
 * process: two relays at 1,000 msg/s each see half. From 2026-12-04 to 12-06 the bar was 80 rows
 * (1,600 msg/s), for the relay's CPU; at 1,000 msg/s, 1 + 1, in one session (bench/cost.ts, the
 * hand-written pipeline as the control): commit → handler p99 69–77 ms at 80 (five runs), 36–37 ms
 * at 40 (two; 2 + 2: 67 against 36; bench/all.ts's medians 43 and 45), all five parties 0.65–0.69×
 * the hand-written pipeline's CPU at 80 and 0.67 at 40 (0.81 in bench/all.ts's medians), the
 * relay's own 1.06–1.27× against 1.39–1.83×. A back-to-back A/B of three rounds each: p99 65 → 37
 * ms, all five 829 → 889 µs per message (+7 %; 0.71 → 0.81× the hand-written). The latency is what
 * every user of the relay sees; `batchEvery: "50 millis"` buys the CPU back (docs/benchmarks.md).
 */
const FEW_ROWS = 40
/**
 * Producers skip the NOTIFY while a row was marked sent within 100 ms (migration 0014), and for
 * 25 ms more after asking (storage/sql/enqueue.ts's QUIET_MS); a batch's mark goes with the next
 * look, or alone after 70 ms (heldClaims.ts's MARK_WAIT_MS). A look must come after that window has
 * closed, with room for their commits, however long the wait between looks: so a worker keeps
 * looking at its cadence for this long after a look that found rows, longer with a slower cadence
 * (`pollingCadence`).
 */
const HOT_MS = 200
/**
 * What `HOT_MS` must cover beyond one wait between looks: the mark (it rides that look; alone, it
 * waits 70 ms only when the wait is longer), 100 + 25 ms of skipped NOTIFYs, and room.
 */
const HOT_BEYOND_LOOK_MS = 150
const WARM_MS = 1_000
/** A WAL relay's sweep looks at the polling relay's default cadence, whatever `batchEvery` says of the log's batches. */
const SWEEP_BATCH_EVERY_MS = 25

/**
 * The polling relay's looks for `RelayConfig.batchEvery` (ms): a look every `relookMs` under load,
 * 2 × that below `FEW_ROWS` per 2 × that, kept up for `hotMs` after a look that found rows. A
 * `batchEvery` of 0 looks as soon as the last look ended.
 */
export const pollingCadence = (
  batchEveryMs: number,
): { readonly relookMs: number; readonly hotMs: number } => {
  const relookMs = Math.max(1, batchEveryMs)
  return { relookMs, hotMs: Math.max(HOT_MS, 2 * relookMs + HOT_BEYOND_LOOK_MS) }
}

/** Starts the relay's workers in the current scope; closing the scope stops them gracefully. */
export const make = (
  relayConfig: RelayConfig = {},
): Effect.Effect<RelayHandle, ConfigError, OutboxStore | Transport | Scope.Scope> =>
  Effect.gen(function* () {
    const c = yield* resolveConfig(relayConfig)
    const store = yield* OutboxStore
    const transport = yield* Transport
    const counters = makeRelayCounters()
    const state = makeLoopState()
    const lag: Lag = { seconds: 0, measured: false }
    // This process, to the housekeeping leases: the lag probe and retention run in one process at a time.
    const holder = uuidv7()
    const wake = makeSignal()
    // A WAL relay's sweep polls: a NOTIFY is for fresh rows, which the log brings.
    const wakeups =
      c.source === "wal"
        ? { listening: false }
        : yield* subscribeWakeups(
            // Called as the store's method: a store written as a class keeps its `this`.
            (onWake, onHearing) => store.wakeups(onWake, onHearing),
            wake,
            (e) => `relay: LISTEN unavailable, polling only: ${e.message}`,
          )
    const log = c.source === "wal" ? yield* walSource(store) : undefined

    // Whether another relay process's looks cover this one's (core/relayCycle.ts's LookCover).
    const cover = { covered: false, leading: false }
    // Which broker stop this process has published again what came just before (relayCycle.ts).
    const stop: StopResend = { answered: undefined }
    const loop = {
      name: "relay",
      batchSize: c.batchSize,
      pollMs: c.pollMs,
      // Producers skip the NOTIFY while a relay published within the last 100 ms or a committed
      // row is due and unclaimed (migrations 0013, 0014), and such a producer may commit after this
      // worker's last look: after a cycle that claimed rows it looks again every `batchEvery` (2×
      // after fewer than FEW_ROWS) for hotMs, then after 2×, 4× … for WARM_MS, which bounds that
      // row's wait unless its transaction stays open longer than that after enqueue.
      // A WAL relay's polling loop is its sweep (delayed and retried rows): `batchEvery` spaces the log's batches.
      ...pollingCadence(c.source === "wal" ? SWEEP_BATCH_EVERY_MS : c.batchEveryMs),
      fewRows: FEW_ROWS,
      warmMs: WARM_MS,
      // Another relay's publishes say nothing of a share's rows: a sharded relay is never covered.
      ...(c.shard === undefined ? { covered: () => cover.covered, leads: () => cover.leading } : {}),
      hearing: () => wakeups.listening,
      // A row due by time (a delay, a retry's backoff, a dead relay's lease) wakes nobody: with a
      // poll interval over a second, a wait ends when the next pending row is due.
      ...(store.nextDueMs === undefined
        ? {}
        : { nextDueMs: bounded("Relay.nextDue", c.statementTimeoutMs)(store.nextDueMs) }),
      outage: c.outage,
      wake,
      state,
    }
    for (let i = 0; i < c.workers; i++) {
      // A cycle of its own per worker: it holds the worker's batch in flight (core/relayCycle.ts),
      // which a shutdown waits for.
      const { cycle, drain } = relayCycle(store, transport, c, counters, cover, stop)
      yield* Effect.forkScoped(Effect.ensuring(runLeaseLoop({ ...loop, cycle }), drain))
    }
    if (log !== undefined) {
      yield* Effect.forkScoped(
        runWalLoop(log.log, log.settle, transport, c, counters, makeLoopState(), c.batchEveryMs),
      )
      yield* Effect.forkScoped(
        Effect.repeat(
          Effect.flatMap(log.log.status, (status) =>
            Metric.update(Metrics.walRetained, status.retainedBytes ?? 0),
          ),
          Schedule.spaced(5_000),
        ),
      )
    }
    const lagEvery = Math.max(1000, Math.min(c.pollMs * 5, 5000))
    yield* Effect.forkScoped(Effect.repeat(lagProbe(store, lag, holder, lagEvery), Schedule.spaced(lagEvery)))
    if (c.retention) {
      // Day partitions only with retention, which drops them: kept forever, their number would grow
      // by one a day, and so would the planning of every claim (a simple one: 0.06 ms with one
      // partition, 0.9 ms with 31, 29 ms with 366). Without them every row stays in the default one.
      const dropOlderThanMs = c.retention.olderThanSeconds * 1000
      yield* Effect.forkScoped(
        Effect.repeat(partitionsPass(store, holder, dropOlderThanMs), Schedule.spaced(PARTITIONS_CHECK_MS)),
      )
      const { olderThanSeconds, everyMs, batchSize } = c.retention
      yield* Effect.forkScoped(
        Effect.repeat(
          retentionPass(store, olderThanSeconds, batchSize, holder, everyMs),
          Schedule.spaced(everyMs),
        ),
      )
    }

    const date = (ms: number | undefined) => (ms === undefined ? undefined : new Date(ms))
    const stats = Effect.sync(
      (): RelayStats => ({ ...counters, lastCycleAt: date(state.lastCycleAt), lastError: state.lastError }),
    )
    // Idle relays still claim (and find nothing) every poll interval, so a
    // healthy relay's last cycle is never older than a few poll intervals.
    const health = Effect.gen(function* () {
      const brokerConnected = yield* transport.isConnected
      const live = yield* isLive(state, c.pollMs * 3 + c.leaseMs)
      const wal = log === undefined ? undefined : yield* log.log.status
      return {
        ...(wal === undefined ? {} : { wal }),
        ready: brokerConnected && live,
        brokerConnected,
        lastCycleAt: date(state.lastCycleAt),
        lagSeconds: lag.seconds,
        lagMeasured: lag.measured,
        listening: wakeups.listening,
        lastError: state.lastError,
      } satisfies RelayHealth
    })
    return { stats, health } satisfies RelayHandle
  })

/** The log a WAL relay reads, and the store's write for rows no claim holds; a `ConfigError` without them. */
const walSource = (store: OutboxStoreShape) =>
  Effect.gen(function* () {
    const log = yield* Effect.serviceOption(OutboxLog)
    if (Option.isNone(log)) {
      return yield* new ConfigError({
        reason: 'relay source "wal" reads the outbox\'s log: provide WalLog.layer({ url }) from txbox/pg',
      })
    }
    if (store.settle === undefined) {
      return yield* new ConfigError({
        reason:
          'relay source "wal" needs a store that settles rows no claim holds (the PostgreSQL stores do)',
      })
    }
    const settle = store.settle
    return { log: log.value, settle: (marks: ReadonlyArray<OutboxMark>) => settle(marks) }
  })

/** The relay as a layer: its workers live as long as the layer. */
export const layer = (config: RelayConfig = {}): Layer.Layer<never, ConfigError, OutboxStore | Transport> =>
  Layer.effectDiscard(make(config))

/** Runs the relay until interrupted (e.g. on SIGTERM via `Effect.runFork(...)` and `fiber.interrupt`). */
export const run = (config: RelayConfig = {}): Effect.Effect<never, ConfigError, OutboxStore | Transport> =>
  Effect.scoped(Effect.andThen(make(config), Effect.never))
