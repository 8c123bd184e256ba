// Per-key order in the inbox over memory parts on a TestClock: deliveries shuffled and duplicated
// by the memory broker, handler failures retried; each key's handler runs still follow the numbers.
import { describe, expect, test } from "bun:test"
import { Effect, Layer, type Scope } from "effect"
import { TestClock } from "effect/testing"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import { uuidv7 } from "../../src/core/uuid.ts"
import * as Inbox from "../../src/Inbox.ts"
import { type OutgoingMessage, Transport } from "../../src/ports/Transport.ts"
import * as MemoryInboxStore from "../../src/storage/memory/MemoryInboxStore.ts"
import * as MemoryTransport from "../../src/transport/memory/MemoryTransport.ts"

const Step = defineEvent({
  type: "test.step",
  version: 1,
  schema: v.object({ key: v.string(), n: v.number() }),
})

const settle = Effect.gen(function* () {
  for (let i = 0; i < 50; i++) yield* Effect.yieldNow
})

const run = <A, E>(body: Effect.Effect<A, E, Scope.Scope>) =>
  Effect.runPromise(body.pipe(Effect.scoped, Effect.provide(TestClock.layer())))

/** A seeded generator, so a failing order can be replayed. */
const seeded = (seed: number) => () => {
  seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31
  return seed / 2 ** 31
}

const message = (key: string, n: number, epoch: number): OutgoingMessage => ({
  id: uuidv7(),
  type: Step.type,
  version: 1,
  routingKey: Step.type,
  body: JSON.stringify({ key, n }),
  headers: {},
  occurredAt: new Date(0),
  partitionKey: key,
  position: { epoch, seq: n },
  tenantId: null,
})

describe("per-key order over memory parts", () => {
  for (const mode of ["idempotent", "store-then-process"] as const) {
    test(`${mode}: shuffled, duplicated deliveries and failing handlers; each key runs 1..n once, in order`, () =>
      run(
        Effect.gen(function* () {
          const random = seeded(7)
          const store = yield* MemoryInboxStore.make()
          const broker = MemoryTransport.makeBroker({ shuffle: true, duplicateRate: 0.3, random })
          const handled = new Map<string, number[]>()
          const handler = Inbox.handler(Step, ({ payload }) =>
            // A third of the runs fail and are retried; only a run that succeeds counts.
            random() < 0.3
              ? Effect.fail(new Error("try again"))
              : Effect.sync(() => {
                  handled.set(payload.key, [...(handled.get(payload.key) ?? []), payload.n])
                }),
          )
          yield* Inbox.make({
            consumer: "c",
            mode,
            handlers: [handler],
            pollInterval: "100 millis",
            retry: { initialDelay: 100, maxDelay: 400, maxAttempts: 50, jitter: false },
            // A transaction per message: the memory store cannot roll back what a handler does in
            // JS, and a shared transaction that one failing handler rolls back runs the others
            // again (against PostgreSQL, test/integration/inbox.test.ts shows their effects once).
            transactions: 256,
            processorConcurrency: 256,
          }).pipe(
            Effect.provide(
              Layer.merge(MemoryInboxStore.layer(store), Layer.succeed(Transport, broker.transport)),
            ),
          )
          const keys = Array.from({ length: 30 }, (_, i) => `k${i}`)
          const batch = keys.flatMap((key) => [1, 2, 3, 4, 5].map((n) => message(key, n, 1_000)))
          const outcomes = yield* broker.transport.publish(batch)
          expect(outcomes.every((o) => o._tag === "Confirmed")).toBe(true)
          for (let i = 0; i < 400 && [...handled.values()].flat().length < batch.length; i++) {
            yield* TestClock.adjust(100)
            yield* settle
          }
          expect(broker.stats().duplicatesInjected).toBeGreaterThan(0)
          expect(handled.size).toBe(30)
          for (const key of keys)
            expect({ key, runs: handled.get(key) }).toEqual({ key, runs: [1, 2, 3, 4, 5] })
        }),
      ))
  }

  test("without a partition key nothing waits: a message numbered 3 of no key runs at once", () =>
    run(
      Effect.gen(function* () {
        const store = yield* MemoryInboxStore.make()
        const broker = MemoryTransport.makeBroker()
        const seen: number[] = []
        yield* Inbox.make({
          consumer: "c",
          handlers: [Inbox.handler(Step, ({ payload }) => Effect.sync(() => seen.push(payload.n)))],
        }).pipe(
          Effect.provide(
            Layer.merge(MemoryInboxStore.layer(store), Layer.succeed(Transport, broker.transport)),
          ),
        )
        yield* broker.transport.publish([{ ...message("k", 3, 1_000), partitionKey: null }])
        yield* settle
        expect(seen).toEqual([3])
      }),
    ))
  test("a key with a backlog drains a batch per claim, not a message per claim", () =>
    run(
      Effect.gen(function* () {
        const memory = yield* MemoryInboxStore.make()
        let claims = 0
        const store = {
          ...memory,
          store: {
            ...memory.store,
            claim: (...args: Parameters<typeof memory.store.claim>) => {
              claims++
              return memory.store.claim(...args)
            },
          },
        }
        const broker = MemoryTransport.makeBroker()
        const seen: number[] = []
        // 40 messages of one key, stored before the processor looks: its predecessor #1 comes last.
        const batch = Array.from({ length: 40 }, (_, i) => message("k", i + 1, 1_000))
        yield* Inbox.make({
          consumer: "c",
          mode: "store-then-process",
          pollInterval: "1 second",
          handlers: [Inbox.handler(Step, ({ payload }) => Effect.sync(() => seen.push(payload.n)))],
        }).pipe(
          Effect.provide(
            Layer.merge(MemoryInboxStore.layer(store), Layer.succeed(Transport, broker.transport)),
          ),
        )
        yield* broker.transport.publish(batch.slice(1))
        yield* settle
        const before = claims
        yield* broker.transport.publish(batch.slice(0, 1))
        for (let i = 0; i < 20 && seen.length < 40; i++) {
          yield* TestClock.adjust(1_000)
          yield* settle
        }
        expect(seen).toEqual(batch.map((_, i) => i + 1))
        // The whole backlog in the claim after #1 arrived (and one more that finds nothing), not 40.
        expect(claims - before).toBeLessThanOrEqual(3)
      }),
    ))
})
