/**
 * The relay's WAL source (issue #27): rows as the outbox's log gives them (`OutboxLog`, in commit
 * order), published, settled where still pending, and only then confirmed to the log. No claim:
 * nothing polls for fresh rows, and a commit is published as soon as the log brings it.
 *
 * What the log's relay leaves to its sweep (`Relay.ts` runs a polling loop beside it with
 * `{ sweepAfterMs }` as its share): delayed rows, retried rows, and any row still pending
 * `sweepAfterMs` after it was enqueued (the reader away, a standby, a slot lost or created anew).
 * So a row is never skipped; at worst it is published by both (at least once; the inbox dedupes).
 *
 * Guarantees: a row is marked sent only after the broker confirmed it; the log's position moves
 * only after its rows were published and their verdicts written (or that write failed, when the
 * sweep has them: they are still pending in the table), so a relay that dies publishes them again.
 */
import { Cause, Clock, Effect, Option } from "effect"
import { type StoreError, TransportError } from "../Errors.ts"
import type { OutboxLogBatch, OutboxLogRow, OutboxLogShape } from "../ports/OutboxLog.ts"
import type { OutboxMark } from "../ports/OutboxStore.ts"
import type { TransportShape } from "../ports/Transport.ts"
import { delayFor } from "../Retry.ts"
import type { LoopState } from "./leaseLoop.ts"
import { publishing, type RelayCounters, type RelaySettings, retriedWrite } from "./relayCycle.ts"
import { spanned } from "./trace.ts"
import { publishFailure, verdictFor } from "./verdict.ts"

/**
 * Whether the log's relay publishes the row itself: pending, never tried, due when committed. A
 * delayed row (or one written as retried) is the sweep's, when due.
 */
export const publishesAtOnce = (row: OutboxLogRow): boolean =>
  row.status === "pending" && row.attempts === 0 && row.visibleAt.getTime() <= row.occurredAt.getTime()

/**
 * While fewer rows than this come in per 2 × `batchEvery`, batches start twice `batchEvery` apart
 * (the polling relay's FEW_ROWS: below 800 msg/s at 25 ms).
 */
const FEW_ROWS = 40

type Settle = (marks: ReadonlyArray<OutboxMark>) => Effect.Effect<number, StoreError>

/** One batch of the log: publish what is the relay's, settle it, confirm the position. */
const walBatch = (
  log: OutboxLogShape,
  settle: Settle,
  transport: TransportShape,
  s: RelaySettings,
  counters: RelayCounters,
) => {
  const { publish, tombstones, settled } = publishing(transport, counters)
  const retried = retriedWrite(s)
  const settleRetried = (marks: ReadonlyArray<OutboxMark>) => retried("Relay.settle", settle(marks))
  return (batch: OutboxLogBatch): Effect.Effect<number, StoreError | TransportError> => {
    const rows = batch.rows.filter(publishesAtOnce)
    if (rows.length === 0) return Effect.as(log.confirm(batch.position), 0)
    counters.claims++
    return Effect.flatMap(publish(rows), ({ outcomes, outage }) => {
      const marks = rows.map(
        (row, i): OutboxMark => ({
          id: row.id,
          verdict: verdictFor(row.attempts, publishFailure(outcomes[i]!), s.retry),
        }),
      )
      return tombstones(rows, marks).pipe(
        Effect.andThen(Effect.exit(settleRetried(marks))),
        // Confirmed whether or not the verdicts were written: rows left pending are the sweep's.
        Effect.tap(() => log.confirm(batch.position)),
        Effect.flatMap(
          (written): Effect.Effect<number, StoreError | TransportError> =>
            written._tag === "Success"
              ? settled(rows, marks, written.value, outage)
              : Effect.failCause(written.cause),
        ),
      )
    }).pipe(spanned("Relay.walBatch", { root: true }))
  }
}

/**
 * Reads the log until interrupted; never fails. A failed batch (the broker away, the database
 * away past the settle's retries) is recorded in `state` and backed off on with `s.outage`, as
 * the polling loop does; a defect too, logged once per run of failures.
 */
export const runWalLoop = (
  log: OutboxLogShape,
  settle: Settle,
  transport: TransportShape,
  s: RelaySettings,
  counters: RelayCounters,
  state: LoopState,
  batchEveryMs: number,
): Effect.Effect<never> => {
  const batch = walBatch(log, settle, transport, s, counters)
  // Batches start batchEveryMs apart at most (twice that while they are small, as the polling
  // relay's looks): under load a batch is what came in meanwhile, so batches grow with the rate
  // instead of their number (a publish, a confirm, a settle and a status update each); the first
  // commit after a quiet spell goes at once.
  let lastStart = Number.NEGATIVE_INFINITY
  // Whether the last batch's rows, per 2 × batchEveryMs since the batch before it, were under FEW_ROWS.
  let slow = true
  const spaced = Effect.flatMap(Clock.currentTimeMillis, (now) => {
    const wait = lastStart + (slow ? 2 * batchEveryMs : batchEveryMs) - now
    return wait > 0 ? Effect.sleep(wait) : Effect.void
  })
  const taken = Effect.andThen(Effect.andThen(spaced, log.take(s.batchSize)), (batch) =>
    Effect.as(
      Effect.map(Clock.currentTimeMillis, (now) => {
        const since = now - lastStart
        slow = !(since > 0) || (batch.rows.length * 2 * batchEveryMs) / since < FEW_ROWS
        lastStart = now
      }),
      batch,
    ),
  )
  // While the broker is away the log is left alone: what it holds waits there, confirmed later.
  const cycle = Effect.flatMap(transport.isConnected, (connected) =>
    connected
      ? Effect.flatMap(taken, (rows) => Effect.uninterruptible(batch(rows)))
      : Effect.fail(
          new TransportError({
            reason: "connection",
            operation: "Relay.publish",
            cause: "broker not connected",
          }),
        ),
  )
  let defectLogged = false
  const failed = (cause: Cause.Cause<StoreError | TransportError>) =>
    Effect.gen(function* () {
      const error = Cause.findErrorOption(cause)
      const message = Option.isSome(error) ? error.value.message : `defect: ${String(Cause.squash(cause))}`
      state.lastCycleAt = yield* Clock.currentTimeMillis
      state.lastError = message
      state.consecutiveFailures++
      if (Option.isSome(error)) yield* Effect.logWarning(`relay (wal): ${message}; backing off`)
      else if (!defectLogged) {
        defectLogged = true
        yield* Effect.logError(
          `relay (wal): a batch died (${message}); a bug, not an outage; backing off`,
          cause,
        )
      }
      yield* Effect.sleep(delayFor(s.outage, state.consecutiveFailures))
    })
  const succeeded = Effect.map(Clock.currentTimeMillis, (now) => {
    state.lastCycleAt = now
    state.lastSuccessAt = now
    state.lastError = undefined
    state.consecutiveFailures = 0
    defectLogged = false
  })
  return Effect.forever(
    Effect.matchCauseEffect(cycle, {
      onSuccess: () => succeeded,
      onFailure: (cause) => (Cause.hasInterruptsOnly(cause) ? Effect.interrupt : failed(cause)),
    }),
  )
}
