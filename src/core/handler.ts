/**
 * Inbox handlers: what a service registers per contract, what a handler is
 * given, and how one runs (its span, its duration metric, its failure as a
 * value the verdict rule reads).
 */
import { Cause, Clock, Effect } from "effect"
import type { Transaction } from "kysely"
import type { AnyContract, PayloadOf } from "../Contract.ts"
import * as Metrics from "../Metrics.ts"
import type { MessagingIdentity, PartitionPosition } from "../ports/Transport.ts"
import { cutShortOnTimer, onLiveClock } from "./liveClock.ts"
import { isTracing, parentFromTraceparent } from "./trace.ts"

/** What a handler knows about the message besides its payload. */
export interface Envelope {
  /** The message id; also the dedupe key, unless the handler gives its own. */
  readonly id: string
  /** The inbox key: the message id, or the contract's business key. */
  readonly dedupeKey: string
  /** The event type. */
  readonly type: string
  /** The version of the handler's contract: the payload's, after any upcast. */
  readonly version: number
  /** The string headers it arrived with: the producer's, and the transport's own. */
  readonly headers: Readonly<Record<string, string>>
  /** The ordering key it was enqueued with, if any. */
  readonly partitionKey: string | undefined
  /** Its place in the partition key's sequence (1, 2, 3, … in commit order), when enqueued with a key. */
  readonly position: PartitionPosition | undefined
  /** The tenant it was enqueued for, if any. */
  readonly tenantId: string | undefined
  /** 1 on the first try; grows with each retry. */
  readonly attempt: number
}

/** What a handler is given: the message, and the transaction its inbox row is written in. */
export interface HandlerContext<A> {
  /** The payload, validated and upcast to the handler's contract. */
  readonly payload: A
  /** The message's id, type, headers, key and attempt. */
  readonly envelope: Envelope
  /** The transaction the inbox row is written in: write your effects with it. */
  // biome-ignore lint/suspicious/noExplicitAny: the service's own database type; annotate in the handler
  readonly trx: Transaction<any>
}

/** One registration, made with `Inbox.handler`: a contract and what to do with its messages. */
export interface Handler {
  /** The contract it handles; older versions of its type are upcast to it. */
  readonly contract: AnyContract
  /** Handles one message in the inbox row's transaction; a failure rolls it back, to be retried or, out of tries, dead. */
  readonly handle: (context: HandlerContext<unknown>) => Effect.Effect<void, unknown>
  /** The business key that replaces the message id as the dedupe key (scoped by type); undefined: the message id. */
  readonly dedupeKey: ((payload: unknown, envelope: Omit<Envelope, "dedupeKey">) => string) | undefined
}

/**
 * Registers a handler for one contract. `dedupeKey` replaces the message id as
 * the inbox key (e.g. a business id); the key is stored scoped by the event
 * type (`<type>:<your key>`), so handlers of different types never collide.
 */
export const handler = <C extends AnyContract>(
  contract: C,
  handle: (context: HandlerContext<PayloadOf<C>>) => Effect.Effect<void, unknown>,
  options: {
    readonly dedupeKey?: (payload: PayloadOf<C>, envelope: Omit<Envelope, "dedupeKey">) => string
  } = {},
): Handler => ({
  contract,
  handle: handle as Handler["handle"],
  dedupeKey: options.dedupeKey as Handler["dedupeKey"],
})

/** A handler's own failure (as opposed to the inbox failing to reach its database). */
export class HandlerFailed {
  readonly _tag = "HandlerFailed"
  readonly error: string
  constructor(error: string) {
    this.error = error
  }
}

/** A readable one-line message for whatever a handler failed with. */
export const describe = (error: unknown): string => {
  if (error instanceof Error) return withCauses(error.message, error.cause, 3)
  if (typeof error === "object" && error !== null && "message" in error) return String(error.message)
  return typeof error === "string" ? error : (JSON.stringify(error) ?? String(error))
}

/**
 * A message and what caused it, as far as the chain says more: `Effect.tryPromise` without a
 * `catch` fails with "An error occurred in Effect.tryPromise" and the thrown error as its cause,
 * which is the part a `last_error` must show.
 */
const withCauses = (message: string, cause: unknown, depth: number): string => {
  if (cause === undefined || cause === null || depth === 0) return message
  const inner =
    cause instanceof Error
      ? withCauses(cause.message, cause.cause, depth - 1)
      : typeof cause === "object" && "message" in cause
        ? String(cause.message)
        : typeof cause === "string"
          ? cause
          : undefined
  return inner === undefined || inner === "" || message.includes(inner) ? message : `${message}: ${inner}`
}

/**
 * The `Inbox.handle` span's attributes: OpenTelemetry's messaging conventions
 * for a `process` span (with the transport's system and destination when it
 * names them) and txbox's own.
 */
const processAttributes = (
  consumer: string,
  envelope: Envelope,
  messaging: MessagingIdentity | undefined,
): Record<string, unknown> => ({
  ...(messaging === undefined
    ? {}
    : { "messaging.system": messaging.system, "messaging.destination.name": messaging.destination }),
  "messaging.operation.type": "process",
  "messaging.operation.name": "process",
  "messaging.message.id": envelope.id,
  "txbox.type": envelope.type,
  "txbox.consumer": consumer,
  "txbox.attempt": envelope.attempt,
})

/**
 * Runs a handler under its span (continuing the producer's trace), times it,
 * and gives up on it after `timeoutMs`: a hung handler would hold its
 * transaction, a pooled connection and (in the processor) the whole batch.
 * Any failure, defect or timeout becomes `HandlerFailed`, so the message is
 * retried and its transaction rolled back.
 */
/** What a handler that ran past its bound failed with. */
export const timedOut = (ms: number): HandlerFailed => new HandlerFailed(`handler timed out after ${ms} ms`)

/** Where a transaction watched by `watchdog` is: which handler runs (−1: none), since when (clock ms). */
export interface Running {
  index: number
  since: number
}

/** Marks handler `index` as running from now (−1: between handlers, a statement's turn). */
export const nowRunning = (running: Running, index: number): Effect.Effect<void> =>
  Effect.clockWith((clock) =>
    Effect.sync(() => {
      running.index = index
      running.since = clock.currentTimeMillisUnsafe()
    }),
  )

/**
 * One watchdog for a transaction of several handlers, instead of a race per
 * handler (two fibers and a timer each, on every message): the handlers say
 * which of them runs (`nowRunning`), and a handler running longer than
 * `handlerMs` — or a statement between them taking longer than `statementsMs` —
 * fails the transaction with `onTimeout` of that handler's index (undefined for
 * a statement that did not answer). It looks every quarter of the shorter
 * bound (a handler that started meanwhile has a deadline of its own), so a
 * deadline is noticed at most that late, and a transaction that ends before
 * the first look costs one timer.
 */
export const watchdog = <A, E, E2>(
  transaction: (running: Running) => Effect.Effect<A, E>,
  handlerMs: number,
  statementsMs: number,
  onTimeout: (index: number | undefined) => E2,
): Effect.Effect<A, E | E2> =>
  Effect.withFiber((parent) => {
    const clock = parent.getRef(Clock.Clock)
    const running: Running = { index: -1, since: clock.currentTimeMillisUnsafe() }
    const look = Math.max(1, Math.min(handlerMs, statementsMs) / 4)
    /** Ms to wait before the next look, or the failure when a deadline has passed. */
    const next = (): number | { readonly fail: E2 } => {
      const limit = running.index >= 0 ? handlerMs : statementsMs
      const left = running.since + limit - clock.currentTimeMillisUnsafe()
      return left <= 0
        ? { fail: onTimeout(running.index >= 0 ? running.index : undefined) }
        : Math.min(left, look)
    }
    // A timer on the live clock (no fiber of its own per transaction); a sleeping fiber otherwise.
    if (onLiveClock(parent)) return cutShortOnTimer(parent, transaction(running), look, next)
    const guard: Effect.Effect<never, E2> = Effect.suspend(() => {
      const answer = next()
      return typeof answer === "number"
        ? Effect.flatMap(Effect.sleep(answer), () => guard)
        : Effect.fail(answer.fail)
    })
    return Effect.raceFirst(Effect.interruptible(transaction(running)), Effect.interruptible(guard))
  })

export const runHandler = (
  consumer: string,
  handler: Handler,
  payload: unknown,
  envelope: Envelope,
  // biome-ignore lint/suspicious/noExplicitAny: the caller's database
  trx: Transaction<any>,
  /** The handler's own bound; undefined when the caller bounds it (`watchdog`: one timer per transaction). */
  timeoutMs: number | undefined,
  messaging?: MessagingIdentity,
): Effect.Effect<void, HandlerFailed> => {
  // Interruptible even inside the processor's uninterruptible batch, so a timeout can stop it.
  const interruptible = Effect.interruptible(handler.handle({ payload, envelope, trx }))
  const handled = (
    timeoutMs === undefined
      ? interruptible
      : Effect.timeoutOrElse(interruptible, {
          duration: timeoutMs,
          orElse: () => Effect.fail(timedOut(timeoutMs).error),
        })
  ).pipe(
    Effect.catchCause((cause) => Effect.fail(new HandlerFailed(describe(Cause.squash(cause))))),
    (handle) => Metrics.timed(Metrics.handlerDuration, handle),
  )
  // A CONSUMER span, child of the producer's PRODUCER span (the relay's publish) when the message
  // carries its traceparent. Without a tracer, only for a message that carries a trace (its
  // producer's code ran in a span): the handler's code may read the span, and the trace goes on.
  return Effect.flatMap(isTracing, (tracing) => {
    const traceparent = envelope.headers.traceparent
    if (!tracing && traceparent === undefined) return handled
    const parent = parentFromTraceparent(traceparent)
    return Effect.withSpan(
      "Inbox.handle",
      {
        kind: "consumer",
        attributes: processAttributes(consumer, envelope, messaging),
        ...(parent ? { parent } : {}),
      },
      // One span per message: the stack trace Effect would capture for it costs more than the span.
      { captureStackTrace: false },
    )(handled)
  })
}
