// RelayConfig.batchEvery sets the polling relay's cadence (issue #21's latency / cost trade): a
// relay with a long batchEvery publishes the same trickle in far fewer batches than one at the
// default, and every row once. On real PostgreSQL and RabbitMQ; counts from the outbox table and
// the broker, batches from the relay's own counters.
import { afterAll, beforeAll, expect, test } from "bun:test"
import { Effect, Exit, Layer, ManagedRuntime, Scope } from "effect"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import * as Outbox from "../../src/Outbox.ts"
import * as Relay from "../../src/Relay.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { collect } from "../support/amqp.ts"
import { amqpUrl, uniqueName } from "../support/db.ts"
import {
  eventually,
  type MigratedDatabase,
  migratedDatabase,
  outboxCounts,
  storeLayer,
} from "../support/txbox.ts"

const Tick = defineEvent({
  type: "cadence.tick",
  version: 1,
  schema: v.object({ n: v.number() }),
})

let t: MigratedDatabase
beforeAll(async () => {
  t = await migratedDatabase("relay_cadence")
})
afterAll(async () => {
  await t.close()
})

const enqueue = (n: number) =>
  t.db.transaction().execute((trx) => Effect.runPromise(Outbox.enqueue(trx, Tick, { n })))

/** A relay with `config` publishes a trickle of `count` rows, 25 ms apart; its batches. */
const batchesFor = async (config: Relay.RelayConfig, count: number): Promise<number> => {
  await t.db.deleteFrom("txbox.outbox").execute()
  const exchange = uniqueName("cadence")
  const seen = await collect(amqpUrl(), exchange, Tick.type)
  const runtime = ManagedRuntime.make(
    Layer.mergeAll(storeLayer(t.url), Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange }))),
  )
  const scope = await runtime.runPromise(Scope.make())
  try {
    const handle = await runtime.runPromise(Relay.make(config).pipe(Scope.provide(scope)))
    for (let n = 0; n < count; n++) {
      await enqueue(n)
      await Bun.sleep(25)
    }
    await eventually("every row sent", async () => (await outboxCounts(t.db)).sent === count)
    await eventually("every message routed", async () => seen.counts.size === count)
    expect([...seen.counts.values()].every((n) => n === 1)).toBe(true)
    const stats = await Effect.runPromise(handle.stats)
    expect(stats.published).toBe(count)
    return stats.batches
  } finally {
    await runtime.runPromise(Scope.close(scope, Exit.void))
    await runtime.dispose()
    await seen.close()
  }
}

test("batchEvery spaces the polling relay's batches: 400 ms takes a 3 s trickle in a handful, the default in dozens", async () => {
  // 40 rows a second for 3 s. At the default (25 ms) the relay looks every 50 ms at this rate:
  // ~60 batches. At 400 ms it looks every 800 ms, or 400 ms after its last look when a producer's
  // NOTIFY comes first: 4–8 batches.
  const spaced = await batchesFor({ batchEvery: "400 millis" }, 120)
  const byDefault = await batchesFor({}, 120)
  expect(spaced).toBeLessThanOrEqual(12)
  expect(byDefault).toBeGreaterThanOrEqual(25)
}, 60_000)
