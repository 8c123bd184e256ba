/**
 * The relay: claim → publish → mark, as one Effect pipeline per worker.
 *
 * Guarantees: a row is marked `sent` only after the broker confirmed it; a
 * claimed row is never lost (a dead relay's lease runs out and the row comes
 * due again) and never marked twice (marks match the claim's token). So
 * delivery is at least once: a relay that dies between confirm and mark
 * publishes those messages again, and the consumer's inbox absorbs that.
 */
import { Duration, Effect, Layer, Metric, Schedule, type Scope } from "effect"
import { decide } from "./core/decide.ts"
import { makeSignal } from "./core/Signal.ts"
import { uuidv7 } from "./core/uuid.ts"
import { ConfigError, StoreError, type TransportError } from "./Errors.ts"
import * as Metrics from "./Metrics.ts"
import { Database } from "./ports/Database.ts"
import { type OutgoingMessage, type PublishOutcome, Transport } from "./ports/Transport.ts"
import { makeRetryPolicy, type RetryPolicy, schedule } from "./Retry.ts"
import { tryStore } from "./storage/dbErrors.ts"
import * as opsSql from "./storage/opsSql.ts"
import * as outboxSql from "./storage/outboxSql.ts"

export interface RelayConfig {
  /** Rows claimed and published per cycle. @default 1000 */
  readonly batchSize?: number
  /** Concurrent claim → publish → mark loops in this process. @default 1 */
  readonly workers?: number
  /** How long a claim holds its rows; a relay that dies releases them after this. Keep it well above the publish timeout. @default "30 seconds" */
  readonly lease?: Duration.Input
  /** Fallback poll when no NOTIFY arrives. @default "1 second" */
  readonly pollInterval?: Duration.Input
  /** Per-message retries, persisted in `visible_at`. @default defaultRetryPolicy */
  readonly retry?: Partial<RetryPolicy>
  /** Backoff of the whole loop while the database or broker is unreachable. @default 100 ms doubling to 10 s, jittered */
  readonly outageRetry?: Partial<RetryPolicy>
  /**
   * In-process retention: every `every`, delete sent rows published more than
   * `olderThan` ago, `batchSize` rows per statement. Safe with several relays
   * (each batch locks with SKIP LOCKED). Pending and dead rows are never deleted.
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

export interface RelayStats {
  readonly published: number
  readonly retried: number
  readonly dead: number
  /** Marks that found their row already re-claimed by another relay (lease ran out). */
  readonly lostLeases: number
  readonly batches: number
  readonly lastCycleAt: Date | undefined
  readonly lastError: string | undefined
}

export interface RelayHealth {
  /** Use as a readiness probe: the broker is connected and the loop completed a cycle recently. */
  readonly ready: boolean
  readonly brokerConnected: boolean
  readonly lastCycleAt: Date | undefined
  /** Age of the oldest due, unpublished message, measured every few seconds. */
  readonly lagSeconds: number
  readonly lastError: string | undefined
}

export interface RelayHandle {
  readonly stats: Effect.Effect<RelayStats>
  readonly health: Effect.Effect<RelayHealth>
}

const resolveConfig = (config: RelayConfig) => {
  const batchSize = config.batchSize ?? 1000
  const workers = config.workers ?? 1
  if (!Number.isInteger(batchSize) || batchSize < 1 || batchSize > 50_000) {
    throw new ConfigError({ reason: `relay batchSize must be an integer in 1..50000, got ${batchSize}` })
  }
  if (!Number.isInteger(workers) || workers < 1 || workers > 64) {
    throw new ConfigError({ reason: `relay workers must be an integer in 1..64, got ${workers}` })
  }
  const leaseMs = Duration.toMillis(Duration.fromInputUnsafe(config.lease ?? "30 seconds"))
  const pollMs = Duration.toMillis(Duration.fromInputUnsafe(config.pollInterval ?? "1 second"))
  if (!(leaseMs >= 1000)) throw new ConfigError({ reason: "relay lease must be at least 1 second" })
  if (!(pollMs >= 1)) throw new ConfigError({ reason: "relay pollInterval must be positive" })
  const retention = config.retention && {
    olderThanSeconds: Duration.toSeconds(Duration.fromInputUnsafe(config.retention.olderThan)),
    everyMs: Duration.toMillis(Duration.fromInputUnsafe(config.retention.every ?? "1 hour")),
    batchSize: config.retention.batchSize ?? 5000,
  }
  if (retention && !(retention.olderThanSeconds > 0 && retention.everyMs > 0 && retention.batchSize >= 1)) {
    throw new ConfigError({ reason: "relay retention needs a positive olderThan, every and batchSize" })
  }
  return {
    retention,
    batchSize,
    workers,
    leaseMs,
    pollMs,
    retry: makeRetryPolicy(config.retry),
    outage: makeRetryPolicy({ initialDelay: "100 millis", maxDelay: "10 seconds", ...config.outageRetry }),
  }
}

const toMessage = (row: outboxSql.ClaimedRow): OutgoingMessage => ({
  id: row.id,
  type: row.type,
  version: row.version,
  routingKey: row.routing_key ?? row.type,
  body: row.payload,
  headers: row.headers ?? {},
  occurredAt: row.occurred_at,
  partitionKey: row.partition_key,
  tenantId: row.tenant_id,
})

/** Starts the relay's workers in the current scope; closing the scope stops them gracefully. */
export const make = (
  config: RelayConfig = {},
): Effect.Effect<RelayHandle, ConfigError, Database | Transport | Scope.Scope> =>
  Effect.gen(function* () {
    const c = yield* Effect.try({ try: () => resolveConfig(config), catch: (e) => e as ConfigError })
    const db = yield* Database
    const transport = yield* Transport
    const stats = {
      published: 0,
      retried: 0,
      dead: 0,
      lostLeases: 0,
      batches: 0,
      lastCycleAt: undefined as Date | undefined,
      lastError: undefined as string | undefined,
    }
    const wake = makeSignal()
    yield* db
      .listen(`${db.schema}.outbox`, wake.notify)
      .pipe(Effect.catch((e) => Effect.logWarning(`relay: LISTEN unavailable, polling only: ${e.message}`)))

    // A query on a connection whose server went away can hang instead of
    // failing (postgres.js after a backend dies); bound every statement so the
    // loop backs off and tries again instead of waiting forever.
    const bounded = <A>(operation: string, ms: number, effect: Effect.Effect<A, StoreError>) =>
      effect.pipe(
        Effect.timeoutOrElse({
          duration: ms,
          orElse: () => Effect.fail(new StoreError({ reason: "connection", operation, cause: "timed out" })),
        }),
      )
    const statementTimeout = Math.min(c.leaseMs / 4, 10_000)

    const claim = Effect.fn("Relay.claim")(function* (token: string) {
      const rows = yield* bounded(
        "Relay.claim",
        statementTimeout,
        tryStore("Relay.claim", (signal) => {
          const claimed = outboxSql.claim(db, c.batchSize, token, c.leaseMs)
          // Given up on (timed out), the statement may still run later: hand
          // whatever it claims straight back rather than leave it to the lease.
          signal.addEventListener("abort", () => {
            claimed.then((rows) => (rows.length > 0 ? outboxSql.release(db, token) : 0)).catch(() => 0)
          })
          return claimed
        }),
      )
      yield* Effect.annotateCurrentSpan("txbox.claimed", rows.length)
      return rows
    })

    const publish = Effect.fn("Relay.publish")(function* (rows: ReadonlyArray<outboxSql.ClaimedRow>) {
      return yield* transport.publish(rows.map(toMessage)).pipe(
        Effect.map((outcomes) => ({ outcomes, outage: undefined as TransportError | undefined })),
        Effect.catch((error) =>
          Effect.succeed({
            outcomes: rows.map((): PublishOutcome => ({ _tag: "Interrupted", error: error.message })),
            outage: error,
          }),
        ),
      )
    })

    const markBatch = Effect.fn("Relay.mark")(function* (
      token: string,
      marks: ReadonlyArray<outboxSql.RowMark>,
    ) {
      // A failed mark is retried for a while (the rows are confirmed; only the
      // record is missing). If the database stays away past half the lease the
      // rows come due again and are published twice: at least once, not lost.
      return yield* bounded(
        "Relay.mark",
        c.leaseMs / 2,
        bounded(
          "Relay.mark",
          statementTimeout,
          tryStore("Relay.mark", () => outboxSql.mark(db, token, marks)),
        ).pipe(Effect.retry({ schedule: schedule(c.outage), while: (e) => e.retryable })),
      )
    })

    /** One batch, start to end. Uninterruptible: shutdown waits for it rather than leaving rows claimed. */
    const cycle = Effect.gen(function* () {
      const token = uuidv7()
      const rows = yield* Metrics.timed(Metrics.claimDuration, claim(token))
      stats.lastCycleAt = new Date()
      if (rows.length === 0) return 0
      yield* Metric.update(Metrics.batchSize, rows.length)
      const { outcomes, outage } = yield* Metrics.timed(Metrics.publishDuration, publish(rows))
      const marks = rows.map((row, i) => decide(row, outcomes[i]!, c.retry))
      const updated = yield* Metrics.timed(Metrics.markDuration, markBatch(token, marks))
      let sent = 0
      let dead = 0
      for (const m of marks) {
        if (m.status === "sent") sent++
        else if (m.status === "dead") dead++
      }
      const retried = marks.length - sent - dead
      stats.published += sent
      stats.dead += dead
      stats.retried += retried
      stats.lostLeases += marks.length - updated
      stats.batches++
      yield* Metric.update(Metrics.published, sent)
      if (dead > 0) yield* Metric.update(Metric.withAttributes(Metrics.dead, { side: "outbox" }), dead)
      if (retried > 0)
        yield* Metric.update(Metric.withAttributes(Metrics.retried, { side: "outbox" }), retried)
      if (outage) return yield* outage
      stats.lastError = undefined
      return rows.length
    }).pipe(Effect.withSpan("Relay.batch", { root: true }))

    const worker = Effect.gen(function* () {
      while (true) {
        const claimed = yield* Effect.uninterruptible(cycle).pipe(
          Effect.tapError((e: StoreError | TransportError) =>
            Effect.sync(() => {
              stats.lastError = e.message
            }).pipe(Effect.andThen(Effect.logWarning(`relay: ${e.message}; backing off`))),
          ),
          Effect.retry({ schedule: schedule(c.outage), while: (e) => e.retryable }),
        )
        // A full batch means more is waiting: go again at once.
        if (claimed < c.batchSize) yield* wake.wait(c.pollMs)
        else yield* Effect.yieldNow
      }
    })

    for (let i = 0; i < c.workers; i++) {
      yield* Effect.forkScoped(
        worker.pipe(Effect.catchCause((cause) => Effect.logError("relay worker stopped", cause))),
      )
    }

    // Lag: the age of the oldest due message. The partial index makes this an
    // index-first-entry read, cheap enough to run every few seconds.
    let lagSeconds = 0
    const measureLag = Effect.gen(function* () {
      lagSeconds = yield* tryStore("Relay.lag", () => outboxSql.lagSeconds(db))
      yield* Metric.update(Metrics.outboxLag, lagSeconds)
    }).pipe(Effect.ignore)
    yield* Effect.forkScoped(
      Effect.repeat(measureLag, Schedule.spaced(Math.max(1000, Math.min(c.pollMs * 5, 5000)))),
    )

    if (c.retention) {
      const { olderThanSeconds, everyMs, batchSize } = c.retention
      const purge = Effect.gen(function* () {
        const before = yield* opsSql.cutoff(db, olderThanSeconds)
        let deleted = 0
        while (true) {
          const n = yield* opsSql.purgeSent(db, before, batchSize)
          deleted += n
          if (n < batchSize) break
        }
        if (deleted > 0) yield* Effect.logInfo(`relay retention: deleted ${deleted} sent outbox rows`)
      }).pipe(
        Effect.catch((e: StoreError) => Effect.logWarning(`relay retention: ${e.message}`)),
        Effect.withSpan("Relay.retention", { root: true }),
      )
      yield* Effect.forkScoped(Effect.repeat(purge, Schedule.spaced(everyMs)))
    }

    const health = Effect.gen(function* () {
      const brokerConnected = yield* transport.isConnected
      const now = Date.now()
      // Idle relays still claim (and find nothing) every poll interval, so a
      // healthy relay's last cycle is never older than a few poll intervals.
      const fresh =
        stats.lastCycleAt !== undefined && now - stats.lastCycleAt.getTime() < c.pollMs * 3 + c.leaseMs
      return {
        ready: brokerConnected && fresh,
        brokerConnected,
        lastCycleAt: stats.lastCycleAt,
        lagSeconds,
        lastError: stats.lastError,
      } satisfies RelayHealth
    })
    return { stats: Effect.sync(() => ({ ...stats })), health } satisfies RelayHandle
  })

/** The relay as a layer: its workers live as long as the layer. */
export const layer = (config: RelayConfig = {}): Layer.Layer<never, ConfigError, Database | Transport> =>
  Layer.effectDiscard(make(config))

/** Runs the relay until interrupted (e.g. on SIGTERM via `Effect.runFork(...)` and `fiber.interrupt`). */
export const run = (config: RelayConfig = {}): Effect.Effect<never, ConfigError, Database | Transport> =>
  Effect.scoped(Effect.andThen(make(config), Effect.never))
