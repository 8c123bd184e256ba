/**
 * One relay batch: claim → publish → mark. The loop around it is
 * `leaseLoop.ts`; the verdict for each message is `verdict.ts`.
 *
 * Guarantees: a row is marked sent only after the broker confirmed it; a
 * claimed row is never lost (a dead relay's lease runs out and the row comes
 * due again) and never marked twice (marks match the claim's token).
 */
import { Clock, Effect, Fiber, Metric } from "effect"
import { type StoreError, TransportError } from "../Errors.ts"
import * as Metrics from "../Metrics.ts"
import type {
  OutboxClaim,
  OutboxMark,
  OutboxMessage,
  OutboxShard,
  OutboxStoreShape,
} from "../ports/OutboxStore.ts"
import type { OutgoingMessage, PublishOutcome, TransportShape } from "../ports/Transport.ts"
import { type RetryPolicy, retryAfterFailure, schedule } from "../Retry.ts"
import { bounded } from "./bounded.ts"
import { holdingLease } from "./heartbeat.ts"
import { PARTITION_EVERY_MS, PARTITIONS_AHEAD_MS, PARTITIONS_CHECK_MS } from "./partitioning.ts"
import { DEAD_UPSTREAM_HEADER } from "./position.ts"
import { spanned } from "./trace.ts"
import { uuidv7 } from "./uuid.ts"
import { publishFailure, verdictFor } from "./verdict.ts"

export interface RelaySettings {
  readonly batchSize: number
  readonly leaseMs: number
  /** Longest a single claim or mark statement may take before it counts as a lost connection. */
  readonly statementTimeoutMs: number
  readonly retry: RetryPolicy
  readonly outage: RetryPolicy
  /** The relay's share of the outbox; undefined: every row. */
  readonly shard?: OutboxShard | undefined
}

export interface RelayCounters {
  published: number
  retried: number
  dead: number
  /** Marks that found their row already re-claimed by another relay (lease ran out). */
  lostLeases: number
  batches: number
  /** Every claim made, rows or none: `claims - batches` found nothing. */
  claims: number
}

export const makeRelayCounters = (): RelayCounters => ({
  published: 0,
  retried: 0,
  dead: 0,
  lostLeases: 0,
  batches: 0,
  claims: 0,
})

/**
 * Whether another relay process's looks cover this one's (issue #25: with 16 relay processes at
 * 100 msg/s, each looked every 50 ms and two thirds of the claims found nothing). At a low rate one
 * relay takes all that comes in; so a relay whose claim was small while one ranked before it
 * published lately (`OutboxClaim.lastPublished`) leaves the looking to that one. The rank is a
 * fixed order, so two relays never leave it to each other: the first in it goes on looking.
 */
export interface LookCover {
  covered: boolean
  /**
   * The other way round: one ranked after this relay published lately while this one's claim
   * found little. This one then takes up the follow-up looks, so the looking passes to the first
   * in rank within a look or two. Without it, it passed only when that one's poll (every second)
   * happened to find a row the other had not taken yet: seconds at 40 msg/s.
   */
  leading: boolean
}

/** A relay that published within this long is still looking: at a low rate it looks every 50 ms. */
const COVERED_WITHIN_MS = 100
/** Batches under this say the rate is low enough for one relay's looks (Relay.ts's FEW_ROWS, the same 40). */
const COVERED_BELOW_ROWS = 40

/** Records whether the claim just made is covered by another relay's looks. */
const sawClaim = (cover: LookCover, claimed: number, last: OutboxClaim["lastPublished"]): void => {
  const lately = claimed < COVERED_BELOW_ROWS && last != null && last.agoMs < COVERED_WITHIN_MS
  cover.covered = lately && last.by === "before"
  cover.leading = lately && last.by === "after"
}

/**
 * Which broker stop a relay process has answered (`resendAfterStop`): one per process, shared by
 * its workers.
 */
export interface StopResend {
  answered: number | undefined
}

/**
 * After the broker closed the connection because it was stopping, the messages it confirmed within
 * this long before are published again. A stopping RabbitMQ confirms a message routed to a queue
 * that stopped meanwhile as if the queue took it (rabbitmq-server#1877): in the suite's soak one
 * batch marked sent 10 s before the close (a 12 s `stop_app`) never reached one of its three
 * consumers, whose retry copies that broker also confirmed meanwhile.
 */
export const STOP_RESEND_MS = 60_000

const toOutgoing = (m: OutboxMessage): OutgoingMessage => ({
  id: m.id,
  type: m.type,
  version: m.version,
  routingKey: m.routingKey ?? m.type,
  body: m.payload,
  headers: m.headers,
  occurredAt: m.occurredAt,
  partitionKey: m.partitionKey,
  position: m.position ?? null,
  tenantId: m.tenantId,
})

/**
 * The stand-in a dead keyed message leaves: its route and place, no body, and
 * why it died. An id of its own, so the dead message redriven later is still
 * handled (late) by consumers the tombstone let go on.
 */
const tombstoneOf = (row: OutboxMessage, error: string): OutgoingMessage => ({
  ...toOutgoing(row),
  id: uuidv7(),
  body: "null",
  headers: { ...row.headers, [DEAD_UPSTREAM_HEADER]: error.slice(0, 500) },
})

const deadOutbox = Metric.withAttributes(Metrics.dead, { side: "outbox" })
const retriedOutbox = Metric.withAttributes(Metrics.retried, { side: "outbox" })

/**
 * What a relay does with rows it has, however it got them (a claim, or the WAL: `walRelay.ts`):
 * publish them, publish tombstones for dead keyed ones, and count what the marks say.
 */
export const publishing = (transport: TransportShape, counters: RelayCounters) => {
  const publish = (rows: ReadonlyArray<OutboxMessage>) =>
    transport.publish(rows.map(toOutgoing)).pipe(
      Effect.map((outcomes) => ({ outcomes, outage: undefined as TransportError | undefined })),
      // Nothing could be attempted: every row is an outage outcome, which spends no attempt.
      Effect.catch((error) =>
        Effect.succeed({
          outcomes: rows.map((): PublishOutcome => ({ _tag: "Interrupted", error: error.message })),
          outage: error,
        }),
      ),
      spanned("Relay.publish"),
    )

  // A keyed message given up on leaves a number its key's consumers wait for: publish a body-less
  // tombstone in its place before recording it dead. One that is not confirmed either is logged;
  // the key then waits for the dead row's redrive (docs/ordering.md).
  const tombstones = (rows: ReadonlyArray<OutboxMessage>, marks: ReadonlyArray<OutboxMark>) => {
    const dead = rows.flatMap((row, i) => {
      const verdict = marks[i]!.verdict
      return verdict._tag === "Dead" && row.position != null && row.partitionKey !== null
        ? [tombstoneOf(row, verdict.error)]
        : []
    })
    if (dead.length === 0) return Effect.void
    return transport.publish(dead).pipe(
      Effect.map(
        (outcomes) => outcomes.filter((o) => o._tag !== "Confirmed" && o._tag !== "Returned").length,
      ),
      Effect.catch(() => Effect.succeed(dead.length)),
      Effect.flatMap((lost) =>
        lost === 0
          ? Effect.void
          : Effect.logWarning(
              `relay: ${lost} tombstone(s) of dead keyed messages not confirmed; their keys wait for a redrive`,
            ),
      ),
    )
  }

  // What the marks say, counted; then the outage that cut the publish short, if any.
  const settled = (
    rows: ReadonlyArray<OutboxMessage>,
    marks: ReadonlyArray<OutboxMark>,
    updated: number,
    outage: TransportError | undefined,
  ): Effect.Effect<number, TransportError> => {
    let sent = 0
    let dead = 0
    for (const m of marks) {
      if (m.verdict._tag === "Done") sent++
      else if (m.verdict._tag === "Dead") dead++
    }
    const retried = marks.length - sent - dead
    counters.published += sent
    counters.dead += dead
    counters.retried += retried
    counters.lostLeases += marks.length - updated
    counters.batches++
    let metrics = Metric.update(Metrics.published, sent)
    if (dead > 0) metrics = Effect.andThen(metrics, Metric.update(deadOutbox, dead))
    if (retried > 0) metrics = Effect.andThen(metrics, Metric.update(retriedOutbox, retried))
    return outage ? Effect.andThen(metrics, Effect.fail(outage)) : Effect.as(metrics, rows.length)
  }

  return { publish, tombstones, settled }
}

/**
 * A write of verdicts for published rows (the polling relay's mark, the WAL relay's settle): retried
 * for a while, since the rows are confirmed and only the record is missing. If the database stays
 * away past half the lease the rows come due again and are published twice: at least once, not lost.
 */
export const retriedWrite = (s: RelaySettings) => {
  // Built once: a schedule is a value, and the write runs every cycle.
  const outage = schedule(s.outage)
  const options = { schedule: outage, while: (e: StoreError) => e.retryable }
  // The retries alone bounded, by what is left of half the lease: a write that succeeds at once (all
  // but a few) then costs one bound, not two, and no schedule.
  return <A>(operation: string, write: Effect.Effect<A, StoreError>): Effect.Effect<A, StoreError> =>
    Effect.flatMap(Clock.currentTimeMillis, (start) =>
      retryAfterFailure(bounded(operation, s.statementTimeoutMs)(write), options, (retrying) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) =>
          bounded(operation, Math.max(1, s.leaseMs / 2 - (now - start)))(retrying),
        ),
      ),
    ).pipe(spanned(operation))
}

/**
 * One worker's cycle, and what shutdown waits for. `cycle` succeeds with how many rows it claimed;
 * it fails when the broker is away (after marking) or the database is.
 */
export interface RelayCycle {
  readonly cycle: Effect.Effect<number, StoreError | TransportError>
  /** Waits for the batch still being published and marked, if any (shutdown: never left claimed). */
  readonly drain: Effect.Effect<void>
}

/**
 * The batch as an Effect, pipelined: a cycle that claimed rows leaves their publish
 * and mark running and ends once the batch before it has settled, so the next look comes on its
 * cadence instead of after the broker's confirm and the mark (issue #21: at 1 + 1 flat out in
 * bench/cost.ts, 1.17× the messages at 0.87× the CPU per message). At most two batches per worker are in flight: the one
 * just claimed and the one the cycle waits for, whose failure is the cycle's. Rows of two batches
 * never overlap (each holds its claim's lease), and consumers order keyed messages by position.
 */
export const relayCycle = (
  store: OutboxStoreShape,
  transport: TransportShape,
  s: RelaySettings,
  counters: RelayCounters,
  cover: LookCover = { covered: false, leading: false },
  stop: StopResend = { answered: undefined },
): RelayCycle => {
  const { publish, tombstones, settled } = publishing(transport, counters)
  // Asked for anew each cycle: a store may decide (or mint a token) when called, not when run.
  const claim = Effect.suspend(() => store.claim(s.batchSize, s.leaseMs, s.shard)).pipe(
    bounded("Relay.claim", s.statementTimeoutMs),
    spanned("Relay.claim"),
  )

  const retried = retriedWrite(s)
  const mark = (token: string, marks: ReadonlyArray<OutboxMark>) =>
    retried("Relay.mark", store.mark(token, marks))

  // Publish, then mark: the rows of a claim that found some.
  const work = (token: string, rows: ReadonlyArray<OutboxMessage>) =>
    Metrics.timed(
      Metrics.publishDuration,
      holdingLease(store.extend(token, s.leaseMs), s.leaseMs, publish(rows)),
    ).pipe(
      Effect.flatMap(({ outcomes, outage }) => {
        const marks = rows.map(
          (row, i): OutboxMark => ({
            id: row.id,
            verdict: verdictFor(row.attempts, publishFailure(outcomes[i]!), s.retry),
          }),
        )
        return tombstones(rows, marks).pipe(
          Effect.andThen(Metrics.timed(Metrics.markDuration, mark(token, marks))),
          Effect.flatMap((updated) => settled(rows, marks, updated, outage)),
        )
      }),
    )

  // The first connected cycle after a broker stop sets what the broker confirmed shortly before it
  // back to pending (one worker of the process does; the others go on).
  const { resendSent } = store
  const { brokerStoppedAt } = transport
  // Read synchronously each cycle: while no broker stopped, the cycle pays nothing more.
  const resendAfterStop = (at: number): Effect.Effect<void, StoreError> => {
    stop.answered = at
    return retried(
      "Relay.resendAfterStop",
      // Up to the close, not to now: what another relay process already sent again after it is
      // not sent a third time.
      Effect.suspend(() => {
        const sinceStop = Date.now() - at
        return resendSent!(sinceStop + STOP_RESEND_MS, sinceStop)
      }),
    ).pipe(
      Effect.flatMap((n) =>
        n === 0
          ? Effect.void
          : Effect.logWarning(
              `relay: the broker stopped; publishing again the ${n} message(s) it confirmed in the ${STOP_RESEND_MS / 1000} s before (a stopping queue's confirm is not sure; consumers skip the duplicates)`,
            ),
      ),
      // Not done: the next cycle tries again.
      Effect.tapError(() =>
        Effect.sync(() => {
          if (stop.answered === at) stop.answered = undefined
        }),
      ),
    )
  }
  const stoppedUnanswered = (): number | undefined => {
    if (resendSent === undefined || brokerStoppedAt === undefined) return undefined
    const at = brokerStoppedAt()
    return at === undefined || at === stop.answered ? undefined : at
  }

  // The batch published and marked behind this worker's next look.
  let inFlight: Fiber.Fiber<number, StoreError | TransportError> | undefined
  // Its outcome is the cycle's: a failure there (the broker away) backs the loop off.
  const settlePrevious = (previous: typeof inFlight): Effect.Effect<void, StoreError | TransportError> =>
    previous === undefined ? Effect.void : Effect.asVoid(Fiber.join(previous))
  const started = (token: string, rows: ReadonlyArray<OutboxMessage>) => {
    const previous = inFlight
    // Detached and uninterruptible: the rows are settled whatever happens to the loop, and
    // `drain` (the loop's shutdown) waits for them.
    return Effect.flatMap(Effect.forkDetach(work(token, rows), { uninterruptible: true }), (fiber) => {
      inFlight = fiber
      fiber.addObserver(() => {
        if (inFlight === fiber) inFlight = undefined
      })
      return Effect.as(settlePrevious(previous), rows.length)
    })
  }

  // Combinators, not Effect.gen: once per cycle, and JavaScriptCore kept recompiling generator
  // bodies on this path for as long as the relay ran (core/inboxConsumer.ts says more).
  const cycle = Effect.flatMap(transport.isConnected, (connected) => {
    // While the broker is away, leave the rows alone: claiming and marking
    // them would cost two writes per row per cycle and change nothing.
    if (!connected) {
      return Effect.andThen(
        settlePrevious(inFlight),
        Effect.fail(
          new TransportError({
            reason: "connection",
            operation: "Relay.publish",
            cause: "broker not connected",
          }),
        ),
      )
    }
    const claimed = Effect.flatMap(
      Metrics.timed(Metrics.claimDuration, claim),
      ({ token, rows, lastPublished }) => {
        counters.claims++
        sawClaim(cover, rows.length, lastPublished)
        return Effect.annotateCurrentSpan("txbox.claimed", rows.length).pipe(
          Effect.andThen(
            rows.length === 0
              ? Effect.as(settlePrevious(inFlight), 0)
              : Effect.andThen(Metric.update(Metrics.batchSize, rows.length), started(token, rows)),
          ),
        )
      },
    )
    const stoppedAt = stoppedUnanswered()
    return stoppedAt === undefined ? claimed : Effect.andThen(resendAfterStop(stoppedAt), claimed)
  }).pipe(spanned("Relay.batch", { root: true }))

  const drain = Effect.suspend(() =>
    inFlight === undefined ? Effect.void : Effect.asVoid(Fiber.await(inFlight)),
  )
  return { cycle, drain }
}

/**
 * Whether this process runs housekeeping task `task` now (`OutboxStore.holdTask`): one relay
 * process at a time does, whichever holds the task's lease; with a store that has no leases, all.
 * A store that cannot answer says no: the task waits for the next round.
 */
const holding = (store: OutboxStoreShape, task: string, holder: string, ttlMs: number) =>
  store.holdTask === undefined
    ? Effect.succeed(true)
    : store.holdTask(task, holder, ttlMs).pipe(Effect.orElseSucceed(() => false))

/** What the lag probe knows: the age of the oldest due message, and whether this process measures it. */
export interface Lag {
  seconds: number
  measured: boolean
}

/**
 * Keeps `lag.seconds` (the age of the oldest due message) fresh: an index-first-entry read, every
 * few seconds, by the one relay process that holds the `outbox.lag` task. A process that does not
 * (or no longer does) reports 0 and leaves the gauge at 0, so a dashboard's max over processes is
 * the holder's figure, never a stale one.
 */
export const lagProbe = (store: OutboxStoreShape, lag: Lag, holder: string, everyMs: number) =>
  Effect.flatMap(holding(store, "outbox.lag", holder, everyMs * 3), (mine) => {
    if (!mine) {
      if (!lag.measured) return Effect.void
      lag.measured = false
      lag.seconds = 0
      return Metric.update(Metrics.outboxLag, 0)
    }
    return Effect.flatMap(store.lagSeconds, (seconds) => {
      lag.seconds = seconds
      lag.measured = true
      return Metric.update(Metrics.outboxLag, seconds)
    })
  }).pipe(Effect.ignore)

/**
 * One retention pass: sent rows older than `olderThanSeconds`, in batches that never make a relay
 * wait; by the one relay process that holds the `outbox.retention` task (its lease outlives a few
 * passes, so a holder that died hands it on within `3 × everyMs`).
 */
export const retentionPass = (
  store: OutboxStoreShape,
  olderThanSeconds: number,
  batchSize: number,
  holder: string,
  everyMs: number,
) =>
  Effect.flatMap(holding(store, "outbox.retention", holder, everyMs * 3), (mine) =>
    mine
      ? store.purgeSent(olderThanSeconds, batchSize).pipe(
          Effect.tap((deleted) =>
            deleted > 0
              ? Effect.logInfo(`relay retention: deleted ${deleted} sent outbox rows`)
              : Effect.void,
          ),
          Effect.catch((e: StoreError) => Effect.logWarning(`relay retention: ${e.message}`)),
        )
      : Effect.void,
  ).pipe(Effect.withSpan("Relay.retention", { root: true }))

/**
 * One pass over the partitioned outbox's partitions (migration 0015), by the one relay process
 * that holds the `outbox.partitions` task: those of the next days created, and with retention on,
 * those past it that hold nothing pending or dead dropped whole (cheaper than deleting their rows).
 */
export const partitionsPass = (
  store: OutboxStoreShape,
  holder: string,
  dropOlderThanMs: number | undefined,
) =>
  store.keepPartitions === undefined
    ? Effect.void
    : Effect.flatMap(holding(store, "outbox.partitions", holder, PARTITIONS_CHECK_MS * 3), (mine) =>
        mine && store.keepPartitions !== undefined
          ? store
              .keepPartitions({
                aheadMs: PARTITIONS_AHEAD_MS,
                everyMs: PARTITION_EVERY_MS,
                ...(dropOlderThanMs === undefined ? {} : { dropOlderThanMs }),
              })
              .pipe(
                Effect.tap(({ created, dropped }) =>
                  created.length + dropped.length > 0
                    ? Effect.logInfo(
                        `relay partitions: created ${created.join(", ") || "none"}; dropped ${dropped.join(", ") || "none"}`,
                      )
                    : Effect.void,
                ),
                Effect.catch((e: StoreError) => Effect.logWarning(`relay partitions: ${e.message}`)),
              )
          : Effect.void,
      ).pipe(Effect.withSpan("Relay.partitions", { root: true }))
