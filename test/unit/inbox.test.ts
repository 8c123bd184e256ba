// The inbox's consumer paths and processor over the memory store and the memory broker, on a
// TestClock: broker retry delays, processor backoff and polls are clock adjustments.
import { describe, expect, test } from "bun:test"
import { Effect, Exit, Layer, Scope } from "effect"
import { TestClock } from "effect/testing"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import { uuidv7 } from "../../src/core/uuid.ts"
import * as Inbox from "../../src/Inbox.ts"
import type { InboxStoreShape } from "../../src/ports/InboxStore.ts"
import { Transport } from "../../src/ports/Transport.ts"
import * as MemoryInboxStore from "../../src/storage/memory/MemoryInboxStore.ts"
import * as MemoryTransport from "../../src/transport/memory/MemoryTransport.ts"

const Note = defineEvent({ type: "test.note", version: 1, schema: v.object({ n: v.number() }) })
const retry = { initialDelay: 1000, factor: 2, maxDelay: 60_000, maxAttempts: 3, jitter: false }

const settle = Effect.gen(function* () {
  for (let i = 0; i < 50; i++) yield* Effect.yieldNow
})

/** Moves the clock in steps, letting every fiber run between them. */
const elapse = (ms: number, step = 250) =>
  Effect.gen(function* () {
    for (let t = 0; t < ms; t += step) {
      yield* TestClock.adjust(Math.min(step, ms - t))
      yield* settle
    }
  })

const run = <A, E>(body: Effect.Effect<A, E, Scope.Scope>) =>
  Effect.runPromise(body.pipe(Effect.scoped, Effect.provide(TestClock.layer())))

interface Seen {
  readonly n: number
  readonly attempt: number
}

/** An inbox over fresh memory parts; `behaviour` decides what the handler does on each run. */
const startInbox = (
  behaviour: (seen: Seen) => Effect.Effect<void, unknown>,
  config: Partial<Inbox.InboxConfig> = {},
  /** Changes the store the inbox sees (a fault injected); `store` stays the real one. */
  wrap: (store: InboxStoreShape) => InboxStoreShape = (store) => store,
) =>
  Effect.gen(function* () {
    const store = yield* MemoryInboxStore.make()
    const broker = MemoryTransport.makeBroker()
    const runs: Seen[] = []
    const handler = Inbox.handler(Note, ({ payload, envelope }) =>
      Effect.suspend(() => {
        const seen = { n: payload.n, attempt: envelope.attempt }
        runs.push(seen)
        return behaviour(seen)
      }),
    )
    const scope = yield* Scope.make()
    const handle = yield* Inbox.make({ consumer: "c", handlers: [handler], retry, ...config }).pipe(
      Scope.provide(scope),
      Effect.provide(
        Layer.merge(
          MemoryInboxStore.layer({ ...store, store: wrap(store.store) }),
          Layer.succeed(Transport, broker.transport),
        ),
      ),
    )
    const publish = (n: number, id = uuidv7()) =>
      broker.transport
        .publish([
          {
            id,
            type: Note.type,
            version: 1,
            routingKey: Note.type,
            body: JSON.stringify({ n }),
            headers: {},
            occurredAt: new Date(0),
            partitionKey: null,
            tenantId: null,
          },
        ])
        .pipe(Effect.andThen(settle), Effect.as(id))
    return { store, broker, runs, handle, publish, stop: Scope.close(scope, Exit.void) }
  })

const ok = () => Effect.void
const fail = () => Effect.fail(new Error("handler failed"))

describe("idempotent inbox", () => {
  test("a message is handled once; the same message delivered again is acked without running the handler", () =>
    run(
      Effect.gen(function* () {
        const inbox = yield* startInbox(ok)
        const id = yield* inbox.publish(1)
        yield* inbox.publish(1, id)
        expect(inbox.runs).toEqual([{ n: 1, attempt: 1 }])
        expect(inbox.store.rows("c").map((r) => [r.key, r.status, r.attempts])).toEqual([
          [id, "processed", 1],
        ])
        expect(yield* inbox.handle.stats).toMatchObject({ processed: 1, duplicates: 1 })
      }),
    ))

  test("a handler that keeps failing runs exactly maxAttempts times, 1 s and 2 s apart, then its message is dead", () =>
    run(
      Effect.gen(function* () {
        const inbox = yield* startInbox(fail)
        yield* inbox.publish(7)
        expect(inbox.runs.map((r) => r.attempt)).toEqual([1])
        yield* elapse(999, 333)
        expect(inbox.runs.length).toBe(1)
        yield* elapse(1)
        expect(inbox.runs.map((r) => r.attempt)).toEqual([1, 2])
        yield* elapse(2000)
        expect(inbox.runs.map((r) => r.attempt)).toEqual([1, 2, 3])
        yield* elapse(60_000, 5000)
        expect(inbox.runs.length).toBe(3)
        const [row] = inbox.store.rows("c")
        expect(row).toMatchObject({ status: "dead", attempts: 3 })
        expect(row?.lastError).toContain("handler failed (after 3 attempts)")
      }),
    ))

  test("a handler's Effect.tryPromise without a catch records what was thrown, not only the wrapper's words", () =>
    run(
      Effect.gen(function* () {
        const inbox = yield* startInbox(() =>
          Effect.tryPromise(() => Promise.reject(new Error("the downstream said no"))),
        )
        yield* inbox.publish(3)
        yield* elapse(60_000, 5000)
        const [row] = inbox.store.rows("c")
        expect(row?.status).toBe("dead")
        expect(row?.lastError).toContain("the downstream said no")
      }),
    ))

  test("a database outage spends no attempt: the delivery comes back and is handled as attempt 1", () =>
    run(
      Effect.gen(function* () {
        const inbox = yield* startInbox(ok)
        inbox.store.setDown(true)
        yield* inbox.publish(3)
        yield* elapse(20_000, 1000)
        expect(inbox.runs).toEqual([])
        inbox.store.setDown(false)
        yield* elapse(5000)
        expect(inbox.runs).toEqual([{ n: 3, attempt: 1 }])
        expect(inbox.store.rows("c").map((r) => [r.status, r.attempts])).toEqual([["processed", 1]])
      }),
    ))

  test("an undecodable message is recorded dead at once with its body, and the handler never runs", () =>
    run(
      Effect.gen(function* () {
        const inbox = yield* startInbox(ok)
        yield* inbox.broker.transport.publish([
          {
            id: uuidv7(),
            type: Note.type,
            version: 1,
            routingKey: Note.type,
            body: '{"n":"not a number"}',
            headers: {},
            occurredAt: new Date(0),
            partitionKey: null,
            tenantId: null,
          },
        ])
        yield* settle
        expect(inbox.runs).toEqual([])
        const [row] = inbox.store.rows("c")
        expect(row).toMatchObject({ status: "dead", raw: '{"n":"not a number"}' })
      }),
    ))

  test("a redriven row (pending in the store) is picked up by the processor in idempotent mode too", () =>
    run(
      Effect.gen(function* () {
        const inbox = yield* startInbox(ok, { pollInterval: "1 second" })
        yield* inbox.store.store.insertPending([
          {
            key: uuidv7(),
            consumer: "c",
            type: Note.type,
            version: 1,
            payload: '{"n":9}',
            raw: null,
            headers: {},
            partitionKey: null,
            tenantId: null,
            attempts: 0,
            lastError: "earlier failure",
          },
        ])
        yield* elapse(1000)
        expect(inbox.runs).toEqual([{ n: 9, attempt: 1 }])
        expect(inbox.store.rows("c")[0]).toMatchObject({ status: "processed", attempts: 1 })
      }),
    ))
})

describe("store-then-process inbox", () => {
  const mode = { mode: "store-then-process", pollInterval: "1 second" } as const

  test("a stored delivery is handled once by the processor, as attempt 1", () =>
    run(
      Effect.gen(function* () {
        const inbox = yield* startInbox(ok, mode)
        const id = yield* inbox.publish(5)
        yield* inbox.publish(5, id)
        yield* elapse(1000)
        expect(inbox.runs).toEqual([{ n: 5, attempt: 1 }])
        expect(inbox.store.rows("c").map((r) => [r.status, r.attempts])).toEqual([["processed", 1]])
      }),
    ))

  test("a handler that keeps failing runs exactly maxAttempts times on the backoff, then its row is dead", () =>
    run(
      Effect.gen(function* () {
        const inbox = yield* startInbox(fail, mode)
        yield* inbox.publish(8)
        yield* elapse(60_000, 500)
        expect(inbox.runs.map((r) => r.attempt)).toEqual([1, 2, 3])
        const [row] = inbox.store.rows("c")
        expect(row).toMatchObject({ status: "dead", attempts: 3 })
        expect(row?.lastError).toContain("(after 3 attempts)")
      }),
    ))

  test("a handler that fails once runs few of its batch again: rows share transactions of 16 at most, fewer after a failure", () =>
    run(
      Effect.gen(function* () {
        // The processor claims nothing until all 40 are stored, then all 40 at once, one lane.
        let open = false
        const inbox = yield* startInbox(
          (seen) => (seen.n === 21 && seen.attempt === 1 ? Effect.fail(new Error("flaky")) : Effect.void),
          { ...mode, batchSize: 40, processorConcurrency: 1 },
          (store) => ({
            ...store,
            claim: (...args) => (open ? store.claim(...args) : Effect.succeed({ token: uuidv7(), rows: [] })),
          }),
        )
        for (let n = 1; n <= 40; n++) yield* inbox.publish(n)
        open = true
        yield* elapse(5_000)
        expect(inbox.store.rows("c").filter((r) => r.status === "processed").length).toBe(40)
        // Rows 17–32 shared a transaction that #21 failed: 17–20 ran again (one transaction of
        // 40 ran 1–20 again). After the failure, transactions of 8: #21's retry runs alone later.
        const again = inbox.runs.filter((r) => r.attempt === 1).length - 40
        expect(again).toBeLessThanOrEqual(4)
        expect(inbox.runs.filter((r) => r.n === 21).map((r) => r.attempt)).toEqual([1, 2])
      }),
    ))

  test("the processor outlives a database outage, spends no attempt on it, and health says it is stalled meanwhile", () =>
    run(
      Effect.gen(function* () {
        const inbox = yield* startInbox(ok, mode)
        yield* inbox.publish(4)
        inbox.store.setDown(true)
        yield* elapse(30_000, 1000)
        const during = yield* inbox.handle.health
        expect(during.processorRunning).toBe(false)
        expect(during.ready).toBe(false)
        expect(during.lastError).toContain("down")
        inbox.store.setDown(false)
        yield* elapse(15_000, 1000)
        expect(inbox.runs).toEqual([{ n: 4, attempt: 1 }])
        expect((yield* inbox.handle.health).ready).toBe(true)
      }),
    ))
})

describe("inbox config", () => {
  const handlers = [Inbox.handler(Note, () => Effect.void)]
  const bad: ReadonlyArray<[string, Partial<Inbox.InboxConfig>]> = [
    ["inbox consumer", { consumer: "has space" }],
    ["inbox handlers", { handlers: [] }],
    ["inbox mode", { mode: "fast" as never }],
    ["inbox prefetch", { prefetch: 0 }],
    ["inbox batchSize", { batchSize: 1e9 }],
    ["inbox processorConcurrency", { processorConcurrency: -1 }],
    ["inbox lease", { lease: "soon" as never }],
    ["inbox pollInterval", { pollInterval: "often" as never }],
    ["inbox onOrderedDead", { onOrderedDead: "drop" as never }],
    ["inbox retry.maxAttempts", { retry: { maxAttempts: 1.5 } }],
    ["inbox retry.initialDelay", { retry: { initialDelay: "soon" as never } }],
    ["inbox handlers[0]", { handlers: [{}] as never }],
    ["inbox handlers[1]", { handlers: [...handlers, null] as never }],
    [
      "inbox handlers[0].contract",
      { handlers: [{ contract: { type: "x" }, handle: () => Effect.void }] as never },
    ],
    ["inbox handlers[1].handle", { handlers: [...handlers, { contract: Note, handle: "run" }] as never }],
    ["inbox handlers[0].dedupeKey", { handlers: [{ ...handlers[0]!, dedupeKey: "id" }] as never }],
    ["inbox afterCommit", { afterCommit: "log" as never }],
    ["inbox retention.olderThan", { retention: { olderThan: "a while" as never } }],
    ["inbox retention.olderThan", { retention: { olderThan: 0 } }],
  ]
  for (const [field, config] of bad) {
    test(`a bad ${field} is a ConfigError naming it`, async () => {
      const exit = await Effect.runPromiseExit(Inbox.resolveConfig({ consumer: "c", handlers, ...config }))
      const reason = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
      const failure = reason?._tag === "Fail" ? reason.error : undefined
      expect(failure?._tag).toBe("ConfigError")
      expect(failure?.message).toContain(field)
    })
  }

  test("Inbox.make with a non-handler in handlers fails with a ConfigError, not a defect", async () => {
    const exit = await Effect.runPromiseExit(
      Inbox.make({ consumer: "c", handlers: [{}] as never }).pipe(
        Effect.provide(
          Layer.merge(
            MemoryInboxStore.layer(),
            Layer.succeed(Transport, MemoryTransport.makeBroker().transport),
          ),
        ),
        Effect.scoped,
      ),
    )
    const reason = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
    expect(reason?._tag).toBe("Fail")
    const failure = reason?._tag === "Fail" ? reason.error : undefined
    expect(failure?._tag).toBe("ConfigError")
    expect(failure?.message).toContain("inbox handlers[0]")
  })
})

describe("dedupe keys", () => {
  const Placed = defineEvent({ type: "orders.placed", version: 1, schema: v.object({ orderId: v.string() }) })
  const Paid = defineEvent({ type: "orders.paid", version: 1, schema: v.object({ orderId: v.string() }) })

  test("two handlers of one consumer keyed by the same business id both run: keys are scoped by type", () =>
    run(
      Effect.gen(function* () {
        const store = yield* MemoryInboxStore.make()
        const broker = MemoryTransport.makeBroker()
        const ran: string[] = []
        const byOrder = (p: { orderId: string }) => p.orderId
        yield* Inbox.make({
          consumer: "c",
          handlers: [
            Inbox.handler(Placed, () => Effect.sync(() => ran.push("placed")), { dedupeKey: byOrder }),
            Inbox.handler(Paid, () => Effect.sync(() => ran.push("paid")), { dedupeKey: byOrder }),
          ],
        }).pipe(
          Effect.provide(
            Layer.merge(MemoryInboxStore.layer(store), Layer.succeed(Transport, broker.transport)),
          ),
        )
        const send = (type: string, id = uuidv7()) =>
          broker.transport.publish([
            {
              id,
              type,
              version: 1,
              routingKey: type,
              body: JSON.stringify({ orderId: "o-1" }),
              headers: {},
              occurredAt: new Date(0),
              partitionKey: null,
              tenantId: null,
            },
          ])
        yield* send(Placed.type)
        yield* send(Paid.type)
        // A second OrderPaid for the same order (another message id) is the duplicate the key is for.
        yield* send(Paid.type)
        yield* settle
        expect(ran).toEqual(["placed", "paid"])
        expect(
          store
            .rows("c")
            .map((r) => r.key)
            .sort(),
        ).toEqual(["orders.paid:o-1", "orders.placed:o-1"])
      }),
    ))
})

describe("shared transactions", () => {
  test("idempotent: after handlers failed shared transactions, fewer deliveries share one, so a failure runs few others again", () =>
    run(
      Effect.gen(function* () {
        const failing = new Set([5, 15, 25, 35, 121])
        // One transaction at a time, held for a second by #0 (#100), so the 40 behind it share the next.
        const inbox = yield* startInbox(
          (seen) =>
            seen.n % 100 === 0
              ? Effect.sleep("1 second")
              : failing.has(seen.n) && seen.attempt === 1
                ? Effect.fail(new Error("flaky"))
                : Effect.void,
          { transactions: 1, prefetch: 100 },
        )
        const round = (base: number) =>
          Effect.gen(function* () {
            yield* Effect.forkChild(inbox.publish(base))
            yield* settle
            yield* Effect.all(
              Array.from({ length: 40 }, (_, i) => inbox.publish(base + 1 + i)),
              { concurrency: "unbounded" },
            )
            yield* elapse(20_000, 250)
          })
        yield* round(0)
        yield* round(100)
        expect(inbox.store.rows("c").filter((r) => r.status === "processed")).toHaveLength(82)
        // The second round's failure (#121, 21st of its 40) ran again only the few that shared its
        // transaction; with all 40 in one transaction it ran the 20 before it again.
        const again = inbox.runs.filter((r) => r.n > 100 && r.n !== 121 && r.attempt === 1).length - 39
        expect(again).toBeLessThanOrEqual(8)
      }),
    ))
})

describe("handler timeout", () => {
  test("idempotent: a handler stuck in a shared transaction is the one given up on; the others commit once", () =>
    run(
      Effect.gen(function* () {
        // One transaction at a time: #1 holds it for a second, so #2 and #3 share the next one.
        const inbox = yield* startInbox(
          (seen) => (seen.n === 1 ? Effect.sleep("1 second") : seen.n === 2 ? Effect.never : Effect.void),
          { transactions: 1, handlerTimeout: "5 seconds" },
        )
        yield* Effect.all([inbox.publish(1), inbox.publish(2), inbox.publish(3)])
        yield* elapse(200_000, 500)
        const rows = new Map(inbox.store.rows("c").map((r) => [JSON.parse(r.payload ?? r.raw ?? "{}").n, r]))
        // Once per attempt: its try in the shared transaction was attempt 1 (not run again alone).
        expect(inbox.runs.filter((r) => r.n === 2).map((r) => r.attempt)).toEqual([1, 2, 3])
        expect(rows.get(2)).toMatchObject({ status: "dead", attempts: 3 })
        expect(rows.get(2)?.lastError).toContain("handler timed out after 5000 ms")
        // #3 ran in the shared transaction (rolled back with it), then once more on its own, which committed.
        expect(inbox.store.rows("c").filter((r) => r.status === "processed")).toHaveLength(2)
      }),
    ))

  test("idempotent: a defect in the inbox's own work (a driver that breaks) spends an attempt; dead after maxAttempts", () =>
    run(
      Effect.gen(function* () {
        const broken = (store: InboxStoreShape): InboxStoreShape => ({
          ...store,
          transaction: (use) =>
            store.transaction((tx) =>
              use({ ...tx, insertProcessed: () => Effect.die(new TypeError("the driver broke")) }),
            ),
        })
        const inbox = yield* startInbox(ok, {}, broken)
        yield* inbox.publish(1)
        yield* elapse(120_000, 500)
        const [row] = inbox.store.rows("c")
        expect(row).toMatchObject({ status: "dead", attempts: 3 })
        expect(row?.lastError).toContain("died: the driver broke")
      }),
    ))

  for (const mode of ["idempotent", "store-then-process"] as const) {
    test(`${mode}: a handler that never returns is given up on after handlerTimeout, retried, then dead`, () =>
      run(
        Effect.gen(function* () {
          const inbox = yield* startInbox(() => Effect.never, {
            mode,
            handlerTimeout: "5 seconds",
            pollInterval: "1 second",
          })
          yield* inbox.publish(1)
          yield* elapse(4000)
          expect(inbox.runs.map((r) => r.attempt)).toEqual([1]) // still running
          yield* elapse(120_000, 500)
          expect(inbox.runs.map((r) => r.attempt)).toEqual([1, 2, 3])
          const [row] = inbox.store.rows("c")
          expect(row).toMatchObject({ status: "dead", attempts: 3 })
          expect(row?.lastError).toContain("handler timed out after 5000 ms")
        }),
      ))
  }
})
