// Spans and metrics exported over OTLP (Effect's own exporter, OTLP/HTTP JSON) to a receiver this
// test starts, for a message that goes enqueue → relay → RabbitMQ → inbox on real PostgreSQL and
// RabbitMQ: one trace from the producer's span to the consumer's handler, OpenTelemetry messaging
// attributes and span kinds on the way, and txbox's metrics in seconds.
import { afterAll, beforeAll, expect, test } from "bun:test"
import { Context, Effect, Layer, ManagedRuntime } from "effect"
import { FetchHttpClient } from "effect/http"
import { Otlp, OtlpExporter } from "effect/observability"
import { sql } from "kysely"
import * as Inbox from "../../src/Inbox.ts"
import * as Outbox from "../../src/Outbox.ts"
import * as Relay from "../../src/Relay.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { Note } from "../fixtures/contracts.ts"
import { amqpUrl, uniqueName } from "../support/db.ts"
import { eventually, type MigratedDatabase, migratedDatabase, storeLayer } from "../support/txbox.ts"

// OTLP/JSON, as much of it as the test reads.
interface AnyValue {
  readonly stringValue?: string
  readonly intValue?: number | string
  readonly doubleValue?: number
  readonly boolValue?: boolean
}
interface KeyValue {
  readonly key: string
  readonly value: AnyValue
}
interface OtlpSpan {
  readonly traceId: string
  readonly spanId: string
  readonly parentSpanId?: string
  readonly name: string
  readonly kind: number
  readonly attributes: ReadonlyArray<KeyValue>
  readonly links: ReadonlyArray<{ readonly traceId: string; readonly spanId: string }>
  readonly status: { readonly code: number }
}
interface OtlpMetric {
  readonly name: string
  readonly unit?: string
  readonly sum?: {
    readonly dataPoints: ReadonlyArray<{ readonly asInt?: number | string; readonly asDouble?: number }>
  }
  readonly histogram?: {
    readonly dataPoints: ReadonlyArray<{
      readonly count: number | string
      readonly sum?: number
      readonly explicitBounds: ReadonlyArray<number>
    }>
  }
}

// OTLP span kinds (opentelemetry-proto trace.proto).
const INTERNAL = 1
const CLIENT = 3
const PRODUCER = 4
const CONSUMER = 5

/** A minimal OTLP/HTTP receiver: keeps every JSON body posted to /v1/traces and /v1/metrics. */
const startReceiver = () => {
  const spans: OtlpSpan[] = []
  const metrics: OtlpMetric[] = []
  const contentTypes = new Set<string>()
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch: async (request) => {
      const path = new URL(request.url).pathname
      contentTypes.add(request.headers.get("content-type") ?? "")
      const body = (await request.json()) as Record<string, ReadonlyArray<Record<string, unknown>>>
      if (path === "/v1/traces") {
        for (const resource of body.resourceSpans ?? [])
          for (const scope of (resource.scopeSpans as ReadonlyArray<{ spans: OtlpSpan[] }>) ?? [])
            spans.push(...scope.spans)
      } else if (path === "/v1/metrics") {
        for (const resource of body.resourceMetrics ?? [])
          for (const scope of (resource.scopeMetrics as ReadonlyArray<{ metrics: OtlpMetric[] }>) ?? [])
            metrics.push(...scope.metrics)
      }
      return Response.json({})
    },
  })
  return {
    url: `http://127.0.0.1:${server.port}`,
    spans,
    metrics,
    contentTypes,
    stop: () => server.stop(true),
  }
}

const attribute = (span: OtlpSpan, key: string): string | number | boolean | undefined => {
  const value = span.attributes.find((a) => a.key === key)?.value
  if (value === undefined) return undefined
  if (value.intValue !== undefined) return Number(value.intValue)
  return value.stringValue ?? value.doubleValue ?? value.boolValue
}

class Handles extends Context.Service<Handles, { readonly relay: Relay.RelayHandle }>()("test/OtlpHandles") {}

let t: MigratedDatabase
let receiver: ReturnType<typeof startReceiver>
beforeAll(async () => {
  t = await migratedDatabase("otlp")
  receiver = startReceiver()
})
afterAll(async () => {
  receiver.stop()
  await t.close()
})

test("producer → relay → consumer spans share one trace over OTLP, with messaging conventions; metrics in seconds", async () => {
  const exchange = uniqueName("otlp-ex")
  const consumer = uniqueName("otlp")
  const handled = new Set<string>()

  // What the README tells a service to write: Effect's OTLP layer over fetch.
  const telemetry = Otlp.layerJson({
    baseUrl: receiver.url,
    resource: { serviceName: "txbox-otlp-test" },
    tracerExportInterval: "200 millis",
    metricsExportInterval: "200 millis",
  }).pipe(Layer.provide(FetchHttpClient.layer))

  const infra = Layer.mergeAll(
    storeLayer(t.url),
    Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange })),
    telemetry,
  )
  const services = Layer.effect(
    Handles,
    Effect.gen(function* () {
      const relay = yield* Relay.make({ pollInterval: "100 millis" })
      yield* Inbox.make({
        consumer,
        handlers: [
          Inbox.handler(Note, ({ payload, envelope, trx }) =>
            Effect.gen(function* () {
              yield* Effect.promise(() =>
                sql`INSERT INTO effects (consumer, message_id, note) VALUES (${consumer}, ${envelope.id}, ${payload.note})`.execute(
                  trx,
                ),
              )
              handled.add(envelope.id)
            }),
          ),
        ],
      })
      return { relay }
    }),
  ).pipe(Layer.orDie)
  const runtime = ManagedRuntime.make(Layer.provideMerge(services, infra))
  await runtime.runPromise(Effect.void)

  let id = ""
  let checkoutTraceId = ""
  try {
    // The producer: the service's own span, and the enqueue in its transaction.
    await t.db.transaction().execute((trx) =>
      runtime.runPromise(
        Effect.gen(function* () {
          checkoutTraceId = (yield* Effect.currentSpan).traceId
          id = (yield* Outbox.enqueue(trx, Note, { note: "otlp" })).id
        }).pipe(Effect.withSpan("checkout")),
      ),
    )
    await eventually("the handler ran", async () => handled.has(id))
    // Flush what is buffered instead of waiting for the interval.
    await runtime.runPromise(Effect.flatMap(OtlpExporter.Flusher, (f) => f.flush))
    await eventually("the consumer's span was exported", async () =>
      receiver.spans.some((s) => s.name === "Inbox.handle" && attribute(s, "messaging.message.id") === id),
    )
    await eventually("txbox's metrics were exported", async () =>
      receiver.metrics.some((m) => m.name === "txbox_relay_publish_seconds"),
    )
  } finally {
    await runtime.dispose()
  }

  expect([...receiver.contentTypes]).toContain("application/json")
  const checkout = receiver.spans.find((s) => s.name === "checkout" && s.traceId === checkoutTraceId)!
  expect(checkout).toBeDefined()
  const enqueue = receiver.spans.find(
    (s) => s.name === "Outbox.enqueue" && s.parentSpanId === checkout.spanId,
  )!
  expect(enqueue).toBeDefined()
  expect(enqueue.kind).toBe(INTERNAL)

  // The relay's PRODUCER span for this message: a child of the enqueue, in the producer's trace.
  const publish = receiver.spans.find(
    (s) => s.name === `publish ${exchange}` && attribute(s, "messaging.message.id") === id,
  )!
  expect(publish).toBeDefined()
  expect(publish.kind).toBe(PRODUCER)
  expect(publish.traceId).toBe(checkoutTraceId)
  expect(publish.parentSpanId).toBe(enqueue.spanId)
  expect(attribute(publish, "messaging.system")).toBe("rabbitmq")
  expect(attribute(publish, "messaging.destination.name")).toBe(exchange)
  expect(attribute(publish, "messaging.operation.type")).toBe("send")
  expect(attribute(publish, "messaging.operation.name")).toBe("publish")
  expect(attribute(publish, "messaging.rabbitmq.destination.routing_key")).toBe(Note.type)
  expect(publish.status.code).not.toBe(2)
  // Linked to the relay's batch: a CLIENT span in the relay's own trace.
  const batch = receiver.spans.find(
    (s) => s.name === "AmqpTransport.publish" && publish.links.some((l) => l.spanId === s.spanId),
  )!
  expect(batch).toBeDefined()
  expect(batch.kind).toBe(CLIENT)
  expect(attribute(batch, "messaging.system")).toBe("rabbitmq")
  expect(attribute(batch, "messaging.destination.name")).toBe(exchange)
  expect(attribute(batch, "messaging.operation.type")).toBe("send")
  expect(attribute(batch, "messaging.batch.message_count")).toBeGreaterThanOrEqual(1)
  expect(receiver.spans.some((s) => s.name === "Relay.publish" && s.spanId === batch.parentSpanId)).toBe(true)

  // The consumer's CONSUMER span: a child of the relay's PRODUCER span, same trace.
  const handle = receiver.spans.find(
    (s) => s.name === "Inbox.handle" && attribute(s, "messaging.message.id") === id,
  )!
  expect(handle.kind).toBe(CONSUMER)
  expect(handle.traceId).toBe(checkoutTraceId)
  expect(handle.parentSpanId).toBe(publish.spanId)
  expect(attribute(handle, "messaging.system")).toBe("rabbitmq")
  expect(attribute(handle, "messaging.destination.name")).toBe(exchange)
  expect(attribute(handle, "messaging.operation.type")).toBe("process")
  expect(attribute(handle, "messaging.operation.name")).toBe("process")
  expect(attribute(handle, "txbox.consumer")).toBe(consumer)

  // Metrics: counters, and durations as histograms in seconds (unit "s", bounds from 1 ms).
  const published = receiver.metrics.filter((m) => m.name === "txbox_published_total")
  expect(published.length).toBeGreaterThan(0)
  const latest = published.at(-1)!.sum!.dataPoints.map((p) => Number(p.asInt ?? p.asDouble ?? 0))
  expect(Math.max(...latest)).toBeGreaterThanOrEqual(1)
  for (const name of ["txbox_relay_publish_seconds", "txbox_handler_seconds"]) {
    const metric = receiver.metrics.filter((m) => m.name === name).at(-1)!
    expect(metric.unit).toBe("s")
    const point = metric.histogram!.dataPoints.find((p) => Number(p.count) > 0)!
    expect(point.explicitBounds[0]).toBe(0.001)
    // Seconds, not milliseconds: one local publish or handler takes far less than 10 s each.
    expect(point.sum! / Number(point.count)).toBeLessThan(10)
  }
  expect(receiver.metrics.some((m) => m.name.endsWith("_ms"))).toBe(false)
})
