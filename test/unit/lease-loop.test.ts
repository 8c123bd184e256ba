// When the lease loop looks again (core/leaseLoop.ts), on TestClock: full batches at once, the
// second looks after a cycle that claimed rows (a steady cadence, then doubling), then NOTIFY or the
// poll, and never a claim per wake-up.
import { expect, test } from "bun:test"
import { Cause, Clock, Effect, Fiber, Layer, Logger } from "effect"
import { TestClock } from "effect/testing"
import { makeLoopState, runLeaseLoop } from "../../src/core/leaseLoop.ts"
import { makeSignal } from "../../src/core/signal.ts"
import { defaultRetryPolicy } from "../../src/Retry.ts"

/** Runs a loop whose cycles claim `script[i]` rows (0 once the script ends) for `forMs` of test time; returns when each cycle ran. */
const cycleTimes = (
  script: ReadonlyArray<number>,
  forMs: number,
  options: {
    relookMs?: number
    hotMs?: number
    fewRows?: number
    warmMs?: number
    notifyAt?: ReadonlyArray<number>
    /** Workers sharing the loop (its state and wake-up), as a relay's do. @default 1 */
    workers?: number
    /** How long each cycle takes. @default 0 */
    cycleMs?: number
    /** Whether another process's looks cover this loop's, asked after each cycle (its index). */
    covered?: (cycle: number) => boolean
    /** What the probe for due rows always answers (ms until one is due; 0: one is due now). */
    nextDueMs?: number
    /** Whether this loop takes up the follow-up looks after an empty cycle (its index). */
    leads?: (cycle: number) => boolean
    /** Whether the loop's wake-ups are heard (its LISTEN works). */
    hearing?: boolean
    /** The longest wait of a loop without second looks while heard (`LeaseLoop.hearingPollMs`). */
    hearingPollMs?: number
    /** What the probe for due rows answers when none is pending (instead of `nextDueMs`). */
    nonePending?: boolean
  } = {},
) =>
  Effect.runPromise(
    Effect.gen(function* () {
      const times: number[] = []
      const wake = makeSignal()
      let i = 0
      const cycle = Effect.gen(function* () {
        times.push(yield* Clock.currentTimeMillis)
        if (options.cycleMs) yield* Effect.sleep(options.cycleMs)
        return script[i++] ?? 0
      })
      const loop = {
        name: "test",
        cycle,
        batchSize: 100,
        pollMs: 1000,
        ...(options.relookMs === undefined ? {} : { relookMs: options.relookMs }),
        ...(options.hotMs === undefined ? {} : { hotMs: options.hotMs }),
        ...(options.fewRows === undefined ? {} : { fewRows: options.fewRows }),
        ...(options.warmMs === undefined ? {} : { warmMs: options.warmMs }),
        ...(options.covered === undefined ? {} : { covered: () => options.covered!(i - 1) }),
        ...(options.leads === undefined ? {} : { leads: () => options.leads!(i - 1) }),
        ...(options.nextDueMs === undefined ? {} : { nextDueMs: Effect.succeed(options.nextDueMs) }),
        ...(options.nonePending ? { nextDueMs: Effect.succeed(undefined) } : {}),
        ...(options.hearingPollMs === undefined ? {} : { hearingPollMs: options.hearingPollMs }),
        ...(options.hearing === undefined ? {} : { hearing: () => options.hearing! }),
        outage: defaultRetryPolicy,
        wake,
        state: makeLoopState(),
      }
      const fibers = []
      for (let w = 0; w < (options.workers ?? 1); w++)
        fibers.push(yield* Effect.forkChild(runLeaseLoop(loop)))
      for (let t = 0; t < forMs; t += 5) {
        if (options.notifyAt?.includes(t)) wake.notify()
        yield* TestClock.adjust(5)
      }
      for (const fiber of fibers) {
        // A cycle in flight is uninterruptible: the clock must move for its sleep to end.
        const stopping = yield* Effect.forkChild(Fiber.interrupt(fiber))
        if (options.cycleMs) yield* TestClock.adjust(options.cycleMs)
        yield* Fiber.join(stopping)
      }
      return times
    }).pipe(Effect.provide(TestClock.layer())),
  )

test("without second looks: a partial batch waits for the poll, a full one goes again at once", async () => {
  const times = await cycleTimes([100, 100, 5], 2_500)
  // Full batches: the next cycle runs as soon as the loop's fiber is scheduled (the test clock
  // advances in 5 ms steps), never after a wait; the partial one, and the empty ones after it, poll.
  const gaps = times.slice(1).map((t, i) => t - times[i]!)
  expect(gaps.length).toBe(4)
  expect(gaps[0]).toBeLessThanOrEqual(5)
  expect(gaps[1]).toBeLessThanOrEqual(5)
  expect(gaps.slice(2)).toEqual([1000, 1000])
})

test("after a cycle that claimed rows: looks after 10, 20, 40 … ms while within warmMs; polls keep their period", async () => {
  const times = await cycleTimes([5], 2_500, { relookMs: 10, warmMs: 1000 })
  // Looks at +10, +30, +70, +150, +310, +630, then the polls keep their period from the claim.
  expect(times).toEqual([0, 10, 30, 70, 150, 310, 630, 1000, 2000])
})

test("within hotMs of a cycle that claimed rows: a look every relookMs, then the doubling", async () => {
  const times = await cycleTimes([5], 2_500, { relookMs: 10, hotMs: 50, warmMs: 1000 })
  // Every 10 ms until +50, then +20, +40, +80 … after the last look, then the polls.
  expect(times).toEqual([0, 10, 20, 30, 40, 50, 70, 110, 190, 350, 670, 1000, 2000])
})

test("a steady load: each look finds rows, so the loop claims every relookMs", async () => {
  const times = await cycleTimes([3, 4, 2, 5, 1, 6], 80, { relookMs: 10, hotMs: 50, warmMs: 1000 })
  expect(times.slice(0, 7)).toEqual([0, 10, 20, 30, 40, 50, 60])
})

test("while rows come in slower than fewRows per 2 × relookMs, the looks come every 2 × relookMs; a faster rate brings them back", async () => {
  const times = await cycleTimes([3, 2, 9, 4, 5, 6], 100, {
    relookMs: 10,
    hotMs: 50,
    fewRows: 8,
    warmMs: 1000,
  })
  // 3 rows (first look: no rate yet) and 2 in 20 ms: slow. 9 in 20 ms: fast, next after 10; 4 in
  // those 10 ms is the same rate (8 per 20 ms), so the cadence stays, though the batch is small.
  expect(times.slice(0, 6)).toEqual([0, 20, 40, 50, 60, 70])
})

test("one look that finds few rows in a steady load does not slow the looks: the last few looks' rate holds the cadence", async () => {
  // 12 rows in 20 ms, then 6 per 10 ms (12 per 20: fast). The look at 50 finds 2 (4 per 20 alone,
  // under fewRows), but over the last looks the rate is still above it: the next look comes at 60,
  // not 70. A rate that falls does slow them: one row a look from 70 on, every 20 ms after two.
  const times = await cycleTimes([3, 12, 6, 6, 2, 6, 6, 1, 1, 1, 1, 1, 1], 200, {
    relookMs: 10,
    hotMs: 200,
    fewRows: 8,
    warmMs: 1000,
  })
  expect(times.slice(0, 7)).toEqual([0, 20, 30, 40, 50, 60, 70])
  expect(times.slice(7, 12)).toEqual([80, 90, 110, 130, 150])
})

test("the follow-up looks keep their cadence from one look's start to the next, whatever the cycle takes", async () => {
  const times = await cycleTimes([5, 5, 5, 5], 60, { relookMs: 10, hotMs: 50, warmMs: 1000, cycleMs: 5 })
  expect(times.slice(0, 4)).toEqual([0, 10, 20, 30])
  // A cycle longer than the cadence: the next look at once.
  const slow = await cycleTimes([5, 5, 5], 60, { relookMs: 10, hotMs: 50, warmMs: 1000, cycleMs: 15 })
  expect(slow.slice(0, 3)).toEqual([0, 15, 30])
})

test("a look that finds rows starts the doubling again from relookMs", async () => {
  const times = await cycleTimes([5, 0, 0, 3], 400, { relookMs: 10, warmMs: 1000 })
  // 0 claims 5; +10 and +30 find nothing; +70 finds 3: next looks +10, +30, +70, +150, +310 after it.
  expect(times).toEqual([0, 10, 30, 70, 80, 100, 140, 220, 380])
})

test("two workers: one makes the follow-up looks, the other waits for the poll", async () => {
  // Both claim rows at 0 and look again at +10 (each was the last to claim when it decided); from
  // then on only the one that claimed last looks (+30, +70 …), not both: two workers looking found
  // the same rows twice over, or nothing.
  const times = await cycleTimes([5, 5], 1_500, { relookMs: 10, warmMs: 1000, workers: 2 })
  expect(times).toEqual([0, 0, 10, 10, 30, 70, 150, 310, 630, 1000, 1000])
})

test("covered by another process's looks: no follow-up looks, and polls thin out to one in 2, 4, 8 intervals", async () => {
  // Cycle 0 claims rows while another relay publishes (covered): no look at +10 and, still covered,
  // the polls come after 2, 4, then 8 poll intervals (one in 8 at most).
  const times = await cycleTimes([5], 25_000, { relookMs: 10, warmMs: 1000, covered: () => true })
  expect(times).toEqual([0, 2000, 6000, 14000, 22000])
  // Uncovered, the same loop looks again at once and polls every interval.
  const alone = await cycleTimes([5], 3_500, { relookMs: 10, warmMs: 1000, covered: () => false })
  expect(alone).toEqual([0, 10, 30, 70, 150, 310, 630, 1000, 2000, 3000])
})

test("covered while its wake-ups are heard: polls thin out further, to one in 32 intervals; deaf, one in 8", async () => {
  const heard = await cycleTimes([5], 130_000, {
    relookMs: 10,
    warmMs: 1000,
    covered: () => true,
    hearing: true,
  })
  expect(heard).toEqual([0, 2000, 6000, 14000, 30000, 62000, 94000, 126000])
  const deaf = await cycleTimes([5], 40_000, {
    relookMs: 10,
    warmMs: 1000,
    covered: () => true,
    hearing: false,
  })
  expect(deaf).toEqual([0, 2000, 6000, 14000, 22000, 30000, 38000])
})

test("covered, a row always due (a steady load) does not cut the thinned waits short: the other relay claims it", async () => {
  const times = await cycleTimes([5], 25_000, {
    relookMs: 10,
    warmMs: 1000,
    covered: () => true,
    nextDueMs: 0,
  })
  expect(times).toEqual([0, 2000, 6000, 14000, 22000])
})

test("no longer covered (the other relay stopped publishing): looks and polls as before", async () => {
  // Covered after cycles 0 and 1 (waits of 2 and 4 intervals); after cycle 2 at 6000 not: the
  // next poll comes in one.
  const times = await cycleTimes([5], 10_500, {
    relookMs: 10,
    warmMs: 1000,
    covered: (cycle) => cycle < 2,
  })
  expect(times).toEqual([0, 2000, 6000, 7000, 8000, 9000, 10000])
})

test("leading (one ranked after it publishes at a low rate): an empty cycle takes up the follow-up looks, on the long cadence", async () => {
  // Cycle 0 finds nothing while another relay ranked after this one publishes: looks every
  // 2 × relookMs until hotMs, then at doubling intervals, as after a cycle that claimed rows; so
  // this relay claims the next rows and its publishes cover the other's looks.
  const led = await cycleTimes([], 1_500, { relookMs: 10, hotMs: 50, warmMs: 1000, leads: (c) => c === 0 })
  expect(led).toEqual([0, 20, 40, 60, 80, 120, 200, 360, 680, 1000])
  // Still leading after every look: it keeps the long cadence.
  const still = await cycleTimes([], 200, { relookMs: 10, hotMs: 50, warmMs: 1000, leads: () => true })
  expect(still).toEqual([0, 20, 40, 60, 80, 100, 120, 140, 160, 180, 200])
  // Not leading: an empty cycle waits for the poll.
  const idle = await cycleTimes([], 1_500, { relookMs: 10, hotMs: 50, warmMs: 1000, leads: () => false })
  expect(idle).toEqual([0, 1000])
})

test("a NOTIFY still wakes a covered loop at once", async () => {
  const times = await cycleTimes([5], 3_000, {
    relookMs: 10,
    warmMs: 1000,
    covered: () => true,
    notifyAt: [1500],
  })
  expect(times.slice(0, 2)).toEqual([0, 1500])
})

test("a NOTIFY wakes one of two idle workers", async () => {
  const times = await cycleTimes([], 600, { relookMs: 10, warmMs: 1000, notifyAt: [400], workers: 2 })
  expect(times).toEqual([0, 0, 400])
})

test("a NOTIFY cuts any wait short", async () => {
  const times = await cycleTimes([], 600, { relookMs: 10, warmMs: 1000, notifyAt: [400] })
  expect(times).toEqual([0, 400])
})

test("wake-ups in a burst: one claim per relookMs, not one each", async () => {
  // An idle loop (polls at 0, 1000) woken every 5 ms from 400 to 445: without the gap that is 10
  // claims; with it a claim at most every 10 ms after the one before (the wake-up at 445 came
  // after the claim at 440 began, so it still gets one, at 460).
  const notifyAt = Array.from({ length: 10 }, (_, i) => 400 + 5 * i)
  const times = await cycleTimes([], 600, { relookMs: 10, warmMs: 1000, notifyAt })
  expect(times).toEqual([0, 400, 410, 420, 430, 440, 450, 460])
})

/** No jitter, so the backoff between failed cycles is 100 ms, then 200 ms, … */
const steadyOutage = { ...defaultRetryPolicy, initialDelay: 100, jitter: false }

test("a cycle that dies (a throw, Effect.die) backs off and runs again; the state shows it meanwhile", async () => {
  const result = await Effect.runPromise(
    Effect.gen(function* () {
      const times: number[] = []
      const state = makeLoopState()
      let runs = 0
      const cycle = Effect.gen(function* () {
        times.push(yield* Clock.currentTimeMillis)
        runs++
        // A type parser that returns timestamps as strings: the publish path throws.
        if (runs === 1) return yield* Effect.sync(() => ("2024-01-01" as unknown as Date).getTime())
        if (runs === 2) return yield* Effect.die(new Error("still broken"))
        return 0
      })
      const fiber = yield* Effect.forkChild(
        runLeaseLoop({
          name: "test",
          cycle,
          batchSize: 100,
          pollMs: 1000,
          outage: steadyOutage,
          wake: makeSignal(),
          state,
        }),
      )
      yield* TestClock.adjust(50)
      const afterFirst = { ...state }
      yield* TestClock.adjust(100)
      const afterSecond = { ...state }
      yield* TestClock.adjust(1_500)
      yield* Fiber.interrupt(fiber)
      return { times, afterFirst, afterSecond, state: { ...state } }
      // No logger: the next test reads the log.
    }).pipe(Effect.provide(Layer.merge(TestClock.layer(), Logger.layer([])))),
  )
  // Dies at 0 and 100 (backoff 100, 200), succeeds at 300, then polls.
  expect(result.times).toEqual([0, 100, 300, 1300])
  expect(result.afterFirst.consecutiveFailures).toBe(1)
  expect(result.afterFirst.lastError).toContain("getTime is not a function")
  expect(result.afterSecond.consecutiveFailures).toBe(2)
  expect(result.afterSecond.lastError).toContain("still broken")
  expect(result.state.consecutiveFailures).toBe(0)
  expect(result.state.lastError).toBeUndefined()
  expect(result.state.lastSuccessAt).toBe(1300)
})

test("a defect is logged once per run of failures, with its cause", async () => {
  const logged: Array<{ level: string; cause: string }> = []
  const logger = Logger.make(({ logLevel, cause }) => {
    logged.push({ level: logLevel, cause: Cause.pretty(cause) })
  })
  await Effect.runPromise(
    Effect.gen(function* () {
      let runs = 0
      // Dies three times, succeeds, dies once more.
      const cycle = Effect.suspend(() =>
        ++runs === 4 ? Effect.succeed(0) : Effect.die(new Error(`boom ${runs}`)),
      )
      const fiber = yield* Effect.forkChild(
        runLeaseLoop({
          name: "test",
          cycle,
          batchSize: 100,
          pollMs: 1000,
          outage: steadyOutage,
          wake: makeSignal(),
          state: makeLoopState(),
        }),
      )
      yield* TestClock.adjust(2_000)
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(Layer.merge(TestClock.layer(), Logger.layer([logger])))),
  )
  expect(logged.map((l) => l.level)).toEqual(["Error", "Error"])
  expect(logged[0]!.cause).toContain("boom 1")
  expect(logged[1]!.cause).toContain("boom 5")
})

/** A loop with a long poll over one row due at `dueAt`; returns when each cycle ran and how often it probed. */
const dueTimes = (pollMs: number, dueAt: number, forMs: number) =>
  Effect.runPromise(
    Effect.gen(function* () {
      const times: number[] = []
      let probes = 0
      let published = false
      const cycle = Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        times.push(now)
        if (published || now < dueAt) return 0
        published = true
        return 1
      })
      const nextDueMs = Effect.gen(function* () {
        probes++
        return published ? undefined : dueAt - (yield* Clock.currentTimeMillis)
      })
      const fiber = yield* Effect.forkChild(
        runLeaseLoop({
          name: "test",
          cycle,
          batchSize: 100,
          pollMs,
          relookMs: 10,
          warmMs: 500,
          nextDueMs,
          outage: defaultRetryPolicy,
          wake: makeSignal(),
          state: makeLoopState(),
        }),
      )
      for (let t = 0; t < forMs; t += 5) yield* TestClock.adjust(5)
      yield* Fiber.interrupt(fiber)
      return { times, probes }
    }).pipe(Effect.provide(TestClock.layer())),
  )

test("a long poll: a row due by time is claimed when it comes due, not at the next poll", async () => {
  const { times } = await dueTimes(30_000, 2_500, 3_000)
  // The first cycle finds nothing; the wait ends at 2500, when the row is due; then warm looks.
  expect(times.slice(0, 2)).toEqual([0, 2_500])
  expect(times.at(-1)).toBeLessThan(3_000)
})

test("the default 1 s poll never probes for due rows", async () => {
  const { times, probes } = await dueTimes(1_000, 2_500, 3_000)
  expect(probes).toBe(0)
  // The row waits for the poll at 3000: at most a second, as before.
  expect(times).toEqual([0, 1_000, 2_000, 3_000])
})

// An idle inbox processor whose NOTIFY is heard (Inbox.ts: hearingPollMs = 10 × pollInterval): every
// row that arrives or is redriven notifies, and the probe for due rows covers retries and leases.
test("heard, nothing pending: a loop without second looks polls every hearingPollMs after an empty cycle", async () => {
  const times = await cycleTimes([], 25_000, { hearing: true, hearingPollMs: 10_000, nonePending: true })
  expect(times).toEqual([0, 10_000, 20_000])
})

test("deaf (its LISTEN lost), the same loop polls every pollMs", async () => {
  const times = await cycleTimes([], 3_500, { hearing: false, hearingPollMs: 10_000, nonePending: true })
  expect(times).toEqual([0, 1_000, 2_000, 3_000])
})

test("heard, a row due by time: the wait ends when it comes due, within hearingPollMs", async () => {
  const times = await cycleTimes([], 8_000, { hearing: true, hearingPollMs: 10_000, nextDueMs: 2_500 })
  expect(times).toEqual([0, 2_500, 5_000, 7_500])
})

test("heard, a row due now that the cycle did not claim (held, or waiting for its key): polls every pollMs, no spin", async () => {
  const times = await cycleTimes([], 3_500, { hearing: true, hearingPollMs: 10_000, nextDueMs: 0 })
  expect(times).toEqual([0, 1_000, 2_000, 3_000])
})

test("heard: after a cycle that claimed rows the next look is at pollMs; the empty one after it waits hearingPollMs", async () => {
  const times = await cycleTimes([5], 12_500, { hearing: true, hearingPollMs: 10_000, nonePending: true })
  expect(times).toEqual([0, 1_000, 11_000])
})

test("heard, a NOTIFY still ends the long wait at once", async () => {
  const times = await cycleTimes([], 6_000, {
    hearing: true,
    hearingPollMs: 10_000,
    nonePending: true,
    notifyAt: [4_000],
  })
  expect(times).toEqual([0, 4_000])
})
