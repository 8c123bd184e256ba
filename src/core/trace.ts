/** W3C trace context (`traceparent`) to and from Effect spans. */
import { Effect, Tracer } from "effect"

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/

/** `span` as a `traceparent` header, if its ids make a valid one. */
export const traceparentOf = (span: Tracer.AnySpan): string | undefined => {
  const traceId = span.traceId.padStart(32, "0").slice(-32)
  const spanId = span.spanId.padStart(16, "0").slice(-16)
  return TRACEPARENT.test(`00-${traceId}-${spanId}-01`)
    ? `00-${traceId}-${spanId}-${span.sampled ? "01" : "00"}`
    : undefined
}

/**
 * Whether spans go anywhere. Effect's default tracer (`Tracer.nativeTracer`)
 * keeps them in memory only; with it txbox makes none of its own spans, since
 * a span per message or batch cost the relay and the inbox a large share of
 * their CPU for nothing anyone could see (bench/cost.ts). A span of the
 * caller's is still carried on as the message's `traceparent`.
 */
export const isTracing: Effect.Effect<boolean> = Effect.map(Effect.tracer, (t) => t !== Tracer.nativeTracer)

/** `Effect.withSpan`, only when a tracer other than Effect's in-memory default is installed. */
export const spanned =
  (name: string, options?: Tracer.SpanOptionsNoTrace, traceOptions?: Tracer.TraceOptions) =>
  <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
    Effect.flatMap(Effect.tracer, (t) =>
      t === Tracer.nativeTracer ? self : Effect.withSpan(name, options, traceOptions)(self),
    )

/** Parses a `traceparent` into an external parent span for the consumer's span. */
export const parentFromTraceparent = (header: string | undefined): Tracer.ExternalSpan | undefined => {
  if (!header) return undefined
  const match = TRACEPARENT.exec(header.trim().toLowerCase())
  if (!match) return undefined
  return Tracer.externalSpan({ traceId: match[1]!, spanId: match[2]!, sampled: match[3] === "01" })
}
