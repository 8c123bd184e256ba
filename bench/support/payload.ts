// The bench's one message: an order event of BODY_BYTES bytes of JSON, the same shape whether the
// database renders it (jsonb) or the bench builds it here (for the raw ceilings and the inbox).
import { randomUUID } from "node:crypto"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"

export const BODY_BYTES = 250

export const OrderPlaced = defineEvent({
  type: "bench.order-placed",
  version: 1,
  schema: v.object({
    orderId: v.pipe(v.string(), v.uuid()),
    customerId: v.string(),
    serial: v.number(),
    total: v.number(),
    currency: v.string(),
    lines: v.number(),
    /** Wall-clock milliseconds (fractional) when the producer committed; 0 in backlogs. */
    committedAt: v.number(),
    note: v.string(),
  }),
})
export type OrderPlaced = typeof OrderPlaced.Type

/** A payload whose JSON text is BODY_BYTES long (the `note` pads it). */
export const makePayload = (serial: number, committedAt = 0): OrderPlaced => {
  const payload = {
    orderId: randomUUID(),
    customerId: randomUUID(),
    serial,
    total: 123.45,
    currency: "EUR",
    lines: 3,
    committedAt,
    note: "",
  }
  const bytes = Buffer.byteLength(JSON.stringify(payload))
  payload.note = "x".repeat(Math.max(0, BODY_BYTES - bytes))
  return payload
}

export const makeBody = (serial: number): string => JSON.stringify(makePayload(serial))

/**
 * Wall-clock milliseconds with sub-millisecond resolution, comparable between processes on one
 * machine (Date.now() has whole milliseconds only, too coarse for a p50 of a few ms).
 */
export const wallMs = (): number => performance.timeOrigin + performance.now()
