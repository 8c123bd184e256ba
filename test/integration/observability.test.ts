// Metrics, tracing across services, and health, on real PostgreSQL and RabbitMQ.
import { afterAll, beforeAll, expect, test } from "bun:test"
import { Context, Effect, Layer, ManagedRuntime } from "effect"
import { sql } from "kysely"
import * as Inbox from "../../src/Inbox.ts"
import * as Metrics from "../../src/Metrics.ts"
import * as Outbox from "../../src/Outbox.ts"
import * as Relay from "../../src/Relay.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { Note } from "../fixtures/contracts.ts"
import { amqpUrl, uniqueName } from "../support/db.ts"
import { startTcpProxy } from "../support/tcpProxy.ts"
import { eventually, type MigratedDatabase, migratedDatabase, storeLayer } from "../support/txbox.ts"

let t: MigratedDatabase
beforeAll(async () => {
  t = await migratedDatabase("observability")
})
afterAll(async () => {
  await t.close()
})

/** A counter's value from the Prometheus text, summed over its attribute sets matching `filter`. */
const counter = async (name: string, filter = "") => {
  const text = await Effect.runPromise(Metrics.prometheusText)
  return text
    .split("\n")
    .filter((line) => line.startsWith(name) && !line.startsWith("#") && line.includes(filter))
    .reduce((sum, line) => sum + Number(line.split(" ").pop()), 0)
}

const traceIdsSeen = new Map<string, string>()

const start = (exchange: string, consumer: string, amqp = amqpUrl()) => {
  const infra = Layer.mergeAll(storeLayer(t.url), Layer.orDie(AmqpTransport.layer({ url: amqp, exchange })))
  return ManagedRuntime.make(
    Layer.effect(
      HandlesTag,
      Effect.gen(function* () {
        const relay = yield* Relay.make({ pollInterval: "100 millis" })
        const inbox = yield* Inbox.make({
          consumer,
          handlers: [
            Inbox.handler(Note, ({ payload, envelope, trx }) =>
              Effect.gen(function* () {
                const span = yield* Effect.currentSpan
                traceIdsSeen.set(payload.note, span.traceId)
                yield* Effect.promise(() =>
                  sql`INSERT INTO effects (consumer, message_id, note) VALUES (${consumer}, ${envelope.id}, ${payload.note})`.execute(
                    trx,
                  ),
                )
              }),
            ),
          ],
        })
        return { relay, inbox }
      }),
    ).pipe(Layer.provide(infra), Layer.orDie),
  )
}

class HandlesTag extends Context.Service<
  HandlesTag,
  { readonly relay: Relay.RelayHandle; readonly inbox: Inbox.InboxHandle }
>()("test/Handles") {}

const produce = (note: string) =>
  t.db.transaction().execute((trx) =>
    Effect.runPromise(
      Effect.gen(function* () {
        const span = yield* Effect.currentSpan
        yield* Outbox.enqueue(trx, Note, { note })
        return span.traceId
      }).pipe(Effect.withSpan("checkout")),
    ),
  )

test("the consumer's handler span carries the producer's trace id", async () => {
  const runtime = start(uniqueName("obs-trace"), uniqueName("traced"))
  await runtime.runPromise(Effect.void)
  try {
    const note = `trace-${crypto.randomUUID()}`
    const producerTraceId = await produce(note)
    await eventually("the handler ran", async () => traceIdsSeen.has(note))
    expect(traceIdsSeen.get(note)).toBe(producerTraceId)
  } finally {
    await runtime.dispose()
  }
})

test("without a tracer txbox adds no spans of its own: a message carries a traceparent only from the caller's span", async () => {
  const headersOf = async (id: string) =>
    (
      await sql<{
        headers: Record<string, string>
      }>`SELECT headers FROM txbox.outbox WHERE id = ${id}::uuid`.execute(t.db)
    ).rows[0]!.headers
  // No span anywhere (Effect's default, in-memory tracer): no trace to carry on.
  const plain = await t.db
    .transaction()
    .execute((trx) => Effect.runPromise(Outbox.enqueue(trx, Note, { note: "untraced" })))
  expect((await headersOf(plain.id)).traceparent).toBeUndefined()
  // The caller's own span is carried on, not one of txbox's.
  const { id, traceparent } = await t.db.transaction().execute((trx) =>
    Effect.runPromise(
      Effect.gen(function* () {
        const span = yield* Effect.currentSpan
        const written = yield* Outbox.enqueue(trx, Note, { note: "traced" })
        return { id: written.id, traceparent: `00-${span.traceId}-${span.spanId}-01` }
      }).pipe(Effect.withSpan("checkout")),
    ),
  )
  expect((await headersOf(id)).traceparent).toBe(traceparent)
})

test("metrics counters move as the pipeline works", async () => {
  const consumer = uniqueName("metered")
  const runtime = start(uniqueName("obs-metrics"), consumer)
  await runtime.runPromise(Effect.void)
  try {
    const before = {
      published: await counter("txbox_published_total"),
      processed: await counter("txbox_processed_total"),
      batches: await counter("txbox_relay_batch_size_count"),
    }
    // Notes of this test's own: the earlier test's rows (enqueued with no relay running) go out
    // through this relay too, and this consumer may handle them as well.
    const notes = Array.from({ length: 5 }, (_, i) => `${consumer}-m${i}`)
    for (const note of notes) await produce(note)
    await eventually("five effects", async () => {
      const rows = await sql<{
        n: string
      }>`SELECT count(DISTINCT note) AS n FROM effects WHERE consumer = ${consumer} AND note = ANY(${notes})`.execute(
        t.db,
      )
      return Number(rows.rows[0]!.n) === 5
    })
    // The relay counts a batch after its mark, which may commit after the consumer handled it.
    await eventually(
      "the relay's counters",
      async () =>
        (await counter("txbox_published_total")) - before.published >= 5 &&
        (await counter("txbox_relay_batch_size_count")) - before.batches >= 1,
    )
    expect((await counter("txbox_processed_total")) - before.processed).toBeGreaterThanOrEqual(5)
    const text = await Effect.runPromise(Metrics.prometheusText)
    expect(text).toContain("# TYPE txbox_published_total counter")
    expect(text).toContain("# TYPE txbox_outbox_lag_seconds gauge")
    // Effect's Prometheus format; durations in seconds (the unit attribute is not a label).
    expect(text).toContain("# TYPE txbox_relay_publish_seconds histogram")
    expect(text).toMatch(/txbox_relay_publish_seconds_bucket\{le="0\.001"\} \d+/)
    expect(text).toMatch(/txbox_relay_publish_seconds_bucket\{le="\+Inf"\} \d+/)
    expect(text).toMatch(/txbox_handler_seconds_count \d+/)
    expect(text).not.toContain("_ms_bucket")
  } finally {
    await runtime.dispose()
  }
})

test("health reports ready while the broker is connected, and not ready while it is away", async () => {
  const target = new URL(amqpUrl())
  const proxy = await startTcpProxy(target.hostname, Number(target.port))
  const runtime = start(uniqueName("obs-health"), uniqueName("healthy"), proxy.urlFor(amqpUrl()))
  try {
    const handles = await runtime.runPromise(
      Effect.gen(function* () {
        return yield* HandlesTag
      }),
    )
    await eventually("relay ready", async () => (await Effect.runPromise(handles.relay.health)).ready)
    // Ready once its processor has completed a first cycle, too.
    await eventually("inbox ready", async () => (await Effect.runPromise(handles.inbox.health)).ready)
    proxy.block()
    await eventually("relay not ready", async () => !(await Effect.runPromise(handles.relay.health)).ready)
    expect((await Effect.runPromise(handles.relay.health)).brokerConnected).toBe(false)
    expect((await Effect.runPromise(handles.inbox.health)).ready).toBe(false)
    proxy.unblock()
    await eventually("relay ready again", async () => (await Effect.runPromise(handles.relay.health)).ready)
  } finally {
    await runtime.dispose()
    await proxy.close()
  }
})
