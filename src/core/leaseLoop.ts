/**
 * The one claim → work → settle loop, shared by the relay's workers and the
 * inbox's processor. A cycle claims a batch under a lease, works on it and
 * records the verdicts; the loop decides when to run the next one:
 *
 * - a full batch means more is waiting: go again at once (after yielding),
 *   and wake one idle worker of the process to help (a NOTIFY wakes one);
 * - with `relookMs`: after a cycle that claimed rows, look again every
 *   `relookMs` for `hotMs` (producers skip their wake-up while a loop is this
 *   warm: migration 0007), then after twice that, four times … while less
 *   than `warmMs` has passed since it (a producer may commit a while after
 *   its insert decided not to wake anyone: the looks thin out, and an idle
 *   loop stops looking after a handful). At a steady load a loop thus claims
 *   every `relookMs` from one look's start to the next (every other one while
 *   the rows come in slowly: `fewRows`),
 *   whatever the rate: the batches grow with the load instead of the claims;
 * - otherwise wait for a wake-up (NOTIFY) or the poll interval, and never
 *   claim again within `relookMs` of the last cycle: a burst of wake-ups is
 *   one claim, not one each;
 * - with `nextDueMs`, a wait longer than `LONG_WAIT_MS` ends when the next
 *   pending row comes due: a row due by time (a delay, a retry's backoff, a
 *   dead claimer's lease) wakes nobody, and the poll interval has no bound;
 * - a failed cycle backs off on the outage schedule and tries again, forever:
 *   a retryable failure (connection lost) as a warning, any other (a missing
 *   table, a read-only database after failover) loudly as an error, since it
 *   needs a person — but the loop is still there when it is fixed. A defect
 *   (a bug: a throw, `Effect.die`) too: logged with its cause once per run of
 *   failures, since it likely repeats every step;
 * - a cycle is uninterruptible: shutdown waits for the batch in flight to be
 *   settled instead of leaving its rows claimed until their lease runs out.
 *
 * All waiting is on Effect's `Clock`, so `TestClock` drives it in unit tests.
 */
import { Cause, Clock, Effect, Option } from "effect"
import { type RetryPolicy, retryAfterFailure, schedule } from "../Retry.ts"
import type { Signal } from "./signal.ts"

/** What a loop reports about itself, for health checks. */
export interface LoopState {
  /** Clock time (ms) the last cycle completed, failed or not. */
  lastCycleAt: number | undefined
  /** Clock time (ms) of the last cycle that succeeded. */
  lastSuccessAt: number | undefined
  /** The last failure's message, cleared by a success. */
  lastError: string | undefined
  /** Failures since the last success. */
  consecutiveFailures: number
  /**
   * The worker that makes the follow-up looks after a cycle that claimed rows: one per process,
   * however many workers share this state (the others wait for a wake-up or the poll).
   */
  relooker: object | undefined
}

export const makeLoopState = (): LoopState => ({
  lastCycleAt: undefined,
  lastSuccessAt: undefined,
  lastError: undefined,
  consecutiveFailures: 0,
  relooker: undefined,
})

export interface LeaseLoop<E extends { readonly message: string; readonly retryable: boolean }> {
  /** Names the loop in logs ("relay", "inbox billing processor"). */
  readonly name: string
  /** One claim → work → settle; succeeds with how many rows it claimed. */
  readonly cycle: Effect.Effect<number, E>
  /** A cycle that claims this many is full: the next runs at once. */
  readonly batchSize: number
  /** Longest wait between cycles when no wake-up arrives. */
  readonly pollMs: number
  /**
   * A loop with no follow-up looks (`relookMs` 0): the longest wait after a cycle that claimed
   * nothing, while its wake-ups are heard (`hearing`) and `nextDueMs` says no row is due now.
   * Every row that arrives then notifies, so the poll only finds rows due by time, which the probe
   * already waits for. A row due now that the last cycle did not claim (held by another claim, or
   * waiting for its key's predecessor) keeps the `pollMs` cadence. @default pollMs
   */
  readonly hearingPollMs?: number
  /** After a cycle that claimed rows, look again this often… */
  readonly relookMs?: number
  /** …for this long after it… @default relookMs */
  readonly hotMs?: number
  /**
   * While rows come in slower than this many per 2 × `relookMs` (a look's
   * rows over the time since the look before it), the follow-up looks come
   * every 2 × `relookMs`: at a low rate each look costs about what a full one
   * does, so it waits for more. @default 0 (off)
   */
  readonly fewRows?: number
  /** …then at doubling intervals until this long has passed since the last cycle that claimed any. */
  readonly warmMs?: number
  /**
   * Ms until the earliest pending row comes due (≤ 0: one is due now), or undefined when none is
   * pending. Asked only before a wait longer than `LONG_WAIT_MS`; a failed probe just waits.
   */
  readonly nextDueMs?: Effect.Effect<number | undefined, unknown>
  /**
   * Asked after a cycle that did not fill its batch: whether another process's looks cover this
   * worker's (the relay: one ranked before it publishes at a low rate; core/relayCycle.ts). This
   * worker then leaves the follow-up looks to it, and its polls thin out while that lasts, to one
   * in 2, 4, then 8 poll intervals; a wake-up still ends a wait at once.
   */
  readonly covered?: () => boolean
  /**
   * Asked after a cycle that claimed nothing: whether this worker should take up the follow-up
   * looks anyway (the relay: one ranked after it publishes at a low rate), so that the looking
   * passes to it and the other is covered.
   */
  readonly leads?: () => boolean
  /**
   * Whether this loop's wake-ups are heard (its LISTEN works). While they are, a covered loop's
   * polls thin out further, to one in 32: should the loop covering it stop, the producers' NOTIFY
   * wakes it at once (no relay published within 100 ms), and the polls are only a safety net.
   * Deaf, the polls are what finds that out: one in 8 at most. @default () => false
   */
  readonly hearing?: () => boolean
  /** Backoff between failed cycles. */
  readonly outage: RetryPolicy
  readonly wake: Signal
  readonly state: LoopState
}

/** Waits longer than this ask `nextDueMs` first: a row due by time waits about this long at most. */
export const LONG_WAIT_MS = 1000
/**
 * Polls skipped per wait at most while another process's looks cover this one's: one poll in 8, or
 * one in 32 while wake-ups are heard (`hearing`). With 16 relay processes at 100 msg/s, fifteen
 * covered ones polling every 8 s were 8 % of all claims, every one of them empty (issue #25).
 */
const MAX_SKIPPED_POLLS = 7
const MAX_SKIPPED_POLLS_HEARING = 31
/** Each look's weight in the rate, per look after it: the last four or so looks count. */
const RATE_DECAY = 0.75
/** A look longer than this after the one before it starts the rate afresh. */
const RATE_WINDOW_MS = 500
/** The shortest wait for a row the probe says is due: one that is due but locked is not spun on. */
const MIN_DUE_WAIT_MS = 50

/**
 * The wait after a partial cycle of a loop without second looks: after an empty one, while its
 * wake-ups are heard, `hearingPollMs`, cut short when the next pending row comes due (a row due
 * now that the cycle did not claim keeps `pollMs`: no spin); else `untilDue`'s of `pollMs`.
 */
const waitAfter = <E extends { readonly message: string; readonly retryable: boolean }>(
  loop: LeaseLoop<E>,
  claimed: number,
  dueFloorMs: number,
  untilDue: (waitMs: number) => Effect.Effect<number>,
): Effect.Effect<number> => {
  const long = loop.hearingPollMs
  const probe = loop.nextDueMs
  const heard = claimed === 0 && loop.hearing?.() === true
  if (!heard || long === undefined || long <= loop.pollMs || probe === undefined) return untilDue(loop.pollMs)
  return probe.pipe(
    Effect.map((dueMs) =>
      dueMs === undefined
        ? long
        : dueMs <= 0
          ? loop.pollMs
          : Math.min(long, Math.max(Math.ceil(dueMs), dueFloorMs)),
    ),
    // Only latency is at stake: the next cycle reports what is wrong.
    Effect.catchCause(() => Effect.succeed(loop.pollMs)),
  )
}

/** A defect's message for the loop state: the thrown error's message, not its stack. */
const defectMessage = (cause: Cause.Cause<unknown>): string => {
  const defect = Cause.squash(cause)
  return `defect: ${defect instanceof Error ? `${defect.name}: ${defect.message}` : String(defect)}`
}

/**
 * One cycle, recorded in the loop's state: a success as such, every other end (a failure, a
 * defect) logged and turned into one failure to back off on.
 */
const recordedCycle = <E extends { readonly message: string; readonly retryable: boolean }>(
  loop: LeaseLoop<E>,
): Effect.Effect<number, "failed"> => {
  const { state } = loop
  const recordFailure = (message: string) =>
    Effect.map(Clock.currentTimeMillis, (now) => {
      state.lastCycleAt = now
      state.lastError = message
      state.consecutiveFailures++
    })
  const failed = (error: E) =>
    Effect.gen(function* () {
      yield* recordFailure(error.message)
      if (error.retryable) yield* Effect.logWarning(`${loop.name}: ${error.message}; backing off`)
      else {
        yield* Effect.logError(
          `${loop.name}: ${error.message}; this will not pass by itself (fix the cause); backing off and retrying`,
        )
      }
    })
  // Whether this run of failures has logged a defect: a bug repeats every backoff step, and one
  // stack trace per run says it all.
  let defectLogged = false
  const died = (cause: Cause.Cause<E>) =>
    Effect.gen(function* () {
      const message = defectMessage(cause)
      yield* recordFailure(message)
      if (defectLogged) return
      defectLogged = true
      yield* Effect.logError(
        `${loop.name}: a cycle died (${message}); a bug, not an outage; backing off and retrying (logged once until a cycle succeeds)`,
        cause,
      )
    })
  // Once per cycle: a callback, not a generator (core/inboxConsumer.ts says why).
  const succeeded = Effect.map(Clock.currentTimeMillis, (now) => {
    state.lastCycleAt = now
    state.lastSuccessAt = now
    state.lastError = undefined
    state.consecutiveFailures = 0
    defectLogged = false
  })
  // Every way a cycle can end short of success is recorded and becomes one failure to back off on:
  // a defect must not end the loop for good. (A cycle is uninterruptible, so an interruption in its
  // cause is its own doing; a shutdown's is held back and ends the loop in the wait that follows.)
  return Effect.matchCauseEffect(Effect.uninterruptible(loop.cycle), {
    onSuccess: (claimed) => Effect.as(succeeded, claimed),
    onFailure: (cause) => {
      const error = Cause.findErrorOption(cause)
      return Effect.andThen(
        Option.isSome(error) ? failed(error.value) : died(cause),
        Effect.fail("failed" as const),
      )
    },
  })
}

/** Runs the loop until interrupted; never fails and never ends by itself. */
export const runLeaseLoop = <E extends { readonly message: string; readonly retryable: boolean }>(
  loop: LeaseLoop<E>,
): Effect.Effect<never> => {
  const { state } = loop
  const attempt = recordedCycle(loop)
  // When the cycle that just ended began: the follow-up looks keep their cadence from one look's
  // start to the next, whatever the cycle took (a publish waits for its confirms).
  let cycleStart = Number.NEGATIVE_INFINITY
  // …and the one before it: a look's rows came in between, which gives the rate (none before the
  // first look: its rows could have waited any time).
  let previousStart = Number.NEGATIVE_INFINITY
  // Unbounded: infrastructure comes back, and the loop must still be there. Built once: a
  // schedule is a value, and a cycle that succeeds never steps it.
  const outage = schedule(loop.outage)
  const step = Effect.flatMap(Clock.currentTimeMillis, (now) => {
    previousStart = cycleStart
    cycleStart = now
    return retryAfterFailure(attempt, { schedule: outage })
  }).pipe(Effect.orDie)
  const relookMs = loop.relookMs === undefined ? 0 : Math.min(loop.relookMs, loop.pollMs)
  const hotMs = Math.max(relookMs, loop.hotMs ?? relookMs)
  const warmMs = Math.max(hotMs, loop.warmMs ?? hotMs)
  // Clock times until which an empty cycle looks again instead of waiting to poll: every relookMs
  // until hotUntil, then at doubling intervals until warmUntil.
  let hotUntil = 0
  let warmUntil = 0
  let nextRelookMs = relookMs
  const fewRows = loop.fewRows ?? 0
  // The wait after the last look that claimed rows: relookMs, or twice that while the rate is low.
  let hotWait = relookMs
  // The rate as rows over time, each look's share decaying by RATE_DECAY per look.
  let recentRows = 0
  let recentMs = 0
  // Whether rows came in at fewRows per 2 × relookMs or more.
  const fast = (rows: number, ms: number) => ms > 0 && (rows * 2 * relookMs) / ms >= fewRows
  // This worker, as `state.relooker` names it.
  const self = {}
  // When the last cycle ended: a wake-up within relookMs of it waits for the rest.
  let lastEnd = 0
  // Poll intervals skipped per wait while another process's looks cover this one's: 0, 1, 3, 7.
  let skippedPolls = 0
  // Polls fall on this time plus whole poll intervals (the last cycle that claimed rows): the
  // second looks come between polls and never shift them.
  let anchor: number | undefined
  const awoken = (timeoutMs: number): Effect.Effect<void> =>
    Effect.flatMap(loop.wake.wait(timeoutMs), () =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => {
        const early = lastEnd + relookMs - now
        return early > 0 ? Effect.sleep(early) : Effect.void
      }),
    )
  const dueFloorMs = Math.max(relookMs, MIN_DUE_WAIT_MS)
  // A long wait, cut short to when the next pending row comes due: nothing else wakes the loop then.
  // Waits up to LONG_WAIT_MS (all of them at the default 1 s poll) cost no probe.
  const untilDue = (waitMs: number): Effect.Effect<number> => {
    const probe = loop.nextDueMs
    if (probe === undefined || waitMs <= LONG_WAIT_MS) return Effect.succeed(waitMs)
    return probe.pipe(
      Effect.map((dueMs) =>
        dueMs === undefined ? waitMs : Math.min(waitMs, Math.max(Math.ceil(dueMs), dueFloorMs)),
      ),
      // Only latency is at stake: the next cycle reports what is wrong.
      Effect.catchCause(() => Effect.succeed(waitMs)),
    )
  }
  // This worker looks again every `wait` for hotMs from `now`, then at doubling intervals until warmMs.
  const heatUp = (now: number, wait: number) => {
    hotUntil = now + hotMs
    warmUntil = now + warmMs
    nextRelookMs = relookMs * 2
    hotWait = wait
    state.relooker = self
  }
  const pause = (claimed: number): Effect.Effect<void> => {
    if (claimed >= loop.batchSize) {
      // More is waiting than one worker takes at a time: the next idle worker helps.
      loop.wake.nudge()
      return Effect.yieldNow
    }
    if (relookMs === 0) return Effect.flatMap(waitAfter(loop, claimed, dueFloorMs, untilDue), loop.wake.wait)
    return Effect.flatMap(Clock.currentTimeMillis, (now) => {
      lastEnd = now
      if (claimed > 0) {
        anchor = now
        // By the rate, not the batch: rows per 2 × relookMs, whichever cadence found them. A
        // batch near fewRows at the short cadence would flip it to the long one at every dip. And
        // a look's share of a steady load comes in unevenly: at 1,000 msg/s about one look in ten
        // found few enough to wait 2 × relookMs, the tail of commit → claim (issue #21). So the
        // short cadence holds while this look's rate or the last few looks' rate is high enough.
        const gathered = Math.max(relookMs, cycleStart - previousStart)
        if (gathered > RATE_WINDOW_MS) {
          // The first look after a pause: its rows could have waited any time, and the looks
          // before it say nothing of the rate now.
          recentRows = 0
          recentMs = 0
        } else {
          recentRows = recentRows * RATE_DECAY + claimed
          recentMs = recentMs * RATE_DECAY + gathered
        }
        // The worker that claimed rows last looks again: its publish is what makes producers skip
        // their wake-up (migration 0007), so its looks must follow.
        heatUp(now, fast(claimed, gathered) || fast(recentRows, recentMs) ? relookMs : relookMs * 2)
      } else if (loop.leads?.() === true) {
        // Another process looks at a low rate and this one ranks before it: look on its cadence
        // until this one's publishes cover it (issue #25).
        heatUp(now, relookMs * 2)
      }
      anchor ??= now
      const sinceTick = (now - anchor) % loop.pollMs
      let toPoll = loop.pollMs - sinceTick
      // Another process looks for both: leave the follow-up looks to it (issue #25).
      const covered = loop.covered?.() === true
      if (covered && state.relooker === self) state.relooker = undefined
      // Its polls thin out too, whether or not they found a row or two: that one would have.
      const maxSkipped = loop.hearing?.() === true ? MAX_SKIPPED_POLLS_HEARING : MAX_SKIPPED_POLLS
      skippedPolls = covered ? Math.min(skippedPolls * 2 + 1, maxSkipped) : 0
      toPoll += skippedPolls * loop.pollMs
      // Follow-up looks are one worker's job: W workers looking every relookMs found the same rows W
      // times over, or nothing (issue #25). The others wait for a wake-up, a nudge or the poll.
      const relooking = state.relooker === self
      if (relooking && now < hotUntil) {
        const wait = Math.min(hotWait - (now - cycleStart), toPoll)
        return wait > 0 ? Effect.sleep(wait) : Effect.yieldNow
      }
      if (!relooking || now >= warmUntil) {
        if (relooking) state.relooker = undefined
        // Covered, no probe for due rows: at a steady load one is nearly always due, and the probe
        // cut every thinned wait to 50 ms; the relay that covers this one claims them.
        return Effect.flatMap(covered ? Effect.succeed(toPoll) : untilDue(toPoll), awoken)
      }
      const wait = Math.min(nextRelookMs, toPoll)
      nextRelookMs *= 2
      return Effect.flatMap(untilDue(wait), awoken)
    })
  }
  return Effect.forever(Effect.flatMap(step, pause))
}

/** Whether a loop ran a cycle within `withinMs` of now and its last cycle succeeded. */
export const isLive = (state: LoopState, withinMs: number): Effect.Effect<boolean> =>
  Effect.map(
    Clock.currentTimeMillis,
    (now) =>
      state.lastSuccessAt !== undefined &&
      state.lastError === undefined &&
      now - state.lastSuccessAt < withinMs,
  )
