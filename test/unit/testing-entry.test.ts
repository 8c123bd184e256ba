/**
 * `txbox/testing` as a user's unit test takes it: a relay and an inbox over `layerMemory`, no
 * servers, the clock under the test's control.
 */
import { describe, expect, test } from "bun:test"
import { Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import { uuidv7 } from "../../src/core/uuid.ts"
import * as Inbox from "../../src/Inbox.ts"
import * as Relay from "../../src/Relay.ts"
import { layerMemory, MemoryInboxStore, MemoryOutboxStore, MemoryTransport } from "../../src/testing.ts"

const OrderPlaced = defineEvent({ type: "order.placed", version: 1, schema: v.object({ total: v.number() }) })

const settle = Effect.gen(function* () {
  for (let i = 0; i < 50; i++) yield* Effect.yieldNow
})

describe("txbox/testing", () => {
  test("layerMemory runs a relay and an inbox end to end: seeded messages are published, handled once, and both tables say so", () =>
    Effect.runPromise(
      Effect.gen(function* () {
        const outbox = yield* MemoryOutboxStore.make()
        const inbox = yield* MemoryInboxStore.make()
        const broker = MemoryTransport.makeBroker({ duplicateRate: 1 })
        const ids = [uuidv7(), uuidv7(), uuidv7()]
        yield* outbox.enqueue(
          ids.map((id, i) => ({
            id,
            type: OrderPlaced.type,
            routingKey: OrderPlaced.type,
            payload: JSON.stringify({ total: i }),
          })),
        )
        const totals: Array<number> = []
        yield* Effect.gen(function* () {
          yield* Inbox.make({
            consumer: "billing",
            handlers: [
              Inbox.handler(OrderPlaced, ({ payload }) => Effect.sync(() => totals.push(payload.total))),
            ],
          })
          yield* Relay.make()
          for (let i = 0; i < 20 && totals.length < ids.length; i++) {
            yield* TestClock.adjust(100)
            yield* settle
          }
        }).pipe(Effect.scoped, Effect.provide(layerMemory({ outbox, inbox, broker })))

        // Every delivery came twice (duplicateRate 1): the inbox applied each message once.
        expect(totals.sort()).toEqual([0, 1, 2])
        expect(broker.stats().duplicatesInjected).toBeGreaterThanOrEqual(ids.length)
        expect(outbox.rows().map((row) => row.status)).toEqual(["sent", "sent", "sent"])
        expect(
          inbox
            .rows("billing")
            .map((row) => [row.key, row.status])
            .sort(),
        ).toEqual(ids.map((id) => [id, "processed"]).sort())
      }).pipe(Effect.provide(TestClock.layer())),
    ))

  test("layerMemory() with no handles provides every port a relay and an inbox need", () =>
    Effect.runPromise(
      Effect.gen(function* () {
        const relay = yield* Relay.make()
        const consumer = yield* Inbox.make({
          consumer: "c",
          handlers: [Inbox.handler(OrderPlaced, () => Effect.void)],
        })
        expect((yield* relay.stats).published).toBe(0)
        expect((yield* consumer.stats).processed).toBe(0)
      }).pipe(Effect.scoped, Effect.provide(Layer.merge(layerMemory(), TestClock.layer()))),
    ))
})
