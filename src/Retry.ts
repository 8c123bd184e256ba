/**
 * Backoff: one policy, two uses. The relay and inbox persist per-message retries
 * as `visible_at = now() + delayFor(attempt)` (so they survive restarts), and
 * loops that lose their database or broker retry in memory with `schedule()`.
 * Both read the same numbers: exponential growth, a cap, ±20 % jitter.
 */
import { Duration, Effect, Schedule } from "effect"
import * as config from "./core/config.ts"

/** How retries back off: exponential from `initialDelay` by `factor`, capped at `maxDelay`, optionally jittered. */
export interface RetryPolicy {
  /** Delay before the first retry. @default 1 second */
  readonly initialDelay: Duration.Input
  /** Growth per attempt. @default 2 */
  readonly factor: number
  /** No delay is ever longer than this (before jitter). @default 5 minutes */
  readonly maxDelay: Duration.Input
  /** Scale each delay by a random factor in [0.8, 1.2], so failed messages don't retry in lockstep. @default true */
  readonly jitter: boolean
  /** Attempts before a message is dead (per-message retries only). @default 10 */
  readonly maxAttempts: number
}

/** The policy used for any field left out: 1 s doubling to 5 min, jittered, dead after 10 attempts. */
export const defaultRetryPolicy: RetryPolicy = {
  initialDelay: "1 second",
  factor: 2,
  maxDelay: "5 minutes",
  jitter: true,
  maxAttempts: 10,
}

/**
 * Validates a partial policy over the defaults and returns it with its
 * durations in milliseconds. A bad value throws a `ConfigError` naming the
 * field (`field.initialDelay`, ...): call it inside `validateConfig`, which
 * turns that into the layer's typed failure.
 */
export const makeRetryPolicy = (overrides: Partial<RetryPolicy> = {}, field = "retry"): RetryPolicy => {
  const policy = { ...defaultRetryPolicy, ...overrides }
  const initialDelay = config.millis(
    `${field}.initialDelay`,
    policy.initialDelay,
    defaultRetryPolicy.initialDelay,
  )
  const maxDelay = config.millis(`${field}.maxDelay`, policy.maxDelay, defaultRetryPolicy.maxDelay, {
    minMs: initialDelay,
  })
  return {
    initialDelay,
    maxDelay,
    factor: config.atLeast(`${field}.factor`, policy.factor, defaultRetryPolicy.factor, 1),
    jitter: config.flag(`${field}.jitter`, policy.jitter, defaultRetryPolicy.jitter),
    maxAttempts: config.integer(`${field}.maxAttempts`, policy.maxAttempts, 10, 1, 1_000_000),
  }
}

/** The un-jittered delay before retry number `attempt` (1-based), capped. */
export const baseDelayMillis = (policy: RetryPolicy, attempt: number): number => {
  const initial = Duration.toMillis(Duration.fromInputUnsafe(policy.initialDelay))
  const max = Duration.toMillis(Duration.fromInputUnsafe(policy.maxDelay))
  const raw = initial * policy.factor ** Math.max(0, attempt - 1)
  return Math.min(max, Number.isFinite(raw) ? raw : max)
}

/** The delay before retry number `attempt`, jittered; `random` is in [0, 1). */
export const delayFor = (policy: RetryPolicy, attempt: number, random: number = Math.random()): number => {
  const base = baseDelayMillis(policy, attempt)
  return Math.round(policy.jitter ? base * (0.8 + 0.4 * random) : base)
}

/**
 * The same policy as an Effect `Schedule` for in-memory retries of a whole
 * loop (database or broker unreachable): exponential, capped, jittered, and
 * unbounded — infrastructure comes back, and the loop must still be there.
 */
export const schedule = (policy: RetryPolicy): Schedule.Schedule<Duration.Duration> => {
  const initial = Duration.fromInputUnsafe(policy.initialDelay)
  const max = Duration.toMillis(Duration.fromInputUnsafe(policy.maxDelay))
  const capped = Schedule.exponential(initial, policy.factor).pipe(
    Schedule.modifyDelay(({ duration }) =>
      Effect.succeed(Duration.millis(Math.min(max, Duration.toMillis(duration)))),
    ),
  )
  return policy.jitter ? Schedule.jittered(capped) : capped
}

/**
 * `Effect.retry` that costs nothing until `self` first fails. Effect's retry
 * steps its schedule and provides the schedule's metadata around every run,
 * success or not; the relay and inbox loops run theirs once per cycle, and
 * with nothing failing that was about 5 % of a relay's CPU at 1,000 msg/s
 * (bench/cost.ts). The first failure is replayed into `Effect.retry`, so the
 * delays and the `while` test are the schedule's as before. `afterFirst`
 * wraps the retrying part alone (a bound on how long the retries may take).
 */
export const retryAfterFailure = <A, E, R>(
  self: Effect.Effect<A, E, R>,
  options: { readonly schedule: Schedule.Schedule<unknown, E>; readonly while?: (error: E) => boolean },
  afterFirst: (retrying: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R> = (retrying) => retrying,
): Effect.Effect<A, E, R> =>
  Effect.catch(self, (first: E) => {
    let replayed = false
    const again = Effect.suspend(() => {
      if (replayed) return self
      replayed = true
      return Effect.fail(first)
    })
    return afterFirst(Effect.retry(again, options))
  })
