/** W3C trace context (`traceparent`) to and from Effect spans. */
import { Effect, Option, Tracer } from "effect"

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/

/** `span` as a `traceparent` header, if its ids make a valid one. */
export const traceparentOf = (span: Tracer.AnySpan): string | undefined => {
  const traceId = span.traceId.padStart(32, "0").slice(-32)
  const spanId = span.spanId.padStart(16, "0").slice(-16)
  return TRACEPARENT.test(`00-${traceId}-${spanId}-01`)
    ? `00-${traceId}-${spanId}-${span.sampled ? "01" : "00"}`
    : undefined
}

/** The current span as a `traceparent` header, if there is a span. */
export const currentTraceparent: Effect.Effect<string | undefined> = Effect.map(
  Effect.option(Effect.currentSpan),
  (span) => Option.match(span, { onNone: () => undefined, onSome: traceparentOf }),
)

/** Parses a `traceparent` into an external parent span for the consumer's span. */
export const parentFromTraceparent = (header: string | undefined): Tracer.ExternalSpan | undefined => {
  if (!header) return undefined
  const match = TRACEPARENT.exec(header.trim().toLowerCase())
  if (!match) return undefined
  return Tracer.externalSpan({ traceId: match[1]!, spanId: match[2]!, sampled: match[3] === "01" })
}
