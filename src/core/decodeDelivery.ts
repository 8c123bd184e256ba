/**
 * From a raw delivery to either a handler with a validated payload, or a row
 * that can only be recorded dead (no id, no type, unknown contract, invalid
 * payload, a dedupe key function that threw). Pure but for hashing.
 */
import { Effect } from "effect"
import type { Registry } from "../Contract.ts"
import type { InboxRow } from "../ports/InboxStore.ts"
import type { Delivery, PartitionPosition } from "../ports/Transport.ts"
import { describe, type Envelope, type Handler } from "./handler.ts"
import { DEAD_UPSTREAM_HEADER, positionFromHeaders } from "./position.ts"
import { storableBody, storableRow } from "./storable.ts"

export type Decoded =
  | {
      readonly _tag: "Ok"
      readonly handler: Handler
      readonly payload: unknown
      readonly row: InboxRow
      readonly envelope: Envelope
    }
  | { readonly _tag: "Bad"; readonly row: InboxRow }
  /**
   * Could not be decoded this time (the validator failed: a schema registry
   * down; or decoding died): a transient failure, an attempt spent, dead after
   * maxAttempts. `row` is the row as received, `error` why.
   */
  | { readonly _tag: "Failed"; readonly row: InboxRow; readonly error: string }

const sha256Hex = (text: string) =>
  Effect.promise(async () => {
    const digest = await globalThis.crypto.subtle.digest("SHA-256", new TextEncoder().encode(text))
    return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("")
  })

/** The handlers of one consumer, by `type@version`. */
export type HandlerIndex = ReadonlyMap<string, Handler>

export const indexHandlers = (handlers: ReadonlyArray<Handler>): HandlerIndex =>
  new Map(handlers.map((h) => [`${h.contract.type}@${h.contract.version}`, h]))

/** `attempts` is what the row records as tries made (the delivery's attempt, or 0 when only stored). */
export const decodeDelivery = (
  registry: Registry,
  handlers: HandlerIndex,
  consumer: string,
  delivery: Delivery,
  attempts: number,
): Effect.Effect<Decoded> =>
  decodeOnce(registry, handlers, consumer, delivery, attempts).pipe(
    // A defect while decoding (a validator or upcast that breaks its contract) is this message's
    // failure, counted like any other, never the end of the loop that decodes it.
    Effect.catchDefect((defect) =>
      Effect.succeed(decodingDied(consumer, delivery, attempts, `decoding died: ${describe(defect)}`)),
    ),
  )

// Combinators, not Effect.gen: runs once per delivery, and JavaScriptCore kept recompiling this
// function's generator body for as long as the inbox ran (see inboxConsumer.ts).
const decodeOnce = (
  registry: Registry,
  handlers: HandlerIndex,
  consumer: string,
  delivery: Delivery,
  attempts: number,
): Effect.Effect<Decoded> => {
  const base = {
    consumer,
    type: delivery.type ?? null,
    version: delivery.version ?? null,
    // Made storable (NULs) once, with the rest of the row, by storableRow below.
    headers: delivery.headers,
    partitionKey: delivery.partitionKey ?? null,
    position: positionOfDelivery(delivery) ?? null,
    tenantId: delivery.tenantId ?? null,
    attempts,
  }
  const bad = (key: string, reason: string): Decoded => ({
    _tag: "Bad",
    row: storableRow({
      ...base,
      key,
      payload: null,
      raw: storableBody(delivery.body, delivery.bodyBytes),
      lastError: reason,
    }),
  })
  const failed = (key: string, error: string): Decoded => ({
    _tag: "Failed",
    // As received, payload included: store-then-process stores it, and the processor tries again.
    row: storableRow({ ...base, key, payload: delivery.body, raw: null, lastError: error }),
    error,
  })
  const messageId = delivery.messageId
  // A message without an id still gets a stable key, so its redeliveries collapse into one dead row.
  if (messageId === undefined)
    return Effect.map(sha256Hex(`${delivery.type}\n${delivery.body}`), (hash) =>
      bad(`missing-id:${hash}`, "message has no message id"),
    )
  if (delivery.type === undefined) return Effect.succeed(bad(messageId, "message has no type"))
  // The registry resolves the version (upcasting an older one to the handled contract) and validates.
  return registry.decode(delivery.type, delivery.version, delivery.body).pipe(
    Effect.match({
      onFailure: (error): Decoded =>
        error.retryable ? failed(messageId, error.message) : bad(messageId, error.message),
      onSuccess: ({ contract, payload }): Decoded => {
        const handler = handlers.get(`${contract.type}@${contract.version}`)!
        const envelopeBase = {
          id: messageId,
          type: contract.type,
          version: contract.version,
          headers: delivery.headers,
          partitionKey: delivery.partitionKey,
          position: positionOfDelivery(delivery),
          tenantId: delivery.tenantId,
          attempt: delivery.attempt,
        }
        let dedupeKey = messageId
        if (handler.dedupeKey) {
          try {
            // Scoped by type: two handlers of one consumer keyed by the same business id (an order's
            // OrderPlaced and OrderPaid) must not collide in the inbox.
            dedupeKey = `${contract.type}:${String(handler.dedupeKey(payload, envelopeBase))}`
          } catch (error) {
            return bad(messageId, `dedupeKey threw: ${describe(error)}`)
          }
        }
        return {
          _tag: "Ok",
          handler,
          payload,
          envelope: { ...envelopeBase, dedupeKey },
          row: storableRow({ ...base, key: dedupeKey, payload: delivery.body, raw: null, lastError: null }),
        }
      },
    }),
  )
}

const decodingDied = (consumer: string, delivery: Delivery, attempts: number, error: string): Decoded => ({
  _tag: "Failed",
  row: storableRow({
    key: delivery.messageId ?? `missing-id:${delivery.type}`,
    consumer,
    type: delivery.type ?? null,
    version: delivery.version ?? null,
    payload: null,
    raw: storableBody(delivery.body, delivery.bodyBytes),
    headers: delivery.headers,
    partitionKey: delivery.partitionKey ?? null,
    position: positionOfDelivery(delivery) ?? null,
    tenantId: delivery.tenantId ?? null,
    attempts,
    lastError: error,
  }),
  error,
})

/**
 * The row a tombstone is stored as (a keyed message its producer's relay gave
 * up on, `DEAD_UPSTREAM_HEADER`): a stand-in for itself, which the processor
 * marks processed in its turn without a handler, so its key goes on.
 * Undefined for anything else (an unkeyed message with the header is
 * decoded as usual).
 */
export const tombstoneOf = (consumer: string, delivery: Delivery): InboxRow | undefined => {
  const reason = delivery.headers[DEAD_UPSTREAM_HEADER]
  const position = positionOfDelivery(delivery)
  if (reason === undefined || position === undefined || delivery.messageId === undefined) return undefined
  return storableRow({
    key: delivery.messageId,
    consumer,
    type: delivery.type ?? null,
    version: delivery.version ?? null,
    payload: null,
    raw: null,
    headers: delivery.headers,
    partitionKey: delivery.partitionKey ?? null,
    position,
    tenantId: delivery.tenantId ?? null,
    attempts: 0,
    lastError: `dead upstream: ${reason}`,
    standsInFor: delivery.messageId,
  })
}

/**
 * The delivery's place in its key's sequence: only with a partition key (a
 * number without a key orders nothing). Read from the headers too, where a
 * stored row keeps it.
 */
export const positionOfDelivery = (delivery: Delivery): PartitionPosition | undefined =>
  delivery.partitionKey === undefined
    ? undefined
    : (delivery.position ?? positionFromHeaders(delivery.headers))

/** A stored row as the delivery it came from, for the processor: its attempt is the try about to be made. */
export const rowAsDelivery = (row: InboxRow): Delivery => ({
  messageId: row.key,
  type: row.type ?? undefined,
  version: row.version ?? undefined,
  body: row.payload ?? row.raw ?? "",
  headers: row.headers,
  partitionKey: row.partitionKey ?? undefined,
  ...(row.position ? { position: row.position } : {}),
  tenantId: row.tenantId ?? undefined,
  attempt: row.attempts + 1,
  redelivered: false,
})
