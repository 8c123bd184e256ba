// The in-memory broker's own contract (it stands in for RabbitMQ in the demo and in PGlite tests):
// routing, returns, fault switches. A unit test of pure logic; the real broker has its own tests.
import { describe, expect, test } from "bun:test"
import { Effect, Exit, Scope } from "effect"
import type { Delivery, OutgoingMessage } from "../../src/ports/Transport.ts"
import { makeBroker } from "../../src/transport/memory/MemoryTransport.ts"

const message = (id: string, routingKey = "t.a"): OutgoingMessage => ({
  id,
  type: routingKey,
  version: 1,
  routingKey,
  body: "{}",
  headers: {},
  occurredAt: new Date(),
  partitionKey: null,
  tenantId: null,
})

const consume = async (broker: ReturnType<typeof makeBroker>, consumer: string, count: number) => {
  const seen: Delivery[] = []
  const scope = Effect.runSync(Scope.make())
  await Effect.runPromise(
    Scope.provide(
      broker.transport.subscribe({ consumer, types: ["t.a"], prefetch: 4 }, (d) =>
        Effect.sync(() => {
          seen.push(d)
          return { _tag: "Ack" } as const
        }),
      ),
      scope,
    ),
  )
  const deadline = Date.now() + 2000
  while (seen.length < count && Date.now() < deadline) await Bun.sleep(5)
  await Bun.sleep(20)
  await Effect.runPromise(Scope.close(scope, Exit.void))
  return seen
}

describe("memory transport", () => {
  test("routes to bound queues; a message no queue takes comes back Returned", async () => {
    const broker = makeBroker()
    broker.declare("c", ["t.a"])
    const outcomes = await Effect.runPromise(broker.transport.publish([message("1"), message("2", "t.b")]))
    expect(outcomes.map((o) => o._tag)).toEqual(["Confirmed", "Returned"])
    expect(broker.depth("c")).toBe(1)
  })

  test("duplicateRate delivers a message a second time, marked redelivered", async () => {
    const draws = [0] // the first delivery draws a duplicate, every later draw does not
    const broker = makeBroker({ duplicateRate: 0.5, random: () => draws.shift() ?? 0.99 })
    broker.declare("c", ["t.a"])
    await Effect.runPromise(broker.transport.publish([message("1")]))
    const seen = await consume(broker, "c", 2)
    expect(seen.map((d) => [d.messageId, d.redelivered])).toEqual([
      ["1", false],
      ["1", true],
    ])
  })

  test("duplicateRate 1 delivers every message exactly twice: a copy is not copied again", async () => {
    const broker = makeBroker({ duplicateRate: 1 })
    broker.declare("c", ["t.a"])
    await Effect.runPromise(broker.transport.publish([message("1"), message("2")]))
    const seen = await consume(broker, "c", 4)
    expect(seen.map((d) => `${d.messageId}:${d.redelivered}`).sort()).toEqual([
      "1:false",
      "1:true",
      "2:false",
      "2:true",
    ])
    expect(broker.stats().duplicatesInjected).toBe(2)
  })

  test("publishFailureRate nacks, and `down` fails the whole publish as an outage", async () => {
    const broker = makeBroker({ publishFailureRate: 1, random: () => 0 })
    broker.declare("c", ["t.a"])
    const outcomes = await Effect.runPromise(broker.transport.publish([message("1")]))
    expect(outcomes[0]?._tag).toBe("Nacked")
    broker.setFaults({ publishFailureRate: 0, down: true })
    const exit = await Effect.runPromiseExit(broker.transport.publish([message("2")]))
    expect(Exit.isFailure(exit)).toBe(true)
    expect(await Effect.runPromise(broker.transport.isConnected)).toBe(false)
  })

  test("lostAckRate 1 redelivers a processed message", async () => {
    const broker = makeBroker({ lostAckRate: 1, random: () => 0 })
    broker.declare("c", ["t.a"])
    await Effect.runPromise(broker.transport.publish([message("1")]))
    const seen = await consume(broker, "c", 3)
    expect(seen.length).toBeGreaterThanOrEqual(2)
    expect(seen[1]?.redelivered).toBe(true)
    expect(broker.stats().acksLost).toBeGreaterThanOrEqual(1)
  })
})
