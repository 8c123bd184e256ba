/**
 * txbox's metrics, as Effect `Metric`s: they go wherever the service already
 * exports Effect's metrics (`Otlp.layerJson` from `effect/observability` for
 * OpenTelemetry), and `prometheusText` (Effect's own `PrometheusMetrics.format`)
 * renders them for a plain `/metrics` endpoint. Durations are in seconds, as
 * Prometheus and OpenTelemetry name them. Updated once per batch, not per
 * message, to stay off the hot path.
 */
import { Effect, Metric } from "effect"
import { PrometheusMetrics } from "effect/observability"

/**
 * Effect's unit attribute: OTLP exports it as the metric's unit (UCUM `s`);
 * the Prometheus format leaves it out (the `_seconds` suffix says it).
 */
const seconds = { unit: "seconds" } as const
/** Histogram boundaries for durations, in seconds: 1 ms … 4.096 s, doubling (then +Inf). */
const durations: ReadonlyArray<number> = Metric.exponentialBoundaries({ start: 0.001, factor: 2, count: 14 })

/** Counter `txbox_published_total`: outbox messages the broker confirmed and the relay marked sent. */
export const published: Metric.Counter<number> = Metric.counter("txbox_published_total", {
  description: "Outbox messages confirmed by the broker and marked sent",
  incremental: true,
})
/** Counter `txbox_retried_total`: messages scheduled for another attempt, by `side` (outbox or inbox). */
export const retried: Metric.Counter<number> = Metric.counter("txbox_retried_total", {
  description: "Messages scheduled for another attempt (attribute side = outbox | inbox)",
  incremental: true,
})
/** Counter `txbox_dead_total`: messages given up on, by `side` (outbox or inbox). */
export const dead: Metric.Counter<number> = Metric.counter("txbox_dead_total", {
  description: "Messages given up on (attribute side = outbox | inbox)",
  incremental: true,
})
/** Counter `txbox_processed_total`: inbox messages whose handler committed. */
export const processed: Metric.Counter<number> = Metric.counter("txbox_processed_total", {
  description: "Inbox messages whose handler committed",
  incremental: true,
})
/** Counter `txbox_duplicates_total`: inbox deliveries skipped because their dedupe key was already stored. */
export const duplicates: Metric.Counter<number> = Metric.counter("txbox_duplicates_total", {
  description: "Inbox deliveries skipped because their key was already there",
  incremental: true,
})
/** Gauge `txbox_outbox_lag_seconds`: age of the oldest due, unpublished outbox message (0 when none). */
export const outboxLag: Metric.Gauge<number> = Metric.gauge("txbox_outbox_lag_seconds", {
  description: "Age of the oldest due, unpublished outbox message (0 when none)",
  attributes: seconds,
})
/** Gauge `txbox_wal_retained_bytes`: WAL the relay's replication slot keeps on the server (a WAL relay only). */
export const walRetained: Metric.Gauge<number> = Metric.gauge("txbox_wal_retained_bytes", {
  description: "WAL the WAL relay's replication slot keeps on the server, bytes",
})
/** Histogram `txbox_relay_batch_size`: rows per relay claim. */
export const batchSize: Metric.Histogram<number> = Metric.histogram("txbox_relay_batch_size", {
  description: "Rows per relay claim",
  boundaries: Metric.exponentialBoundaries({ start: 1, factor: 4, count: 8 }),
})
/** Histogram `txbox_relay_claim_seconds`: how long the relay's claim statement takes. */
export const claimDuration: Metric.Histogram<number> = Metric.histogram("txbox_relay_claim_seconds", {
  description: "Claim statement, in seconds",
  attributes: seconds,
  boundaries: durations,
})
/** Histogram `txbox_relay_publish_seconds`: publishing one batch until the broker has confirmed every message. */
export const publishDuration: Metric.Histogram<number> = Metric.histogram("txbox_relay_publish_seconds", {
  description: "Publishing one batch until every confirm, in seconds",
  attributes: seconds,
  boundaries: durations,
})
/** Histogram `txbox_relay_mark_seconds`: how long the relay's mark statement (sent, retry, dead) takes. */
export const markDuration: Metric.Histogram<number> = Metric.histogram("txbox_relay_mark_seconds", {
  description: "Mark statement, in seconds",
  attributes: seconds,
  boundaries: durations,
})
/** Histogram `txbox_handler_seconds`: an inbox handler, including its transaction. */
export const handlerDuration: Metric.Histogram<number> = Metric.histogram("txbox_handler_seconds", {
  description: "Inbox handler, including its transaction, in seconds",
  attributes: seconds,
  boundaries: durations,
})

/** Runs `effect` and records its duration in seconds into `histogram`. */
export const timed = <A, E, R>(
  histogram: Metric.Metric<number, unknown>,
  effect: Effect.Effect<A, E, R>,
): Effect.Effect<A, E, R> =>
  Effect.suspend(() => {
    const start = performance.now()
    return Effect.ensuring(
      effect,
      Effect.suspend(() => Metric.update(histogram, (performance.now() - start) / 1000)),
    )
  })

/**
 * Every metric registered in the process (txbox's `txbox_*` ones and the
 * service's own) in the Prometheus text exposition format: Effect's
 * `PrometheusMetrics.format()`, for a `/metrics` endpoint. With an Effect
 * `HttpRouter`, `PrometheusMetrics.layerHttp()` serves it for you.
 */
export const prometheusText: Effect.Effect<string> = PrometheusMetrics.format()
