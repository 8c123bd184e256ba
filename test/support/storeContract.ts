/**
 * What every `OutboxStore` and `InboxStore` must do, as bun:test specs any
 * implementation can run: the memory stores (test/unit/memory-store.test.ts)
 * and the SQL ones. A runner hands in `setup`, which builds a fresh, empty
 * store and a harness around it; every test calls it once and disposes it.
 *
 * Time: tests that need it to pass call `advance(ms)` with short durations
 * (about a second at most). The memory runner moves a TestClock; a PostgreSQL
 * runner sleeps (or shifts `visible_at` and `published_at` back). Times the
 * tests compare are read with `now()`, the store's own clock (the TestClock, or
 * `SELECT now()`), and only ever bracketed (`before <= t <= after + ms`), so
 * a real database's clock passes as well as a test one.
 *
 * Wakeups are not part of this spec: the port allows a store to call `onWake`
 * spuriously or never (a SQL store with LISTEN off), so they are tested per store.
 */
import { afterEach, beforeEach, describe, expect, test } from "bun:test"
import { Cause, Deferred, Effect, Exit, Fiber } from "effect"
import { uuidv7 } from "../../src/core/uuid.ts"
import {
  type InboxRow,
  InboxStore,
  type InboxStoreShape,
  type OrderedDeadPolicy,
} from "../../src/ports/InboxStore.ts"
import type { Verdict } from "../../src/ports/lease.ts"
import { OutboxStore, type OutboxStoreShape } from "../../src/ports/OutboxStore.ts"
import { CHAINED_PER_CLAIM } from "../../src/storage/sql/partitionGate.ts"

// ---------------------------------------------------------------------------------------------
// Harnesses

/** A pending outbox message to seed. */
export interface OutboxSeed {
  /** A UUID (the SQL column is `uuid`). */
  readonly id: string
  /** @default "test.event" */
  readonly type?: string
  /** JSON text. @default "{}" */
  readonly payload?: string
  /** Due this many ms from now; negative: it has been waiting that long. @default 0 */
  readonly dueInMs?: number
}

/** One outbox row as the spec reads it; times in epoch ms of the store's clock. */
export interface OutboxRowView {
  readonly id: string
  readonly status: "pending" | "sent" | "dead"
  readonly attempts: number
  readonly visibleAt: number
  readonly lockToken: string | null
  readonly lastError: string | null
  readonly publishedAt: number | null
}

export interface OutboxHarness {
  /** Runs an effect against the store under test, on the clock `advance` moves. */
  readonly run: <A, E>(effect: Effect.Effect<A, E, OutboxStore>) => Promise<A>
  /** Inserts pending messages as a producer's committed transaction would. */
  readonly insert: (rows: ReadonlyArray<OutboxSeed>) => Promise<void>
  /** Every row, in any order. */
  readonly rows: () => Promise<ReadonlyArray<OutboxRowView>>
  /** Lets `ms` pass on the store's clock. */
  readonly advance: (ms: number) => Promise<void>
  /** The store's clock, epoch ms. */
  readonly now: () => Promise<number>
  readonly dispose: () => Promise<void>
}

/** One inbox row as the spec reads it; times in epoch ms of the store's clock. */
export interface InboxRowView {
  readonly key: string
  readonly consumer: string
  readonly status: "pending" | "processed" | "dead"
  readonly attempts: number
  readonly visibleAt: number
  readonly lockToken: string | null
  readonly lastError: string | null
  readonly raw: string | null
  readonly processedAt: number | null
}

export interface InboxHarness {
  /** Runs an effect against the store under test, on the clock `advance` moves. */
  readonly run: <A, E>(effect: Effect.Effect<A, E, InboxStore>) => Promise<A>
  /** Every row (of one consumer, if given), in any order. */
  readonly rows: (consumer?: string) => Promise<ReadonlyArray<InboxRowView>>
  readonly advance: (ms: number) => Promise<void>
  readonly now: () => Promise<number>
  readonly dispose: () => Promise<void>
}

// ---------------------------------------------------------------------------------------------
// Shared values

/** A lease no test outlives. */
const LONG_LEASE = 60_000
/** A lease or delay a test lets run out with `advance`. Short, so a SQL runner can sleep it. */
const SHORT = 1_000

const done: Verdict = { _tag: "Done" }
type Failure = Exclude<Verdict, { readonly _tag: "Done" }>

const retry = (delayMs: number, error: string, spendsAttempt = true): Failure => ({
  _tag: "Retry",
  delayMs,
  error,
  spendsAttempt,
})
const dead = (error: string): Failure => ({ _tag: "Dead", error })

const sorted = (ids: ReadonlyArray<string>): string[] => [...ids].sort()

/** Runs `f` with a fresh harness from `setup`, disposed after each test. */
const withHarness = <H extends { readonly dispose: () => Promise<void> }>(setup: () => Promise<H>) => {
  let current: H | undefined
  beforeEach(async () => {
    current = await setup()
  })
  afterEach(async () => {
    await current?.dispose()
    current = undefined
  })
  return (): H => {
    if (current === undefined) throw new Error("store contract: no harness (setup failed?)")
    return current
  }
}

// ---------------------------------------------------------------------------------------------
// Outbox

export const outboxStoreContract = (name: string, setup: () => Promise<OutboxHarness>): void => {
  describe(`${name}: OutboxStore contract`, () => {
    const harness = withHarness(setup)
    const store = <A, E>(f: (s: OutboxStoreShape) => Effect.Effect<A, E>) => harness().run(OutboxStore.use(f))
    const claim = (limit: number, leaseMs = LONG_LEASE) => store((s) => s.claim(limit, leaseMs))
    const mark = (token: string, marks: ReadonlyArray<readonly [string, Verdict]>) =>
      store((s) =>
        s.mark(
          token,
          marks.map(([id, verdict]) => ({ id, verdict })),
        ),
      )
    const row = async (id: string): Promise<OutboxRowView> => {
      const found = (await harness().rows()).find((r) => r.id === id)
      if (found === undefined) throw new Error(`no outbox row ${id}`)
      return found
    }

    test("claim takes due messages oldest due first, up to the limit", async () => {
      const [a, b, c] = [uuidv7(), uuidv7(), uuidv7()]
      await harness().insert([
        { id: c, dueInMs: -1_000 },
        { id: a, dueInMs: -3_000 },
        { id: b, dueInMs: -2_000 },
      ])
      const claimed = await claim(2)
      expect(sorted(claimed.rows.map((m) => m.id))).toEqual(sorted([a, b]))
    })

    test("claim skips messages another claim holds", async () => {
      const ids = [uuidv7(), uuidv7(), uuidv7()]
      await harness().insert(ids.map((id) => ({ id, dueInMs: -1_000 })))
      const first = await claim(2)
      const second = await claim(10)
      expect(second.rows.map((m) => m.id)).toEqual(ids.filter((id) => !first.rows.some((m) => m.id === id)))
      expect(second.token).not.toBe(first.token)
      expect((await claim(10)).rows).toEqual([])
    })

    test("claim hands over the message as stored, with no attempt recorded yet", async () => {
      const id = uuidv7()
      await harness().insert([{ id, type: "order.placed", payload: '{"n":1}' }])
      const [message] = (await claim(1)).rows
      expect(message?.id).toBe(id)
      expect(message?.type).toBe("order.placed")
      expect(message?.version).toBe(1)
      // Compared parsed: PostgreSQL's jsonb may respace the text.
      expect(JSON.parse(message?.payload ?? "null")).toEqual({ n: 1 })
      expect(message?.headers).toEqual({})
      expect(message?.routingKey).toBeNull()
      expect(message?.attempts).toBe(0)
    })

    test("claim stamps the rows with its token and holds them for the lease", async () => {
      const id = uuidv7()
      await harness().insert([{ id }])
      const before = await harness().now()
      const { token } = await claim(1, LONG_LEASE)
      const after = await harness().now()
      const claimed = await row(id)
      expect(claimed.lockToken).toBe(token)
      expect(claimed.visibleAt).toBeGreaterThanOrEqual(before + LONG_LEASE)
      expect(claimed.visibleAt).toBeLessThanOrEqual(after + LONG_LEASE)
    })

    test("a message not yet visible is not claimed", async () => {
      await harness().insert([{ id: uuidv7(), dueInMs: 60_000 }])
      expect((await claim(10)).rows).toEqual([])
    })

    test("an expired lease makes the message claimable again, under a new token", async () => {
      const id = uuidv7()
      await harness().insert([{ id }])
      const first = await claim(1, SHORT)
      expect((await claim(1)).rows).toEqual([])
      await harness().advance(SHORT)
      const second = await claim(1)
      expect(second.rows.map((m) => m.id)).toEqual([id])
      expect(second.token).not.toBe(first.token)
    })

    test("extend keeps the claim's messages for another lease from now; a token that lost them extends nothing", async () => {
      const id = uuidv7()
      await harness().insert([{ id }])
      const first = await claim(1, SHORT)
      await harness().advance(SHORT / 2)
      expect(await harness().run(Effect.flatMap(OutboxStore, (s) => s.extend(first.token, SHORT)))).toBe(1)
      await harness().advance(SHORT / 2 + 100)
      expect((await claim(1)).rows).toEqual([]) // would have expired without the extension
      await harness().advance(SHORT)
      const second = await claim(1)
      expect(second.rows.map((m) => m.id)).toEqual([id])
      expect(await harness().run(Effect.flatMap(OutboxStore, (s) => s.extend(first.token, SHORT)))).toBe(0)
    })

    test("once another claim has taken the message, the expired token's mark changes nothing", async () => {
      const id = uuidv7()
      await harness().insert([{ id }])
      const first = await claim(1, SHORT)
      await harness().advance(SHORT)
      const second = await claim(1)
      expect(await mark(first.token, [[id, done]])).toBe(0)
      expect(await row(id)).toMatchObject({ status: "pending", lockToken: second.token })
      expect(await mark(second.token, [[id, done]])).toBe(1)
    })

    test("a mark after the lease ran out still settles the message if nobody claimed it since", async () => {
      const id = uuidv7()
      await harness().insert([{ id }])
      const { token } = await claim(1, SHORT)
      await harness().advance(SHORT)
      expect(await mark(token, [[id, done]])).toBe(1)
      expect((await row(id)).status).toBe("sent")
    })

    test("a batch marked all Done is sent in full, even after its lease was extended or partly taken over", async () => {
      const ids = [uuidv7(), uuidv7(), uuidv7()]
      await harness().insert(ids.map((id) => ({ id })))
      const plain = await claim(3)
      expect(
        await mark(
          plain.token,
          ids.map((id) => [id, done] as const),
        ),
      ).toBe(3)
      // The claim's token stays on a sent row: it names the relay process that published.
      for (const id of ids) expect(await row(id)).toMatchObject({ status: "sent", lockToken: plain.token })

      const more = [uuidv7(), uuidv7()]
      await harness().insert(more.map((id) => ({ id })))
      const extended = await claim(2)
      await harness().run(Effect.flatMap(OutboxStore, (s) => s.extend(extended.token, LONG_LEASE)))
      expect(
        await mark(
          extended.token,
          more.map((id) => [id, done] as const),
        ),
      ).toBe(2)
      for (const id of more) expect((await row(id)).status).toBe("sent")

      // One of the batch was claimed by another relay after the lease ran out: only the rest is marked.
      const last = [uuidv7(), uuidv7()]
      await harness().insert(last.map((id) => ({ id })))
      const expired = await claim(2, SHORT)
      await harness().advance(SHORT)
      const taker = await claim(1)
      const taken = taker.rows[0]!.id
      expect(
        await mark(
          expired.token,
          last.map((id) => [id, done] as const),
        ),
      ).toBe(1)
      expect(await row(taken)).toMatchObject({ status: "pending", lockToken: taker.token })
      expect((await row(last.find((id) => id !== taken)!)).status).toBe("sent")
    })

    test("mark Done records the message sent, published now, attempts unchanged, its claim's token kept", async () => {
      const id = uuidv7()
      await harness().insert([{ id }])
      const { token } = await claim(1)
      const before = await harness().now()
      expect(await mark(token, [[id, done]])).toBe(1)
      const after = await harness().now()
      const sent = await row(id)
      expect(sent).toMatchObject({ status: "sent", attempts: 0, lockToken: token, lastError: null })
      expect(sent.publishedAt).toBeGreaterThanOrEqual(before)
      expect(sent.publishedAt).toBeLessThanOrEqual(after)
    })

    test("mark Retry that spends an attempt: pending again after its delay, one attempt more, error kept", async () => {
      const id = uuidv7()
      await harness().insert([{ id }])
      const { token } = await claim(1)
      expect(await mark(token, [[id, retry(SHORT, "broker said no")]])).toBe(1)
      expect(await row(id)).toMatchObject({
        status: "pending",
        attempts: 1,
        lastError: "broker said no",
        lockToken: null,
      })
      expect((await claim(1)).rows).toEqual([])
      await harness().advance(SHORT)
      const again = await claim(1)
      expect(again.rows.map((m) => [m.id, m.attempts])).toEqual([[id, 1]])
    })

    test("mark Retry that spends no attempt (an outage) leaves the attempts as they were", async () => {
      const id = uuidv7()
      await harness().insert([{ id }])
      const { token } = await claim(1)
      expect(await mark(token, [[id, retry(SHORT, "broker away", false)]])).toBe(1)
      expect(await row(id)).toMatchObject({ status: "pending", attempts: 0, lastError: "broker away" })
    })

    test("mark Dead records the message dead, one attempt more, with its error, never claimed again", async () => {
      const id = uuidv7()
      await harness().insert([{ id }])
      const { token } = await claim(1)
      expect(await mark(token, [[id, dead("poison")]])).toBe(1)
      expect(await row(id)).toMatchObject({
        status: "dead",
        attempts: 1,
        lastError: "poison",
        lockToken: null,
      })
      await harness().advance(SHORT)
      expect((await claim(10)).rows).toEqual([])
    })

    test("mark Done keeps the error of an earlier failed attempt", async () => {
      const id = uuidv7()
      await harness().insert([{ id }])
      const first = await claim(1)
      await mark(first.token, [[id, retry(0, "first try failed")]])
      const second = await claim(1)
      await mark(second.token, [[id, done]])
      expect(await row(id)).toMatchObject({ status: "sent", attempts: 1, lastError: "first try failed" })
    })

    test("mark changes only the messages its token holds, and counts them", async () => {
      const [a, b] = [uuidv7(), uuidv7()]
      await harness().insert([
        { id: a, dueInMs: -2_000 },
        { id: b, dueInMs: -1_000 },
      ])
      const first = await claim(1)
      const second = await claim(1)
      expect(first.rows.map((m) => m.id)).toEqual([a])
      expect(
        await mark(first.token, [
          [a, done],
          [b, done],
          [uuidv7(), done],
        ]),
      ).toBe(1)
      expect(await row(b)).toMatchObject({ status: "pending", lockToken: second.token })
      expect(await mark(uuidv7(), [[b, done]])).toBe(0)
    })

    test("a message already settled is not marked again", async () => {
      const id = uuidv7()
      await harness().insert([{ id }])
      const { token } = await claim(1)
      expect(await mark(token, [[id, done]])).toBe(1)
      expect(await mark(token, [[id, dead("too late")]])).toBe(0)
      expect(await row(id)).toMatchObject({ status: "sent", lastError: null })
    })

    test("release hands the claim's messages back, due now, attempts unchanged", async () => {
      const ids = [uuidv7(), uuidv7()]
      await harness().insert(ids.map((id) => ({ id })))
      const first = await claim(10)
      const before = await harness().now()
      expect(await store((s) => s.release(first.token))).toBe(2)
      const after = await harness().now()
      for (const id of ids) {
        const released = await row(id)
        expect(released).toMatchObject({ status: "pending", attempts: 0, lockToken: null })
        expect(released.visibleAt).toBeGreaterThanOrEqual(before)
        expect(released.visibleAt).toBeLessThanOrEqual(after)
      }
      expect(sorted((await claim(10)).rows.map((m) => m.id))).toEqual(sorted(ids))
    })

    test("release leaves alone what the claim already settled", async () => {
      const [a, b] = [uuidv7(), uuidv7()]
      await harness().insert([{ id: a }, { id: b }])
      const { token } = await claim(10)
      await mark(token, [[a, done]])
      expect(await store((s) => s.release(token))).toBe(1)
      expect((await row(a)).status).toBe("sent")
    })

    test("lag is the seconds the oldest due message has waited", async () => {
      await harness().insert([
        { id: uuidv7(), dueInMs: -5_000 },
        { id: uuidv7(), dueInMs: -2_000 },
        { id: uuidv7(), dueInMs: 60_000 },
      ])
      const lag = await store((s) => s.lagSeconds)
      expect(lag).toBeGreaterThanOrEqual(5)
      expect(lag).toBeLessThan(6)
    })

    test("lag is 0 when nothing is due: none at all, only future messages, or all held by a claim", async () => {
      expect(await store((s) => s.lagSeconds)).toBe(0)
      await harness().insert([
        { id: uuidv7(), dueInMs: 60_000 },
        { id: uuidv7(), dueInMs: -5_000 },
      ])
      await claim(10)
      expect(await store((s) => s.lagSeconds)).toBe(0)
    })

    test("a housekeeping task is held by one holder at a time, renewed by it, taken over when its lease ran out", async () => {
      const hold = (holder: string, ttlMs: number) =>
        store((s) => (s.holdTask ? s.holdTask("outbox.lag", holder, ttlMs) : Effect.succeed(true)))
      expect(await hold("a", SHORT)).toBe(true)
      expect(await hold("b", SHORT)).toBe(false)
      // Renewed by its holder; another task is free.
      expect(await hold("a", SHORT)).toBe(true)
      expect(
        await store((s) => (s.holdTask ? s.holdTask("outbox.retention", "b", SHORT) : Effect.succeed(true))),
      ).toBe(true)
      await harness().advance(SHORT * 2)
      expect(await hold("b", SHORT)).toBe(true)
      expect(await hold("a", SHORT)).toBe(false)
    })

    test("purgeSent deletes messages sent before the cutoff, never pending or dead ones", async () => {
      const [old, recent, pending, deadId] = [uuidv7(), uuidv7(), uuidv7(), uuidv7()]
      await harness().insert([old, recent, pending, deadId].map((id) => ({ id, dueInMs: -10_000 })))
      const { token } = await claim(10)
      await mark(token, [
        [old, done],
        [deadId, dead("poison")],
      ])
      await harness().advance(SHORT)
      await mark(token, [[recent, done]])
      expect(await store((s) => s.purgeSent(SHORT / 2 / 1000, 100))).toBe(1)
      expect(sorted((await harness().rows()).map((r) => r.id))).toEqual(sorted([recent, pending, deadId]))
    })

    test("purgeSent goes on batch after batch until no old sent message is left", async () => {
      const ids = Array.from({ length: 5 }, () => uuidv7())
      await harness().insert(ids.map((id) => ({ id })))
      const { token } = await claim(10)
      await mark(
        token,
        ids.map((id) => [id, done] as const),
      )
      await harness().advance(SHORT)
      expect(await store((s) => s.purgeSent(SHORT / 2 / 1000, 2))).toBe(5)
      expect(await harness().rows()).toEqual([])
    })
  })
}

// ---------------------------------------------------------------------------------------------
// Inbox

/** A delivery for consumer `consumer` under dedupe key `key`. */
export const inboxRow = (
  key: string,
  consumer = "consumer-a",
  overrides: Partial<InboxRow> = {},
): InboxRow => ({
  key,
  consumer,
  type: "test.event",
  version: 1,
  payload: '{"n":1}',
  raw: null,
  headers: {},
  partitionKey: null,
  tenantId: null,
  attempts: 0,
  lastError: null,
  ...overrides,
})

export const inboxStoreContract = (name: string, setup: () => Promise<InboxHarness>): void => {
  describe(`${name}: InboxStore contract`, () => {
    const harness = withHarness(setup)
    const store = <A, E>(f: (s: InboxStoreShape) => Effect.Effect<A, E>) => harness().run(InboxStore.use(f))
    const consumer = "consumer-a"
    const claim = (limit: number, leaseMs = LONG_LEASE, who = consumer, onDead?: OrderedDeadPolicy) =>
      store((s) => s.claim(who, limit, leaseMs, onDead))
    const insertProcessed = (row: InboxRow) => store((s) => s.transaction((tx) => tx.insertProcessed(row)))
    const markProcessed = (key: string, token: string, attempts: number) =>
      store((s) => s.transaction((tx) => tx.markProcessed(consumer, key, token, attempts)))
    const mark = (token: string, key: string, verdict: Failure) =>
      store((s) => s.mark(consumer, token, [{ key, verdict }]))
    const row = async (key: string, who = consumer): Promise<InboxRowView> => {
      const found = (await harness().rows(who)).find((r) => r.key === key)
      if (found === undefined) throw new Error(`no inbox row ${who}/${key}`)
      return found
    }
    /** Stores `keys` as pending and claims them, in that order, under one token. */
    const claimed = async (keys: ReadonlyArray<string>, leaseMs = LONG_LEASE) => {
      await store((s) => s.insertPending(keys.map((k) => inboxRow(k))))
      return claim(keys.length, leaseMs)
    }

    test("insertProcessed stores the row processed; the same key again is a duplicate", async () => {
      const before = await harness().now()
      expect(await insertProcessed(inboxRow("m1"))).toBe(true)
      expect(await insertProcessed(inboxRow("m1"))).toBe(false)
      const rows = await harness().rows()
      expect(rows).toHaveLength(1)
      expect(rows[0]).toMatchObject({ key: "m1", consumer, status: "processed", attempts: 0 })
      expect(rows[0]?.processedAt).toBeGreaterThanOrEqual(before)
    })

    test("a key is deduped per consumer: another consumer's row with that key is its own", async () => {
      expect(await insertProcessed(inboxRow("m1", "consumer-a"))).toBe(true)
      expect(await insertProcessed(inboxRow("m1", "consumer-b"))).toBe(true)
      expect(await harness().rows()).toHaveLength(2)
    })

    test("a transaction whose work fails leaves no row, and the key can be inserted again", async () => {
      const error = await harness().run(
        Effect.flip(
          InboxStore.use((s) =>
            s.transaction((tx) =>
              Effect.andThen(tx.insertProcessed(inboxRow("m1")), Effect.fail("handler failed")),
            ),
          ),
        ),
      )
      expect(error).toBe("handler failed")
      expect(await harness().rows()).toEqual([])
      expect(await insertProcessed(inboxRow("m1"))).toBe(true)
    })

    test("an interrupted transaction leaves no row", async () => {
      const exit = await harness().run(
        Effect.exit(
          InboxStore.use((s) =>
            s.transaction((tx) => Effect.andThen(tx.insertProcessed(inboxRow("m1")), Effect.interrupt)),
          ),
        ),
      )
      expect(Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause)).toBe(true)
      expect(await harness().rows()).toEqual([])
    })

    /**
     * Transaction A inserts `key`, then waits for the gate before it ends as
     * `finish` says; transaction B inserts the same key meanwhile. Returns what
     * each insert answered.
     */
    const race = (finish: Effect.Effect<void, string>) =>
      harness().run(
        InboxStore.use((s) =>
          Effect.gen(function* () {
            const inserted = yield* Deferred.make<void>()
            const gate = yield* Deferred.make<void>()
            const a = yield* Effect.forkChild(
              // A's failure as its value, so the race reports both outcomes.
              Effect.catch(
                s.transaction((tx) =>
                  Effect.gen(function* () {
                    const won = yield* tx.insertProcessed(inboxRow("m1"))
                    yield* Deferred.succeed(inserted, undefined)
                    yield* Deferred.await(gate)
                    yield* finish
                    return won
                  }),
                ),
                (error) => Effect.succeed(error),
              ),
            )
            yield* Deferred.await(inserted)
            const b = yield* Effect.forkChild(s.transaction((tx) => tx.insertProcessed(inboxRow("m1"))))
            // Lets B reach its insert before A ends (enough in memory; against a database B may
            // still be on its way, and the outcome must be the same either way).
            for (let i = 0; i < 10; i++) yield* Effect.yieldNow
            yield* Deferred.succeed(gate, undefined)
            return { a: yield* Fiber.join(a), b: yield* Fiber.join(b) }
          }),
        ),
      )

    test("of two transactions inserting one key at once, only the one that commits wins", async () => {
      const { a, b } = await race(Effect.void)
      expect(a).toBe(true)
      expect(b).toBe(false)
      expect(await harness().rows()).toHaveLength(1)
    })

    test("when the transaction holding a key rolls back, the other insert of that key wins", async () => {
      const { a, b } = await race(Effect.fail("handler failed"))
      expect(a).toBe("handler failed")
      expect(b).toBe(true)
      expect(await harness().rows()).toEqual([expect.objectContaining({ key: "m1", status: "processed" })])
    })

    test("insertPending stores new rows as pending and counts them; keys already there are left alone", async () => {
      await insertProcessed(inboxRow("m1"))
      const stored = await store((s) => s.insertPending([inboxRow("m1"), inboxRow("m2"), inboxRow("m3")]))
      expect(stored).toBe(2)
      expect((await row("m1")).status).toBe("processed")
      expect(await row("m2")).toMatchObject({ status: "pending", attempts: 0, lockToken: null })
    })

    test("insertPending stores a key given twice in one batch once", async () => {
      expect(await store((s) => s.insertPending([inboxRow("m1"), inboxRow("m1")]))).toBe(1)
      expect(await harness().rows()).toHaveLength(1)
    })

    test("insertProcessedAll stores the new rows processed and answers per row, in order, which were duplicates", async () => {
      const before = await harness().now()
      expect(await insertProcessed(inboxRow("m2"))).toBe(true)
      const fresh = await store((s) =>
        s.transaction((tx) =>
          tx.insertProcessedAll([
            inboxRow("m1"),
            inboxRow("m2"),
            inboxRow("m3", consumer, { attempts: 2 }),
            inboxRow("m1"),
          ]),
        ),
      )
      expect(fresh).toEqual([true, false, true, false])
      const rows = [...(await harness().rows())].sort((a, b) => a.key.localeCompare(b.key))
      expect(rows.map((r) => [r.key, r.status, r.attempts])).toEqual([
        ["m1", "processed", 0],
        ["m2", "processed", 0],
        ["m3", "processed", 2],
      ])
      for (const r of rows) expect(r.processedAt).toBeGreaterThanOrEqual(before)
    })

    test("insertProcessedAll in a transaction that fails leaves no row", async () => {
      const error = await harness().run(
        Effect.flip(
          InboxStore.use((s) =>
            s.transaction((tx) =>
              Effect.andThen(
                tx.insertProcessedAll([inboxRow("m1"), inboxRow("m2")]),
                Effect.fail("handler failed"),
              ),
            ),
          ),
        ),
      )
      expect(error).toBe("handler failed")
      expect(await harness().rows()).toEqual([])
    })

    // Ordered rows: the claim's per-key gate and the cursor markProcessed moves.
    const EPOCH = 1_795_000_000_000
    const ordered = (key: string, partitionKey: string, seq: number, epoch = EPOCH) =>
      inboxRow(key, consumer, { partitionKey, position: { epoch, seq } })

    test("markProcessedAll marks the rows the token holds, answers per row, and moves each ordered key's cursor", async () => {
      await store((s) =>
        s.insertPending([ordered("a1", "A", 1), ordered("a2", "A", 2), ordered("b1", "B", 1), inboxRow("u")]),
      )
      const first = await claimKeys()
      expect(first.keys).toEqual(["a1", "b1", "u"])
      const markAll = (token: string, rows: ReadonlyArray<{ key: string; attempts: number }>) =>
        store((s) => s.transaction((tx) => tx.markProcessedAll(consumer, token, rows)))
      // A token that holds nothing marks nothing.
      expect(await markAll("0190a000-0000-7000-8000-000000000000", [{ key: "a1", attempts: 1 }])).toEqual([
        false,
      ])
      expect(
        await markAll(first.token, [
          { key: "a1", attempts: 1 },
          { key: "u", attempts: 3 },
          { key: "a2", attempts: 1 },
          { key: "b1", attempts: 2 },
        ]),
      ).toEqual([true, true, false, true])
      expect(await row("a1")).toMatchObject({ status: "processed", attempts: 1, lockToken: null })
      expect(await row("u")).toMatchObject({ status: "processed", attempts: 3 })
      expect(await row("b1")).toMatchObject({ status: "processed", attempts: 2 })
      expect((await row("a2")).status).toBe("pending")
      // A's cursor moved past a1, so a2 is next; B's past b1.
      await store((s) => s.insertPending([ordered("b2", "B", 2)]))
      await processNext(["a2", "b2"])
    })
    const claimKeys = async (limit = 10) => {
      const { token, rows } = await claim(limit)
      return { token, keys: sorted(rows.map((r) => r.key)) }
    }
    /** Claims, expects exactly `keys`, marks them processed. */
    const processNext = async (keys: ReadonlyArray<string>) => {
      const next = await claimKeys()
      expect(next.keys).toEqual(sorted(keys))
      for (const key of keys) expect(await markProcessed(key, next.token, 1)).toBe(true)
    }

    /** Keys A (1–3) and B (1–2) stored out of order, an unordered row among them, and `extra`. */
    const storeShuffled = (extra: ReadonlyArray<InboxRow> = []) =>
      store((s) =>
        s.insertPending([
          ordered("a3", "A", 3),
          ordered("b2", "B", 2),
          ordered("a1", "A", 1),
          inboxRow("u"),
          ordered("b1", "B", 1),
          ordered("a2", "A", 2),
          ...extra,
        ]),
      )

    test("ordered rows are claimed one per key, in number order, whatever order they were stored in", async () => {
      await storeShuffled()
      await processNext(["a1", "b1", "u"])
      await processNext(["a2", "b2"])
      await processNext(["a3"])
      expect(await claimKeys()).toMatchObject({ keys: [] })
    })

    const claimChains = async (limit = 10) => {
      const { token, rows } = await store((s) => s.claim(consumer, limit, LONG_LEASE, "block", true))
      return { token, keys: rows.map((r) => r.key) }
    }

    test("a claim with chains takes each key's backlog behind its head, in the order it must run", async () => {
      // a5 waits for #4, which is missing: never taken behind a3.
      await storeShuffled([ordered("a5", "A", 5)])
      const { token, keys } = await claimChains()
      expect(sorted(keys)).toEqual(["a1", "a2", "a3", "b1", "b2", "u"])
      const position = (key: string) => keys.indexOf(key)
      expect(position("a1")).toBeLessThan(position("a2"))
      expect(position("a2")).toBeLessThan(position("a3"))
      expect(position("b1")).toBeLessThan(position("b2"))
      for (const key of ["a1", "a2", "a3"]) expect(await markProcessed(key, token, 1)).toBe(true)
      expect(await claimChains()).toMatchObject({ keys: [] })
    })

    test("a claim with chains takes up to CHAINED_PER_CLAIM × its limit, each row after its predecessor", async () => {
      const n = 2 * CHAINED_PER_CLAIM + 5
      await store((s) =>
        s.insertPending(Array.from({ length: n }, (_, i) => ordered(`a${i + 1}`, "A", i + 1))),
      )
      const keys = (await claimChains(2)).keys
      expect(keys).toEqual(Array.from({ length: 2 * CHAINED_PER_CLAIM }, (_, i) => `a${i + 1}`))
    })

    test("a claim with chains does not take a row whose predecessor another claim holds", async () => {
      await store((s) => s.insertPending([ordered("a1", "A", 1), ordered("a2", "A", 2)]))
      const first = await claimKeys(1)
      expect(first.keys).toEqual(["a1"])
      // a1 is held; a2 waits for it: not claimable, chained or not.
      expect(await claimChains()).toMatchObject({ keys: [] })
      expect(await markProcessed("a1", first.token, 1)).toBe(true)
      expect((await claimChains()).keys).toEqual(["a2"])
    })

    test("the claim hands back an ordered row's position", async () => {
      await store((s) => s.insertPending([ordered("a1", "A", 1)]))
      const { rows } = await claim(10)
      expect(rows[0]).toMatchObject({ partitionKey: "A", position: { epoch: EPOCH, seq: 1 } })
    })

    test("an ordered row whose key is taken at another place is stored as a stand-in that holds its place; a redelivery stores nothing", async () => {
      // "p" is a business key (a dedupeKey): seq 2 is the event, seq 3 its resend, seq 4 what follows.
      expect(await store((s) => s.insertPending([ordered("a1", "A", 1), ordered("p", "A", 2)]))).toBe(2)
      // The resend, twice (a redelivery), and the original again: one stand-in, nothing else.
      expect(await store((s) => s.insertPending([ordered("p", "A", 3), ordered("p", "A", 3)]))).toBe(1)
      expect(await store((s) => s.insertPending([ordered("p", "A", 2), ordered("p", "A", 3)]))).toBe(0)
      await store((s) => s.insertPending([ordered("a4", "A", 4)]))
      await processNext(["a1"])
      await processNext(["p"])
      const { rows } = await claim(10)
      expect(rows.map((r) => [r.key, r.standsInFor, r.position?.seq])).toEqual([
        ["p@1795000000000.3", "p", 3],
      ])
    })

    test("a key given twice in one insert at two places keeps both places", async () => {
      expect(await store((s) => s.insertPending([ordered("p", "A", 1), ordered("p", "A", 2)]))).toBe(2)
      const { rows } = await claim(10)
      expect(rows.map((r) => [r.key, r.standsInFor ?? null])).toEqual([["p", null]])
    })

    test("a row waits for what its `after` names, not for the number before it", async () => {
      const after = (key: string, partitionKey: string, seq: number, waitsFor: number) =>
        inboxRow(key, consumer, { partitionKey, position: { epoch: EPOCH, seq, after: waitsFor } })
      // A consumer of some types: its numbers 2 and 5; 5 waits for 2, 2 for nothing it receives.
      await store((s) => s.insertPending([after("a5", "A", 5, 2), after("a2", "A", 2, 0)]))
      await processNext(["a2"])
      await processNext(["a5"])
      // A key that has a cursor: 9 waits for 7, which is not handled yet.
      await store((s) => s.insertPending([after("a9", "A", 9, 7)]))
      expect(await claimKeys()).toMatchObject({ keys: [] })
      await store((s) => s.insertPending([after("a7", "A", 7, 5)]))
      await processNext(["a7"])
      await processNext(["a9"])
      const { rows } = await claim(10)
      expect(rows).toEqual([])
    })

    test("a missing predecessor is waited for, never guessed past", async () => {
      await store((s) => s.insertPending([ordered("a2", "A", 2), ordered("a3", "A", 3)]))
      expect(await claimKeys()).toMatchObject({ keys: [] })
      await store((s) => s.insertPending([ordered("a1", "A", 1)]))
      await processNext(["a1"])
      await processNext(["a2"])
    })

    test("a failing row holds back its key only; dead, it keeps holding it", async () => {
      await store((s) =>
        s.insertPending([
          ordered("a1", "A", 1),
          ordered("a2", "A", 2),
          ordered("b1", "B", 1),
          ordered("b2", "B", 2),
        ]),
      )
      const first = await claimKeys()
      expect(first.keys).toEqual(["a1", "b1"])
      expect(await mark(first.token, "a1", retry(0, "try later"))).toBe(1)
      expect(await markProcessed("b1", first.token, 1)).toBe(true)
      // a1 comes back (it is due again); a2 still waits behind it; B moves on.
      const second = await claimKeys()
      expect(second.keys).toEqual(["a1", "b2"])
      expect(await mark(second.token, "a1", dead("poison"))).toBe(1)
      expect(await markProcessed("b2", second.token, 1)).toBe(true)
      expect(await claimKeys()).toMatchObject({ keys: [] })
      expect((await row("a2")).status).toBe("pending")
    })

    test('under onOrderedDead "skip" a dead row lets its key go on; a missing one still holds it', async () => {
      const claimSkipping = async () => {
        const { token, rows } = await claim(10, LONG_LEASE, consumer, "skip")
        return { token, keys: sorted(rows.map((r) => r.key)) }
      }
      await store((s) =>
        s.insertPending([
          ordered("a1", "A", 1),
          ordered("a2", "A", 2),
          ordered("a3", "A", 3),
          ordered("a5", "A", 5),
        ]),
      )
      const first = await claimSkipping()
      expect(first.keys).toEqual(["a1"])
      expect(await mark(first.token, "a1", dead("poison"))).toBe(1)
      // "block" (the default) still holds the key behind the dead row (and may set a2 aside) ...
      expect(await claimKeys()).toMatchObject({ keys: [] })
      // ... "skip" passes it, once what was set aside is looked at again (the inbox does every few
      // seconds): a2 runs, then a3; a5 waits for the missing a4.
      await store((s) => s.sweep(consumer, { onDead: "skip", waitedMs: 0 }))
      const second = await claimSkipping()
      expect(second.keys).toEqual(["a2"])
      expect(await markProcessed("a2", second.token, 1)).toBe(true)
      const third = await claimSkipping()
      expect(third.keys).toEqual(["a3"])
      expect(await mark(third.token, "a3", dead("poison too"))).toBe(1)
      expect(await claimSkipping()).toMatchObject({ keys: [] })
      // A dead row stored ahead of its turn (undecodable on arrival) is passed as well.
      await store((s) => s.insertDead([ordered("a4", "A", 4)]))
      await store((s) => s.sweep(consumer, { onDead: "skip", waitedMs: 0 }))
      expect(await claimSkipping()).toMatchObject({ keys: ["a5"] })
      expect((await row("a1")).status).toBe("dead")
    })

    test("a sweep sets aside the rows of a key that cannot move; they come back when it can", async () => {
      await store((s) =>
        s.insertPending([
          ordered("a2", "A", 2),
          ordered("a3", "A", 3),
          ordered("b1", "B", 1),
          ordered("b2", "B", 2),
        ]),
      )
      // A waits for a1: set aside. B's head runs: its backlog (b2) stays where it is.
      expect(await store((s) => s.sweep(consumer, { waitedMs: 0 }))).toBe(0)
      await processNext(["b1"])
      await processNext(["b2"])
      // a1 arrives; its mark brings a2 back, a2's brings a3 (not the next sweep).
      await store((s) => s.insertPending([ordered("a1", "A", 1)]))
      await processNext(["a1"])
      await processNext(["a2"])
      await processNext(["a3"])
      // A key held by a dead head: set aside; skipped past by an operator, the next sweep brings
      // its rows back.
      await store((s) => s.insertPending([ordered("a5", "A", 5)]))
      expect(await store((s) => s.sweep(consumer, { waitedMs: 0 }))).toBe(0)
      expect((await claimKeys()).keys).toEqual([])
      await store((s) => s.insertPending([ordered("a4", "A", 4)]))
      const head = await claimKeys()
      expect(head.keys).toEqual(["a4"])
      expect(await mark(head.token, "a4", dead("poison"))).toBe(1)
      expect(await store((s) => s.sweep(consumer, { waitedMs: 0 }))).toBe(0)
      expect(await store((s) => s.sweep(consumer, { onDead: "skip", waitedMs: 0 }))).toBeGreaterThanOrEqual(0)
      expect((await claim(10, LONG_LEASE, consumer, "skip")).rows.map((r) => r.key)).toEqual(["a5"])
    })

    test("a newer epoch starts at 1; its later numbers wait for it", async () => {
      await store((s) => s.insertPending([ordered("a1", "A", 1)]))
      await processNext(["a1"])
      const later = EPOCH + 60_000
      await store((s) => s.insertPending([ordered("n2", "A", 2, later), ordered("n1", "A", 1, later)]))
      await processNext(["n1"])
      await processNext(["n2"])
    })

    test("cursors are per consumer: the same key of another consumer has its own turn", async () => {
      await store((s) =>
        s.insertPending([
          ordered("a1", "A", 1),
          inboxRow("x1", "consumer-b", { partitionKey: "A", position: { epoch: EPOCH, seq: 1 } }),
        ]),
      )
      await processNext(["a1"])
      const other = await claim(10, LONG_LEASE, "consumer-b")
      expect(other.rows.map((r) => r.key)).toEqual(["x1"])
    })

    test("insertDead records rows dead with their error and body, ignoring keys already there", async () => {
      await store((s) => s.insertPending([inboxRow("m1")]))
      const stored = await store((s) =>
        s.insertDead([
          inboxRow("m1", consumer, { lastError: "late" }),
          inboxRow("m2", consumer, { payload: null, raw: "not json", lastError: "undecodable" }),
        ]),
      )
      expect(stored).toBe(1)
      expect(await row("m1")).toMatchObject({ status: "pending", lastError: null })
      expect(await row("m2")).toMatchObject({ status: "dead", lastError: "undecodable", raw: "not json" })
      expect((await claim(10)).rows.map((r) => r.key)).toEqual(["m1"])
    })

    test("claim takes only its consumer's due rows, oldest first, up to the limit", async () => {
      await store((s) => s.insertPending([inboxRow("m1")]))
      await harness().advance(10)
      await store((s) => s.insertPending([inboxRow("m2"), inboxRow("m1", "consumer-b")]))
      expect((await claim(1)).rows.map((r) => r.key)).toEqual(["m1"])
      expect((await claim(10)).rows.map((r) => r.key)).toEqual(["m2"])
      const other = await claim(10, LONG_LEASE, "consumer-b")
      expect(other.rows.map((r) => [r.consumer, r.key])).toEqual([["consumer-b", "m1"]])
    })

    test("claim hands over the row as stored", async () => {
      const [first] = (await claimed(["m1"])).rows
      expect(first).toMatchObject({ key: "m1", consumer, type: "test.event", version: 1, attempts: 0 })
      expect(JSON.parse(first?.payload ?? "null")).toEqual({ n: 1 })
    })

    test("claim skips rows another claim holds", async () => {
      const first = await claimed(["m1", "m2"])
      expect(first.rows).toHaveLength(2)
      expect((await claim(10)).rows).toEqual([])
      expect((await row("m1")).lockToken).toBe(first.token)
    })

    test("extend keeps the claim's rows for another lease from now; a token that lost them extends nothing", async () => {
      const first = await claimed(["m1"], SHORT)
      await harness().advance(SHORT / 2)
      const extend = (token: string) =>
        harness().run(Effect.flatMap(InboxStore, (s) => s.extend(consumer, token, SHORT)))
      expect(await extend(first.token)).toBe(1)
      await harness().advance(SHORT / 2 + 100)
      expect((await claim(10)).rows).toEqual([])
      await harness().advance(SHORT)
      const second = await claim(10)
      expect(second.rows.map((r) => r.key)).toEqual(["m1"])
      expect(await extend(first.token)).toBe(0)
    })

    test("an expired lease makes the row claimable again, and the old token's mark then changes nothing", async () => {
      const first = await claimed(["m1"], SHORT)
      await harness().advance(SHORT)
      const second = await claim(10)
      expect(second.rows.map((r) => r.key)).toEqual(["m1"])
      expect(second.token).not.toBe(first.token)
      expect(await mark(first.token, "m1", dead("stale"))).toBe(0)
      expect(await row("m1")).toMatchObject({ status: "pending", lockToken: second.token })
    })

    test("mark Retry that spends an attempt: pending again after its delay, one attempt more, error kept", async () => {
      const { token } = await claimed(["m1"])
      expect(await mark(token, "m1", retry(SHORT, "handler failed"))).toBe(1)
      expect(await row("m1")).toMatchObject({
        status: "pending",
        attempts: 1,
        lastError: "handler failed",
        lockToken: null,
      })
      expect((await claim(10)).rows).toEqual([])
      await harness().advance(SHORT)
      expect((await claim(10)).rows.map((r) => [r.key, r.attempts, r.lastError])).toEqual([
        ["m1", 1, "handler failed"],
      ])
    })

    test("mark Retry that spends no attempt leaves the attempts as they were", async () => {
      const { token } = await claimed(["m1"])
      expect(await mark(token, "m1", retry(SHORT, "database away", false))).toBe(1)
      expect(await row("m1")).toMatchObject({ status: "pending", attempts: 0, lastError: "database away" })
    })

    test("mark Dead records the row dead, one attempt more, with its error", async () => {
      const { token } = await claimed(["m1"])
      expect(await mark(token, "m1", dead("poison"))).toBe(1)
      expect(await row("m1")).toMatchObject({
        status: "dead",
        attempts: 1,
        lastError: "poison",
        lockToken: null,
      })
    })

    test("mark names its consumer: another consumer's row with that key is not touched", async () => {
      await store((s) => s.insertPending([inboxRow("m1", "consumer-b")]))
      const { token } = await claim(10, LONG_LEASE, "consumer-b")
      expect(await mark(token, "m1", dead("poison"))).toBe(0)
      expect((await row("m1", "consumer-b")).status).toBe("pending")
    })

    test("markProcessed settles a claimed row in the transaction, with the attempts given", async () => {
      const { token } = await claimed(["m1"])
      const before = await harness().now()
      expect(await markProcessed("m1", token, 3)).toBe(true)
      const processed = await row("m1")
      expect(processed).toMatchObject({ status: "processed", attempts: 3, lockToken: null })
      expect(processed.processedAt).toBeGreaterThanOrEqual(before)
      expect((await claim(10)).rows).toEqual([])
    })

    test("markProcessed with a token that no longer holds the row answers false and changes nothing", async () => {
      const first = await claimed(["m1"], SHORT)
      await harness().advance(SHORT)
      const second = await claim(10)
      expect(await markProcessed("m1", first.token, 1)).toBe(false)
      expect(await row("m1")).toMatchObject({ status: "pending", lockToken: second.token })
    })

    test("markProcessed in a transaction that fails leaves the row pending under its claim", async () => {
      const { token } = await claimed(["m1"])
      const error = await harness().run(
        Effect.flip(
          InboxStore.use((s) =>
            s.transaction((tx) =>
              Effect.andThen(tx.markProcessed(consumer, "m1", token, 1), Effect.fail("handler failed")),
            ),
          ),
        ),
      )
      expect(error).toBe("handler failed")
      expect(await row("m1")).toMatchObject({ status: "pending", attempts: 0, lockToken: token })
    })
  })
}
