// txbox's metrics from the root entry: durations recorded in seconds, rendered by Effect's own
// Prometheus formatter.
import { expect, test } from "bun:test"
import { Effect, Metric } from "effect"
import { PrometheusMetrics } from "effect/observability"
import { Metrics } from "../../src/index.ts"

const histogram = (name: string) =>
  Effect.runSync(Metric.snapshot).find((s) => s.id === name && s.type === "Histogram")

test("the root entry exports Metrics; durations are histograms in seconds with boundaries from 1 ms", async () => {
  const before = histogram("txbox_handler_seconds")
  const countBefore = before?.type === "Histogram" ? before.state.count : 0
  const sumBefore = before?.type === "Histogram" ? before.state.sum : 0
  await Effect.runPromise(Metrics.timed(Metrics.handlerDuration, Effect.sleep("30 millis")))
  const after = histogram("txbox_handler_seconds")!
  expect(after.type).toBe("Histogram")
  if (after.type !== "Histogram") return
  expect(after.state.count).toBe(countBefore + 1)
  const recorded = after.state.sum - sumBefore
  // 30 ms of sleep is 0.03 s, not 30 (milliseconds); generous bounds for a busy machine.
  expect(recorded).toBeGreaterThanOrEqual(0.025)
  expect(recorded).toBeLessThan(5)
  expect(after.state.buckets[0]![0]).toBe(0.001)
  expect(after.state.buckets.at(-2)![0]).toBe(4.096)
  const relay = [
    [Metrics.claimDuration, "txbox_relay_claim_seconds"],
    [Metrics.publishDuration, "txbox_relay_publish_seconds"],
    [Metrics.markDuration, "txbox_relay_mark_seconds"],
  ] as const
  for (const [metric, name] of relay) {
    await Effect.runPromise(Metric.update(metric, 0.002))
    expect(histogram(name)).toBeDefined()
  }
})

test("prometheusText is Effect's Prometheus format: seconds in the names, the unit attribute not a label", async () => {
  await Effect.runPromise(Metric.update(Metrics.published, 3))
  await Effect.runPromise(Metric.update(Metrics.outboxLag, 1.5))
  await Effect.runPromise(Metrics.timed(Metrics.handlerDuration, Effect.void))
  const text = await Effect.runPromise(Metrics.prometheusText)
  expect(text).toBe(await Effect.runPromise(PrometheusMetrics.format()))
  expect(text).toContain("# TYPE txbox_published_total counter")
  expect(text).toMatch(/^txbox_published_total \d+$/m)
  expect(text).toContain("# TYPE txbox_outbox_lag_seconds gauge")
  expect(text).toMatch(/^txbox_outbox_lag_seconds 1\.5$/m)
  expect(text).toContain("# HELP txbox_handler_seconds Inbox handler, including its transaction, in seconds")
  expect(text).toContain("# TYPE txbox_handler_seconds histogram")
  expect(text).toMatch(/^txbox_handler_seconds_bucket\{le="0\.001"\} \d+$/m)
  expect(text).toMatch(/^txbox_handler_seconds_bucket\{le="4\.096"\} \d+$/m)
  expect(text).toMatch(/^txbox_handler_seconds_bucket\{le="\+Inf"\} \d+$/m)
  expect(text).toMatch(/^txbox_handler_seconds_sum [\d.e-]+$/m)
  expect(text).not.toContain("unit=")
  expect(text).not.toMatch(/txbox_\w+_ms/)
})
