/**
 * txbox's metrics, as Effect `Metric`s: they work with whatever exporter the
 * service already wires into Effect (OpenTelemetry through `effect/observability`),
 * and `prometheusText` renders them for a plain `/metrics` endpoint.
 * Updated once per batch, not per message, to stay off the hot path.
 */
import { Effect, Metric } from "effect"

const durations: ReadonlyArray<number> = Metric.exponentialBoundaries({ start: 1, factor: 2, count: 14 }) // 1 ms … 8 s

export const published: Metric.Counter<number> = Metric.counter("txbox_published_total", {
  description: "Outbox messages confirmed by the broker and marked sent",
  incremental: true,
})
export const retried: Metric.Counter<number> = Metric.counter("txbox_retried_total", {
  description: "Messages scheduled for another attempt (attribute side = outbox | inbox)",
  incremental: true,
})
export const dead: Metric.Counter<number> = Metric.counter("txbox_dead_total", {
  description: "Messages given up on (attribute side = outbox | inbox)",
  incremental: true,
})
export const processed: Metric.Counter<number> = Metric.counter("txbox_processed_total", {
  description: "Inbox messages whose handler committed",
  incremental: true,
})
export const duplicates: Metric.Counter<number> = Metric.counter("txbox_duplicates_total", {
  description: "Inbox deliveries skipped because their key was already there",
  incremental: true,
})
export const outboxLag: Metric.Gauge<number> = Metric.gauge("txbox_outbox_lag_seconds", {
  description: "Age of the oldest due, unpublished outbox message (0 when none)",
})
export const batchSize: Metric.Histogram<number> = Metric.histogram("txbox_relay_batch_size", {
  description: "Rows per relay claim",
  boundaries: Metric.exponentialBoundaries({ start: 1, factor: 4, count: 8 }),
})
export const claimDuration: Metric.Histogram<number> = Metric.histogram("txbox_relay_claim_ms", {
  description: "Claim statement",
  boundaries: durations,
})
export const publishDuration: Metric.Histogram<number> = Metric.histogram("txbox_relay_publish_ms", {
  description: "Publishing one batch until every confirm",
  boundaries: durations,
})
export const markDuration: Metric.Histogram<number> = Metric.histogram("txbox_relay_mark_ms", {
  description: "Mark statement",
  boundaries: durations,
})
export const handlerDuration: Metric.Histogram<number> = Metric.histogram("txbox_handler_ms", {
  description: "Inbox handler, including its transaction",
  boundaries: durations,
})

/** Runs `effect` and records its duration in milliseconds into `histogram`. */
export const timed = <A, E, R>(
  histogram: Metric.Metric<number, unknown>,
  effect: Effect.Effect<A, E, R>,
): Effect.Effect<A, E, R> =>
  Effect.suspend(() => {
    const start = performance.now()
    return Effect.ensuring(
      effect,
      Effect.suspend(() => Metric.update(histogram, performance.now() - start)),
    )
  })

const label = (attributes: Metric.Metric.AttributeSet | undefined) => {
  const entries = Object.entries(attributes ?? {})
  if (entries.length === 0) return ""
  return `{${entries.map(([k, v]) => `${k}="${String(v).replace(/["\\\n]/g, "_")}"`).join(",")}}`
}

/** Every registered `txbox_*` metric in the Prometheus text exposition format. */
export const prometheusText: Effect.Effect<string> = Effect.map(Metric.snapshot, (snapshots) => {
  const lines: string[] = []
  const described = new Set<string>()
  for (const s of snapshots) {
    if (!s.id.startsWith("txbox_")) continue
    const kind =
      s.type === "Counter"
        ? "counter"
        : s.type === "Gauge"
          ? "gauge"
          : s.type === "Histogram"
            ? "histogram"
            : "untyped"
    if (!described.has(s.id)) {
      described.add(s.id)
      if (s.description) lines.push(`# HELP ${s.id} ${s.description}`)
      lines.push(`# TYPE ${s.id} ${kind}`)
    }
    const attrs = label(s.attributes)
    if (s.type === "Counter") lines.push(`${s.id}${attrs} ${String(s.state.count)}`)
    else if (s.type === "Gauge") lines.push(`${s.id}${attrs} ${String(s.state.value)}`)
    else if (s.type === "Histogram") {
      const base = attrs ? attrs.slice(1, -1) + "," : ""
      for (const [bound, count] of s.state.buckets) {
        // Effect keeps an Infinity bucket of its own; Prometheus spells it +Inf, written below.
        if (Number.isFinite(bound)) lines.push(`${s.id}_bucket{${base}le="${bound}"} ${count}`)
      }
      lines.push(`${s.id}_bucket{${base}le="+Inf"} ${s.state.count}`)
      lines.push(`${s.id}_sum${attrs} ${s.state.sum}`)
      lines.push(`${s.id}_count${attrs} ${s.state.count}`)
    }
  }
  return `${lines.join("\n")}\n`
})
