/**
 * The one claim → work → settle loop, shared by the relay's workers and the
 * inbox's processor. A cycle claims a batch under a lease, works on it and
 * records the verdicts; the loop decides when to run the next one:
 *
 * - a full batch means more is waiting: go again at once (after yielding);
 * - with `relookMs`: after a cycle that claimed rows, look again every
 *   `relookMs` for `hotMs` (producers skip their wake-up while a loop is this
 *   warm: migration 0007), then after twice that, four times … while less
 *   than `warmMs` has passed since it (a producer may commit a while after
 *   its insert decided not to wake anyone: the looks thin out, and an idle
 *   loop stops looking after a handful). At a steady load a loop thus claims
 *   every `relookMs` (every other one while its batches are small: `fewRows`),
 *   whatever the rate: the batches grow with the load instead of the claims;
 * - otherwise wait for a wake-up (NOTIFY) or the poll interval, and never
 *   claim again within `relookMs` of the last cycle: a burst of wake-ups is
 *   one claim, not one each;
 * - a failed cycle backs off on the outage schedule and tries again, forever:
 *   a retryable failure (connection lost) as a warning, any other (a missing
 *   table, a read-only database after failover) loudly as an error, since it
 *   needs a person — but the loop is still there when it is fixed;
 * - a cycle is uninterruptible: shutdown waits for the batch in flight to be
 *   settled instead of leaving its rows claimed until their lease runs out.
 *
 * All waiting is on Effect's `Clock`, so `TestClock` drives it in unit tests.
 */
import { Clock, Effect } from "effect"
import { type RetryPolicy, schedule } from "../Retry.ts"
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
}

export const makeLoopState = (): LoopState => ({
  lastCycleAt: undefined,
  lastSuccessAt: undefined,
  lastError: undefined,
  consecutiveFailures: 0,
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
  /** After a cycle that claimed rows, look again this often… */
  readonly relookMs?: number
  /** …for this long after it… @default relookMs */
  readonly hotMs?: number
  /**
   * A look that claims fewer rows than this (but some) waits twice `relookMs`
   * for the next: at a low rate each look costs about what a full one does,
   * so it waits for more. @default 0 (off)
   */
  readonly fewRows?: number
  /** …then at doubling intervals until this long has passed since the last cycle that claimed any. */
  readonly warmMs?: number
  /** Backoff between failed cycles. */
  readonly outage: RetryPolicy
  readonly wake: Signal
  readonly state: LoopState
}

/** Runs the loop until interrupted; never fails and never ends by itself. */
export const runLeaseLoop = <E extends { readonly message: string; readonly retryable: boolean }>(
  loop: LeaseLoop<E>,
): Effect.Effect<never> => {
  const { state } = loop
  const failed = (error: E) =>
    Effect.gen(function* () {
      state.lastCycleAt = yield* Clock.currentTimeMillis
      state.lastError = error.message
      state.consecutiveFailures++
      if (error.retryable) yield* Effect.logWarning(`${loop.name}: ${error.message}; backing off`)
      else {
        yield* Effect.logError(
          `${loop.name}: ${error.message}; this will not pass by itself (fix the cause); backing off and retrying`,
        )
      }
    })
  const succeeded = Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    state.lastCycleAt = now
    state.lastSuccessAt = now
    state.lastError = undefined
    state.consecutiveFailures = 0
  })
  const step = Effect.uninterruptible(loop.cycle).pipe(
    Effect.tap(() => succeeded),
    Effect.tapError(failed),
    // Unbounded: infrastructure comes back, and the loop must still be there.
    Effect.retry({ schedule: schedule(loop.outage) }),
    Effect.orDie,
  )
  const relookMs = loop.relookMs === undefined ? 0 : Math.min(loop.relookMs, loop.pollMs)
  const hotMs = Math.max(relookMs, loop.hotMs ?? relookMs)
  const warmMs = Math.max(hotMs, loop.warmMs ?? hotMs)
  // Clock times until which an empty cycle looks again instead of waiting to poll: every relookMs
  // until hotUntil, then at doubling intervals until warmUntil.
  let hotUntil = 0
  let warmUntil = 0
  let nextRelookMs = relookMs
  const fewRows = loop.fewRows ?? 0
  // The wait after the last look that claimed rows: relookMs, or twice that after a small batch.
  let hotWait = relookMs
  // When the last cycle ended: a wake-up within relookMs of it waits for the rest.
  let lastEnd = 0
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
  const pause = (claimed: number): Effect.Effect<void> => {
    if (claimed >= loop.batchSize) return Effect.yieldNow
    if (relookMs === 0) return loop.wake.wait(loop.pollMs)
    return Effect.flatMap(Clock.currentTimeMillis, (now) => {
      lastEnd = now
      if (claimed > 0) {
        anchor = now
        hotUntil = now + hotMs
        warmUntil = now + warmMs
        nextRelookMs = relookMs * 2
        hotWait = claimed < fewRows ? relookMs * 2 : relookMs
      }
      anchor ??= now
      const sinceTick = (now - anchor) % loop.pollMs
      const toPoll = loop.pollMs - sinceTick
      if (now < hotUntil) return Effect.sleep(Math.min(hotWait, toPoll))
      if (now >= warmUntil) return awoken(toPoll)
      const wait = Math.min(nextRelookMs, toPoll)
      nextRelookMs *= 2
      return awoken(wait)
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
