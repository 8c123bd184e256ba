// The relay's loop and verdicts over the memory store and the memory broker, on a TestClock: every
// lease, poll and backoff is a clock adjustment, so nothing here sleeps for real.
import { describe, expect, test } from "bun:test"
import { Deferred, Effect, Exit, Fiber, Layer, Scope } from "effect"
import { TestClock } from "effect/testing"
import { uuidv7 } from "../../src/core/uuid.ts"
import { StoreError, TransportError } from "../../src/Errors.ts"
import { OutboxStore, type OutboxStoreShape } from "../../src/ports/OutboxStore.ts"
import { type OutgoingMessage, Transport, type TransportShape } from "../../src/ports/Transport.ts"
import * as Relay from "../../src/Relay.ts"
import * as MemoryOutboxStore from "../../src/storage/memory/MemoryOutboxStore.ts"
import * as MemoryTransport from "../../src/transport/memory/MemoryTransport.ts"

const TYPE = "orders.placed"
/** No jitter, so delays can be asserted exactly; jitter bounds are tested separately. */
const retry = { initialDelay: 1000, factor: 2, maxDelay: 60_000, maxAttempts: 3, jitter: false }
const base: Relay.RelayConfig = { pollInterval: "1 second", lease: "30 seconds", retry }

/** Lets forked fibers run everything they can without the clock moving. */
const settle = Effect.gen(function* () {
  for (let i = 0; i < 50; i++) yield* Effect.yieldNow
})

/** Runs `body` with a TestClock for every fiber it starts (the relay's loops included). */
const run = <A, E>(body: Effect.Effect<A, E, Scope.Scope>) =>
  Effect.runPromise(body.pipe(Effect.scoped, Effect.provide(TestClock.layer())))

const seed = (outbox: MemoryOutboxStore.MemoryOutbox, count: number, type = TYPE) =>
  outbox.enqueue(Array.from({ length: count }, () => ({ id: uuidv7(), type })))

/** Starts a relay over `store` and `transport` in a scope of its own, closed by the returned effect. */
const startRelay = (store: OutboxStoreShape, transport: TransportShape, config: Relay.RelayConfig = base) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const handle = yield* Relay.make(config).pipe(
      Scope.provide(scope),
      Effect.provide(Layer.merge(Layer.succeed(OutboxStore, store), Layer.succeed(Transport, transport))),
    )
    yield* settle
    return { handle, stop: Scope.close(scope, Exit.void) }
  })

const brokerFor = (...types: string[]) => {
  const broker = MemoryTransport.makeBroker()
  broker.declare("c", types.length > 0 ? types : [TYPE])
  return broker
}

const statuses = (outbox: MemoryOutboxStore.MemoryOutbox) => outbox.rows().map((r) => r.status)

/**
 * The broker's transport with `before(call)` run ahead of each publish (call 0, 1, …): a slow or
 * stuck confirm. `published` holds the ids of every publish that went through, in order.
 */
const delayedPublish = (
  broker: MemoryTransport.MemoryBroker,
  before: (call: number) => Effect.Effect<void>,
) => {
  const published: string[] = []
  let calls = 0
  const transport: TransportShape = {
    ...broker.transport,
    publish: (messages: ReadonlyArray<OutgoingMessage>) =>
      Effect.suspend(() => before(calls++)).pipe(
        Effect.andThen(Effect.sync(() => published.push(...messages.map((m) => m.id)))),
        Effect.andThen(broker.transport.publish(messages)),
      ),
  }
  return { transport, published, calls: () => calls }
}

describe("relay loop", () => {
  test("due messages are published and marked sent; a message not yet due waits for its time", () =>
    run(
      Effect.gen(function* () {
        const outbox = yield* MemoryOutboxStore.make()
        const broker = brokerFor()
        yield* seed(outbox, 3)
        const now = yield* TestClockNow
        yield* outbox.enqueue([{ id: uuidv7(), type: TYPE, visibleAt: now + 5000 }])
        yield* startRelay(outbox.store, broker.transport)
        expect(statuses(outbox)).toEqual(["sent", "sent", "sent", "pending"])
        yield* TestClock.adjust("5 seconds")
        yield* settle
        expect(statuses(outbox)).toEqual(["sent", "sent", "sent", "sent"])
        expect(broker.depth("c")).toBe(4)
      }),
    ))

  test("a nacked message is retried on the persisted backoff, 1 s then 2 s, and is dead on its third try", () =>
    run(
      Effect.gen(function* () {
        const outbox = yield* MemoryOutboxStore.make()
        const broker = brokerFor()
        broker.setFaults({ publishFailureRate: 1 })
        yield* seed(outbox, 1)
        const t0 = yield* TestClockNow
        yield* startRelay(outbox.store, broker.transport)
        const row = () => outbox.rows()[0]!
        expect(row()).toMatchObject({ status: "pending", attempts: 1, visibleAt: t0 + 1000 })
        yield* TestClock.adjust(999)
        yield* settle
        expect(row().attempts).toBe(1) // not due yet: no claim, no publish
        yield* TestClock.adjust(1)
        yield* settle
        expect(row()).toMatchObject({ status: "pending", attempts: 2, visibleAt: t0 + 1000 + 2000 })
        yield* TestClock.adjust(2000)
        yield* settle
        expect(row()).toMatchObject({ status: "dead", attempts: 3 })
        expect(row().lastError).toContain("after 3 attempts")
      }),
    ))

  test("jittered delays stay within ±20 % of the base delay", () =>
    run(
      Effect.gen(function* () {
        const outbox = yield* MemoryOutboxStore.make()
        const broker = brokerFor()
        broker.setFaults({ publishFailureRate: 1 })
        yield* seed(outbox, 200)
        const t0 = yield* TestClockNow
        yield* startRelay(outbox.store, broker.transport, { ...base, retry: { ...retry, jitter: true } })
        const delays = outbox.rows().map((r) => r.visibleAt - t0)
        expect(Math.min(...delays)).toBeGreaterThanOrEqual(800)
        expect(Math.max(...delays)).toBeLessThanOrEqual(1200)
        // Jittered, not constant: the retries do not come back in lockstep.
        expect(new Set(delays).size).toBeGreaterThan(20)
      }),
    ))

  test("a full batch does not sleep: a backlog of several batches drains without the clock moving", () =>
    run(
      Effect.gen(function* () {
        const outbox = yield* MemoryOutboxStore.make()
        const broker = brokerFor()
        yield* seed(outbox, 35)
        const relay = yield* startRelay(outbox.store, broker.transport, {
          ...base,
          batchSize: 10,
          pollInterval: "1 hour",
        })
        expect(statuses(outbox).every((s) => s === "sent")).toBe(true)
        // Four claims (10, 10, 10, 5): only the short one ends in a wait.
        expect((yield* relay.handle.stats).batches).toBe(4)
      }),
    ))

  test("a publish slower than the lease keeps its claim: no other worker publishes the batch meanwhile", () =>
    run(
      Effect.gen(function* () {
        const outbox = yield* MemoryOutboxStore.make()
        const broker = brokerFor()
        // Every publish takes 25 s (a backlog behind the publish window), with a 10 s lease.
        const { transport, published } = delayedPublish(broker, () => Effect.sleep("25 seconds"))
        yield* seed(outbox, 5)
        yield* startRelay(outbox.store, transport, { ...base, workers: 2, lease: "10 seconds" })
        for (let i = 0; i < 30; i++) {
          yield* TestClock.adjust("1 second")
          yield* settle
        }
        expect(published.length).toBe(5) // once each, not once per worker
        expect(new Set(published).size).toBe(5)
        expect(statuses(outbox).every((s) => s === "sent")).toBe(true)
      }),
    ))

  test("a claim whose publish never finishes is handed to another worker once its lease may no longer be extended", () =>
    run(
      Effect.gen(function* () {
        const outbox = yield* MemoryOutboxStore.make()
        const broker = brokerFor()
        // The first publish hangs forever (a stuck channel); the next ones work.
        const { transport, published } = delayedPublish(broker, (call) =>
          call === 0 ? Effect.never : Effect.void,
        )
        yield* seed(outbox, 5)
        const ids = outbox.rows().map((r) => r.id)
        yield* startRelay(outbox.store, transport, { ...base, workers: 2, lease: "10 seconds" })
        expect(statuses(outbox).every((s) => s === "pending")).toBe(true)
        // Extended every lease/3 for at most 10 leases, then held one last lease.
        for (let i = 0; i < 105; i++) {
          yield* TestClock.adjust("1 second")
          yield* settle
        }
        expect(published).toEqual([]) // still held by the stuck worker
        for (let i = 0; i < 10; i++) {
          yield* TestClock.adjust("1 second")
          yield* settle
        }
        expect(published.sort()).toEqual([...ids].sort())
        expect(statuses(outbox).every((s) => s === "sent")).toBe(true)
        // Handed back, not failed: no attempt was spent on the stuck claim.
        expect(outbox.rows().every((r) => r.attempts === 0)).toBe(true)
      }),
    ))

  test("a broker outage spends no attempt: rows stay untouched while it is down, then drain", () =>
    run(
      Effect.gen(function* () {
        const outbox = yield* MemoryOutboxStore.make()
        const broker = brokerFor()
        broker.setFaults({ down: true })
        yield* seed(outbox, 10)
        const t0 = yield* TestClockNow
        const relay = yield* startRelay(outbox.store, broker.transport)
        for (let i = 0; i < 20; i++) {
          yield* TestClock.adjust("10 seconds")
          yield* settle
        }
        expect(outbox.rows().every((r) => r.status === "pending" && r.attempts === 0)).toBe(true)
        // Not even claimed and handed back: no row was written while the broker was away.
        expect(outbox.rows().every((r) => r.visibleAt === t0 && r.lockToken === null)).toBe(true)
        expect((yield* relay.handle.health).ready).toBe(false)
        broker.setFaults({ down: false })
        // The loop's backoff is capped at 10 s (±20 % jitter).
        yield* TestClock.adjust("13 seconds")
        yield* settle
        expect(statuses(outbox).every((s) => s === "sent")).toBe(true)
        expect((yield* relay.handle.health).ready).toBe(true)
      }),
    ))

  test("a connection lost in the middle of a publish spends no attempt, however long it lasts", () =>
    run(
      Effect.gen(function* () {
        const outbox = yield* MemoryOutboxStore.make()
        const broker = brokerFor()
        let failing = true
        // Connected when asked, then the channel dies on every publish: the Interrupted path.
        const transport: TransportShape = {
          ...broker.transport,
          publish: (messages) =>
            failing
              ? Effect.fail(
                  new TransportError({ reason: "channel", operation: "publish", cause: "channel closed" }),
                )
              : broker.transport.publish(messages),
        }
        yield* seed(outbox, 3)
        yield* startRelay(outbox.store, transport, { ...base, retry: { ...retry, maxAttempts: 2 } })
        for (let i = 0; i < 30; i++) {
          yield* TestClock.adjust("10 seconds")
          yield* settle
        }
        expect(outbox.rows().every((r) => r.status === "pending" && r.attempts === 0)).toBe(true)
        failing = false
        yield* TestClock.adjust("1 minute")
        yield* settle
        expect(statuses(outbox).every((s) => s === "sent")).toBe(true)
      }),
    ))

  test("a database outage and an error that will not pass by itself both back off; the loop outlives them", () =>
    run(
      Effect.gen(function* () {
        const outbox = yield* MemoryOutboxStore.make()
        const broker = brokerFor()
        let refusals = 3
        // First the database is away; when it is back, the table is missing a few times (a relay
        // started before `migrate`): a non-retryable query error.
        const store: OutboxStoreShape = {
          ...outbox.store,
          claim: (limit, leaseMs) =>
            Effect.suspend(() =>
              outbox.rows().length > 0 && !isDown() && refusals-- > 0
                ? Effect.fail(
                    new StoreError({
                      reason: "query",
                      operation: "claim",
                      cause: 'relation "outbox" does not exist',
                    }),
                  )
                : outbox.store.claim(limit, leaseMs),
            ),
        }
        let down = true
        const isDown = () => down
        yield* seed(outbox, 2)
        outbox.setDown(true)
        const relay = yield* startRelay(store, broker.transport)
        yield* TestClock.adjust("5 seconds")
        yield* settle
        const duringOutage = yield* relay.handle.health
        expect(duringOutage.ready).toBe(false)
        expect(duringOutage.lastError).toContain("memory store is down")
        down = false
        outbox.setDown(false)
        yield* TestClock.adjust("12 seconds")
        yield* settle
        expect((yield* relay.handle.health).lastError).toContain("does not exist")
        expect(statuses(outbox)).toEqual(["pending", "pending"])
        for (let i = 0; i < 10; i++) {
          yield* TestClock.adjust("5 seconds")
          yield* settle
        }
        expect(statuses(outbox)).toEqual(["sent", "sent"])
        expect((yield* relay.handle.health).ready).toBe(true)
      }),
    ))

  test("the next look does not wait for a batch's confirm: two batches in flight at most, the second published meanwhile", () =>
    run(
      Effect.gen(function* () {
        const outbox = yield* MemoryOutboxStore.make()
        const broker = brokerFor()
        const release = yield* Deferred.make<void>()
        // The first batch's confirm takes until `release`; the others' come at once.
        const { transport, published, calls } = delayedPublish(broker, (call) =>
          call === 0 ? Deferred.await(release) : Effect.void,
        )
        yield* seed(outbox, 2)
        yield* startRelay(outbox.store, transport)
        expect(calls()).toBe(1)
        yield* seed(outbox, 3)
        yield* TestClock.adjust("1 second")
        yield* settle
        // The second batch went out while the first waits for its confirm.
        expect(calls()).toBe(2)
        expect(published.length).toBe(3)
        expect(statuses(outbox)).toEqual(["pending", "pending", "sent", "sent", "sent"])
        // A third claim waits for the first batch to settle: never more than two in flight.
        yield* seed(outbox, 1)
        yield* TestClock.adjust("3 seconds")
        yield* settle
        expect(calls()).toBe(2)
        yield* Deferred.succeed(release, undefined)
        yield* settle
        yield* TestClock.adjust("1 second")
        yield* settle
        expect(statuses(outbox).every((s) => s === "sent")).toBe(true)
        expect(published.length).toBe(6)
      }),
    ))

  test("shutdown in the middle of a batch waits for it to be published and marked, and leaves nothing claimed", () =>
    run(
      Effect.gen(function* () {
        const outbox = yield* MemoryOutboxStore.make()
        const broker = brokerFor()
        const inFlight = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        const { transport } = delayedPublish(broker, () =>
          Effect.andThen(Deferred.succeed(inFlight, undefined), Deferred.await(release)),
        )
        yield* seed(outbox, 4)
        const relay = yield* startRelay(outbox.store, transport)
        yield* Deferred.await(inFlight)
        const stopping = yield* Effect.forkChild(relay.stop)
        yield* settle
        expect(stopping.pollUnsafe()).toBeUndefined() // still waiting for the batch
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(stopping)
        // Sent, each keeping its claim's token (it names the relay that published): nothing claimed.
        expect(outbox.rows().map((r) => r.status)).toEqual(Array.from({ length: 4 }, () => "sent"))
        // Stopped for good: what arrives later stays pending.
        yield* seed(outbox, 1)
        yield* TestClock.adjust("1 minute")
        expect(statuses(outbox).at(-1)).toBe("pending")
      }),
    ))
})

describe("housekeeping in one process at a time", () => {
  test("of two relays on one outbox, one measures the lag; the other takes over when the first stops", () =>
    run(
      Effect.gen(function* () {
        const outbox = yield* MemoryOutboxStore.make()
        const broker = brokerFor()
        // Due 30 s ago and never published while the broker is away: a lag to measure.
        const now = yield* TestClockNow
        yield* outbox.enqueue([{ id: uuidv7(), type: TYPE, visibleAt: now - 30_000 }])
        broker.setFaults({ down: true })
        const first = yield* startRelay(outbox.store, broker.transport)
        const second = yield* startRelay(outbox.store, broker.transport)
        yield* TestClock.adjust("5 seconds")
        yield* settle
        const a = yield* first.handle.health
        const b = yield* second.handle.health
        expect([a.lagMeasured, b.lagMeasured]).toEqual([true, false])
        expect(a.lagSeconds).toBeGreaterThanOrEqual(30)
        expect(b.lagSeconds).toBe(0)
        // The holder stops; its lease (3 probe intervals) runs out and the other relay probes.
        yield* first.stop
        for (let i = 0; i < 4; i++) {
          yield* TestClock.adjust("5 seconds")
          yield* settle
        }
        const after = yield* second.handle.health
        expect(after.lagMeasured).toBe(true)
        expect(after.lagSeconds).toBeGreaterThanOrEqual(45)
        yield* second.stop
      }),
    ))

  test("retention runs in one relay process at a time", () =>
    run(
      Effect.gen(function* () {
        const outbox = yield* MemoryOutboxStore.make()
        const broker = brokerFor()
        let purges = 0
        const store: OutboxStoreShape = {
          ...outbox.store,
          purgeSent: (olderThan, batch) =>
            Effect.andThen(
              Effect.sync(() => {
                purges++
              }),
              outbox.store.purgeSent(olderThan, batch),
            ),
        }
        const retention = { olderThan: "1 hour", every: "1 minute" } as const
        yield* startRelay(store, broker.transport, { ...base, retention })
        yield* startRelay(store, broker.transport, { ...base, retention })
        yield* startRelay(store, broker.transport, { ...base, retention })
        for (let i = 0; i < 5; i++) {
          yield* TestClock.adjust("1 minute")
          yield* settle
        }
        // Three relays, six passes each (one at start, one a minute): one of them purges.
        expect(purges).toBe(6)
      }),
    ))
})

describe("relay config", () => {
  const bad: ReadonlyArray<[string, Relay.RelayConfig]> = [
    ["relay lease", { lease: "soon" as never }],
    ["relay lease", { lease: 10 }],
    ["relay pollInterval", { pollInterval: "often" as never }],
    ["relay batchSize", { batchSize: 0 }],
    ["relay batchSize", { batchSize: 1.5 }],
    ["relay workers", { workers: 65 }],
    ["relay retry.initialDelay", { retry: { initialDelay: "soon" as never } }],
    ["relay retry.maxDelay", { retry: { initialDelay: "2 seconds", maxDelay: "1 second" } }],
    ["relay retry.factor", { retry: { factor: 0.5 } }],
    ["relay retry.maxAttempts", { retry: { maxAttempts: 0 } }],
    ["relay retry.jitter", { retry: { jitter: "yes" as never } }],
    ["relay outageRetry.maxDelay", { outageRetry: { maxDelay: "forever" as never } }],
    ["relay retention.olderThan", { retention: { olderThan: "a while" as never } }],
    ["relay retention.every", { retention: { olderThan: "1 day", every: -5 } }],
    ["relay retention.batchSize", { retention: { olderThan: "1 day", batchSize: 0 } }],
    ["relay shard", { shard: null as never }],
    ["relay shard.tenants", { shard: { tenants: [] } }],
    ["relay shard.tenants", { shard: { tenants: "acme" as never } }],
    ["relay shard.tenants", { shard: { tenants: ["acme", ""] } }],
    ["relay shard.tenants", { shard: { tenants: [7 as never] } }],
    ["relay shard.of", { shard: { of: 0, index: 0 } }],
    ["relay shard.of", { shard: { of: 2.5, index: 0 } }],
    ["relay shard.of", { shard: { index: 0 } as never }],
    ["relay shard.index", { shard: { of: 3, index: 3 } }],
    ["relay shard.index", { shard: { of: 3, index: -1 } }],
    ["relay source", { source: "tail" as never }],
    ["relay shard", { source: "wal", shard: { of: 2, index: 0 } }],
    ["relay sweepAfter", { source: "wal", sweepAfter: 10 }],
  ]
  for (const [field, config] of bad) {
    test(`a bad ${field} is a ConfigError naming it: ${JSON.stringify(config)}`, async () => {
      const exit = await Effect.runPromiseExit(Relay.resolveConfig(config))
      expect(Exit.isFailure(exit)).toBe(true)
      const error = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
      expect(error?._tag).toBe("Fail")
      const failure = error?._tag === "Fail" ? error.error : undefined
      expect(failure?._tag).toBe("ConfigError")
      expect(failure?.message).toContain(field)
    })
  }

  test("a shard is copied (a later change to the caller's array reaches nothing) and polls every 100 ms unless told", async () => {
    const tenants = ["acme", "globex", "acme"]
    const c = await Effect.runPromise(Relay.resolveConfig({ shard: { tenants } }))
    tenants.push("initech")
    expect(c.shard).toEqual({ tenants: ["acme", "globex"] })
    expect(c.pollMs).toBe(100)
    expect((await Effect.runPromise(Relay.resolveConfig({}))).pollMs).toBe(1000)
    const hashed = await Effect.runPromise(
      Relay.resolveConfig({ shard: { of: 4, index: 3 }, pollInterval: "2 seconds" }),
    )
    expect([hashed.shard, hashed.pollMs]).toEqual([{ of: 4, index: 3 }, 2000])
  })

  test("the layer fails with the ConfigError, so catchTag('ConfigError') catches it", async () => {
    const outbox = await Effect.runPromise(MemoryOutboxStore.make())
    const caught = await Effect.runPromise(
      Layer.build(Relay.layer({ lease: "soon" as never })).pipe(
        Effect.scoped,
        Effect.as("built"),
        Effect.catchTag("ConfigError", (e) => Effect.succeed(e.message)),
        Effect.provide(Layer.merge(MemoryOutboxStore.layer(outbox), MemoryTransport.layer())),
      ),
    )
    expect(caught).toContain("relay lease")
  })
})

describe("source: wal", () => {
  test("without an OutboxLog the relay is a ConfigError that says to provide WalLog.layer", async () => {
    const outbox = await Effect.runPromise(MemoryOutboxStore.make())
    const caught = await Effect.runPromise(
      Layer.build(Relay.layer({ source: "wal" })).pipe(
        Effect.scoped,
        Effect.as("built"),
        Effect.catchTag("ConfigError", (e) => Effect.succeed(e.message)),
        Effect.provide(Layer.merge(MemoryOutboxStore.layer(outbox), MemoryTransport.layer())),
      ),
    )
    expect(caught).toContain("WalLog.layer")
  })

  test("its polling loop is a sweep: the rows the log leaves, and no others", async () => {
    const c = await Effect.runPromise(Relay.resolveConfig({ source: "wal", sweepAfter: "3 seconds" }))
    expect([c.source, c.shard]).toEqual(["wal", { sweepAfterMs: 3000 }])
    const polling = await Effect.runPromise(Relay.resolveConfig({}))
    expect([polling.source, polling.shard]).toEqual(["poll", undefined])
  })

  test("the memory store's sweep share: delayed, retried or old pending rows, never a fresh one", async () => {
    const outbox = await Effect.runPromise(MemoryOutboxStore.make())
    const share = { sweepAfterMs: 5000 }
    const ids = await Effect.runPromise(
      Effect.gen(function* () {
        const now = yield* TestClockNow
        yield* outbox.enqueue([
          { id: "fresh", type: "t" },
          { id: "delayed", type: "t", visibleAt: now + 1000 },
        ])
        yield* TestClock.adjust(1500)
        const first = yield* outbox.store.claim(10, 60_000, share)
        yield* TestClock.adjust(5000)
        const second = yield* outbox.store.claim(10, 60_000, share)
        return [first.rows.map((r) => r.id), second.rows.map((r) => r.id)]
      }).pipe(Effect.provide(TestClock.layer())),
    )
    // The delayed one once due; the fresh one only once left pending past sweepAfter.
    expect(ids).toEqual([["delayed"], ["fresh"]])
  })
})

/** The TestClock's time, read the way the store reads it. */
const TestClockNow = Effect.clockWith((clock) => Effect.succeed(clock.currentTimeMillisUnsafe()))

describe("pollingCadence (RelayConfig.batchEvery for a polling relay)", () => {
  test("the default 25 ms: a look every 25 ms under load, kept up for 200 ms after rows", () => {
    expect(Relay.pollingCadence(25)).toEqual({ relookMs: 25, hotMs: 200 })
  })
  test("a slower cadence keeps looking longer, so rows whose producers skipped the NOTIFY are still found", () => {
    // 125 ms of skipped NOTIFYs after the mark + room, beyond one wait of 2 × 100 ms (the mark rides it).
    expect(Relay.pollingCadence(100)).toEqual({ relookMs: 100, hotMs: 350 })
  })
  test("0 looks as soon as the last look ended (1 ms: 0 would mean no follow-up looks at all)", () => {
    expect(Relay.pollingCadence(0)).toEqual({ relookMs: 1, hotMs: 200 })
  })
})
