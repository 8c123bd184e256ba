// The memory stores against the store contract, on a TestClock: every lease expiry and retry delay
// is a clock adjustment, so the whole file runs in milliseconds. Then what only the memory stores
// promise: the down switch, wakeups that stop with their scope, and a `trx` that refuses SQL.
import { describe, expect, test } from "bun:test"
import { Cause, Clock, Effect, Exit, Fiber, Layer, ManagedRuntime, Scope } from "effect"
import { TestClock } from "effect/testing"
import { uuidv7 } from "../../src/core/uuid.ts"
import { StoreError } from "../../src/Errors.ts"
import { InboxStore, type InboxTransaction } from "../../src/ports/InboxStore.ts"
import { OutboxStore, type OutboxStoreShape } from "../../src/ports/OutboxStore.ts"
import * as MemoryInboxStore from "../../src/storage/memory/MemoryInboxStore.ts"
import * as MemoryOutboxStore from "../../src/storage/memory/MemoryOutboxStore.ts"
import {
  type InboxHarness,
  inboxRow,
  inboxStoreContract,
  type OutboxHarness,
  outboxStoreContract,
} from "../support/storeContract.ts"

// A realistic epoch rather than the TestClock's 0, so timestamps read like dates.
const START = Date.UTC(2025, 0, 1)

/**
 * One runtime per store holds the store and the TestClock together: the store reads the clock of
 * the fiber running each operation, so operations and `advance` must share this runtime.
 */
const runtimeFor = async <I>(storeLayer: Layer.Layer<I>) => {
  const runtime = ManagedRuntime.make(Layer.merge(storeLayer, TestClock.layer()))
  await runtime.runPromise(TestClock.setTime(START))
  return runtime
}

const memoryOutbox = async () => {
  const handle = await Effect.runPromise(MemoryOutboxStore.make())
  const runtime = await runtimeFor(MemoryOutboxStore.layer(handle))
  const harness: OutboxHarness = {
    run: (effect) => runtime.runPromise(effect),
    insert: (seeds) =>
      runtime.runPromise(
        Effect.flatMap(Clock.currentTimeMillis, (now) =>
          handle.enqueue(
            seeds.map((s) => ({
              id: s.id,
              type: s.type ?? "test.event",
              payload: s.payload ?? "{}",
              visibleAt: now + (s.dueInMs ?? 0),
            })),
          ),
        ),
      ),
    rows: async () => handle.rows(),
    advance: (ms) => runtime.runPromise(TestClock.adjust(ms)),
    now: () => runtime.runPromise(Clock.currentTimeMillis),
    dispose: () => runtime.dispose(),
  }
  return { handle, runtime, harness }
}

const memoryInbox = async () => {
  const handle = await Effect.runPromise(MemoryInboxStore.make())
  const runtime = await runtimeFor(MemoryInboxStore.layer(handle))
  const harness: InboxHarness = {
    run: (effect) => runtime.runPromise(effect),
    rows: async (consumer) => handle.rows(consumer),
    advance: (ms) => runtime.runPromise(TestClock.adjust(ms)),
    now: () => runtime.runPromise(Clock.currentTimeMillis),
    dispose: () => runtime.dispose(),
  }
  return { handle, runtime, harness }
}

outboxStoreContract("MemoryOutboxStore", async () => (await memoryOutbox()).harness)
inboxStoreContract("MemoryInboxStore", async () => (await memoryInbox()).harness)

/** The error an operation failed with, asserting it is a retryable connection StoreError. */
const expectDown = (exit: Exit.Exit<unknown, unknown>, operation: string) => {
  expect(Exit.isFailure(exit)).toBe(true)
  const error = Exit.isFailure(exit) ? Cause.squash(exit.cause) : undefined
  expect(error).toBeInstanceOf(StoreError)
  expect(error).toMatchObject({ reason: "connection", operation, retryable: true })
}

describe("MemoryOutboxStore", () => {
  test("while down, every operation fails with a retryable StoreError; back up, they work again", async () => {
    const { handle, runtime } = await memoryOutbox()
    await runtime.runPromise(handle.enqueue([{ id: uuidv7(), type: "t" }]))
    const { token } = await runtime.runPromise(OutboxStore.use((s) => s.claim(10, 60_000)))
    handle.setDown(true)
    const operations = [
      ["OutboxStore.claim", OutboxStore.use((s) => s.claim(10, 60_000))],
      ["OutboxStore.mark", OutboxStore.use((s) => s.mark(token, []))],
      ["OutboxStore.release", OutboxStore.use((s) => s.release(token))],
      ["OutboxStore.lag", OutboxStore.use((s) => s.lagSeconds)],
      ["OutboxStore.purgeSent", OutboxStore.use((s) => s.purgeSent(0, 100))],
      ["listen", Effect.scoped(OutboxStore.use((s) => s.wakeups(() => {})))],
    ] as const
    for (const [operation, effect] of operations) {
      expectDown(
        await runtime.runPromiseExit(effect as Effect.Effect<unknown, StoreError, OutboxStore>),
        operation,
      )
    }
    // Nothing changed while down: the claim still holds its row.
    expect(handle.rows()[0]?.lockToken).toBe(token)
    handle.setDown(false)
    expect(await runtime.runPromise(OutboxStore.use((s) => s.release(token)))).toBe(1)
    await runtime.dispose()
  })

  test("enqueue wakes every listener, until the listener's scope closes", async () => {
    const { handle, runtime } = await memoryOutbox()
    let wakes = 0
    const scope = await runtime.runPromise(Scope.make())
    await runtime.runPromise(
      Scope.provide(
        OutboxStore.use((s) => s.wakeups(() => wakes++)),
        scope,
      ),
    )
    await runtime.runPromise(handle.enqueue([{ id: uuidv7(), type: "t" }]))
    expect(wakes).toBe(1)
    await runtime.runPromise(Scope.close(scope, Exit.void))
    await runtime.runPromise(handle.enqueue([{ id: uuidv7(), type: "t" }]))
    expect(wakes).toBe(1)
    await runtime.dispose()
  })

  test("enqueue refuses an id already stored, as the primary key would, and stores none of the batch", async () => {
    const { handle, runtime } = await memoryOutbox()
    const id = uuidv7()
    await runtime.runPromise(handle.enqueue([{ id, type: "t" }]))
    const exit = await runtime.runPromiseExit(
      handle.enqueue([
        { id: uuidv7(), type: "t" },
        { id, type: "t" },
      ]),
    )
    expect(Exit.isFailure(exit) && Cause.squash(exit.cause)).toMatchObject({ reason: "constraint" })
    expect(handle.rows()).toHaveLength(1)
    await runtime.dispose()
  })

  test("a sharded claim takes its share only: its tenants, or its hash share, each row in one share", async () => {
    const { handle, runtime } = await memoryOutbox()
    const rows = Array.from({ length: 90 }, (_, i) => ({
      id: uuidv7(),
      type: "t",
      tenantId: i % 3 === 0 ? null : i % 3 === 1 ? "acme" : "globex",
      partitionKey: i % 2 === 0 ? `key-${i % 10}` : null,
    }))
    await runtime.runPromise(handle.enqueue(rows))
    const claim = (shard: Parameters<OutboxStoreShape["claim"]>[2]) =>
      runtime.runPromise(OutboxStore.use((s) => s.claim(1000, 60_000, shard))).then((c) => c.rows)
    const acme = await claim({ tenants: ["acme"] })
    expect(acme).toHaveLength(30)
    expect(acme.every((r) => r.tenantId === "acme")).toBe(true)
    await runtime.runPromise(OutboxStore.use((s) => s.release(handle.rows()[1]!.lockToken!)))
    const shares = [
      await claim({ of: 3, index: 0 }),
      await claim({ of: 3, index: 1 }),
      await claim({ of: 3, index: 2 }),
    ]
    expect(shares.reduce((n, share) => n + share.length, 0)).toBe(90)
    expect(shares.every((share) => share.length > 0)).toBe(true)
    // A key is in one share.
    const shareOfKey = new Map<string, Set<number>>()
    shares.forEach((share, i) => {
      for (const r of share)
        if (r.partitionKey)
          shareOfKey.set(r.partitionKey, (shareOfKey.get(r.partitionKey) ?? new Set()).add(i))
    })
    expect([...shareOfKey.values()].every((s) => s.size === 1)).toBe(true)
    await runtime.dispose()
  })

  test("claimed messages carry the TestClock's time, not the wall clock's", async () => {
    const { handle, runtime } = await memoryOutbox()
    await runtime.runPromise(handle.enqueue([{ id: uuidv7(), type: "t" }]))
    const { rows } = await runtime.runPromise(OutboxStore.use((s) => s.claim(1, 60_000)))
    expect(rows[0]?.occurredAt.getTime()).toBe(START)
    expect(handle.rows()[0]?.visibleAt).toBe(START + 60_000)
    await runtime.dispose()
  })
})

describe("MemoryInboxStore", () => {
  test("while down, every operation fails with a retryable StoreError, inside a transaction too", async () => {
    const { handle, runtime } = await memoryInbox()
    await runtime.runPromise(InboxStore.use((s) => s.insertPending([inboxRow("m1")])))
    const { token } = await runtime.runPromise(InboxStore.use((s) => s.claim("consumer-a", 10, 60_000)))
    handle.setDown(true)
    const operations = [
      ["InboxStore.begin", InboxStore.use((s) => s.transaction(() => Effect.void))],
      ["InboxStore.insertPending", InboxStore.use((s) => s.insertPending([inboxRow("m2")]))],
      ["InboxStore.insertDead", InboxStore.use((s) => s.insertDead([inboxRow("m2")]))],
      ["InboxStore.claim", InboxStore.use((s) => s.claim("consumer-a", 10, 60_000))],
      ["InboxStore.mark", InboxStore.use((s) => s.mark("consumer-a", token, []))],
      ["listen", Effect.scoped(InboxStore.use((s) => s.wakeups("consumer-a", () => {})))],
    ] as const
    for (const [operation, effect] of operations) {
      expectDown(
        await runtime.runPromiseExit(effect as Effect.Effect<unknown, StoreError, InboxStore>),
        operation,
      )
    }
    handle.setDown(false)
    // Going down inside an open transaction: its writes fail, and so does the commit.
    const inside = (use: (tx: InboxTransaction) => Effect.Effect<unknown, StoreError>, operation: string) =>
      runtime
        .runPromiseExit(
          InboxStore.use((s) =>
            s.transaction((tx) =>
              Effect.andThen(
                Effect.sync(() => handle.setDown(true)),
                Effect.ensuring(
                  use(tx),
                  Effect.sync(() => handle.setDown(false)),
                ),
              ),
            ),
          ),
        )
        .then((exit) => expectDown(exit, operation))
    await inside((tx) => tx.insertProcessed(inboxRow("m3")), "InboxStore.insertProcessed")
    await inside((tx) => tx.markProcessed("consumer-a", "m1", token, 1), "InboxStore.markProcessed")
    expect(handle.rows().map((r) => [r.key, r.status])).toEqual([["m1", "pending"]])
    await runtime.dispose()
  })

  test("a commit that fails (the store went down) rolls back and frees the key", async () => {
    const { handle, runtime } = await memoryInbox()
    const exit = await runtime.runPromiseExit(
      InboxStore.use((s) =>
        s.transaction((tx) =>
          Effect.andThen(
            tx.insertProcessed(inboxRow("m1")),
            Effect.sync(() => handle.setDown(true)),
          ),
        ),
      ),
    )
    expectDown(exit, "InboxStore.commit")
    expect(handle.rows()).toEqual([])
    handle.setDown(false)
    expect(
      await runtime.runPromise(
        InboxStore.use((s) => s.transaction((tx) => tx.insertProcessed(inboxRow("m1")))),
      ),
    ).toBe(true)
    await runtime.dispose()
  })

  test("new pending rows wake the listeners; dead rows and duplicates do not", async () => {
    const { runtime } = await memoryInbox()
    let wakes = 0
    await runtime.runPromise(
      Effect.scoped(
        InboxStore.use((s) =>
          Effect.gen(function* () {
            yield* s.wakeups("consumer-a", () => wakes++)
            yield* s.insertPending([inboxRow("m1")])
            yield* s.insertPending([inboxRow("m1")])
            yield* s.insertDead([inboxRow("m2")])
          }),
        ),
      ),
    )
    expect(wakes).toBe(1)
    await runtime.dispose()
  })

  test("trx refuses any use with an error that says why", async () => {
    const { runtime } = await memoryInbox()
    const error = await runtime.runPromise(
      InboxStore.use((s) =>
        s.transaction((tx) =>
          Effect.sync(() => {
            try {
              tx.trx.selectFrom("orders")
              return undefined
            } catch (e) {
              return e
            }
          }),
        ),
      ),
    )
    expect(String(error)).toContain("the memory inbox store has no SQL transaction")
    await runtime.dispose()
  })

  test("an insert of a key an open transaction holds waits for it to end, then finds the key taken", async () => {
    // As PostgreSQL's unique index makes it wait: no pending copy of a row a handler is committing.
    const { handle, runtime } = await memoryInbox()
    const { whileOpen, stored } = await runtime.runPromise(
      InboxStore.use((s) =>
        Effect.gen(function* () {
          const { waiting, whileOpen } = yield* s.transaction((tx) =>
            Effect.gen(function* () {
              yield* tx.insertProcessed(inboxRow("m1"))
              const waiting = yield* Effect.forkChild(s.insertPending([inboxRow("m1")]))
              for (let i = 0; i < 5; i++) yield* Effect.yieldNow
              return { waiting, whileOpen: waiting.pollUnsafe() }
            }),
          )
          return { whileOpen, stored: yield* Fiber.join(waiting) }
        }),
      ),
    )
    expect(whileOpen).toBeUndefined()
    expect(stored).toBe(0)
    expect(handle.rows().map((r) => [r.key, r.status])).toEqual([["m1", "processed"]])
    await runtime.dispose()
  })
})
