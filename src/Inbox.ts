/**
 * The consumer side: at-least-once deliveries in, exactly-once effects out.
 *
 * - "idempotent" (default): per delivery, one transaction inserts the inbox
 *   row (message id, consumer) and runs the handler; commit, then ack. A
 *   duplicate finds the row and is acked without running the handler.
 * - "store-then-process": the consumer only persists deliveries (a batch per
 *   INSERT) and acks; a processor claims pending rows and runs each handler in
 *   a transaction that also marks the row processed.
 *
 * Effects outside the database transaction (HTTP calls, e-mails) are not
 * covered: they can repeat when a handler fails after making them.
 */
import { Cause, Duration, Effect, Layer, Metric, type Scope } from "effect"
import type { Transaction } from "kysely"
import { type AnyContract, decode, makeRegistry, type PayloadOf, type Registry } from "./Contract.ts"
import { makeSignal } from "./core/Signal.ts"
import { parentFromTraceparent } from "./core/trace.ts"
import { uuidv7 } from "./core/uuid.ts"
import { ConfigError, type StoreError, type TransportError } from "./Errors.ts"
import * as Metrics from "./Metrics.ts"
import { Database, type DatabaseShape } from "./ports/Database.ts"
import { type Delivery, type DeliveryDecision, Transport } from "./ports/Transport.ts"
import { delayFor, makeRetryPolicy, type RetryPolicy, schedule } from "./Retry.ts"
import { tryStore } from "./storage/dbErrors.ts"
import * as inboxSql from "./storage/inboxSql.ts"
import { withTransaction } from "./storage/transaction.ts"

/** What a handler knows about the message besides its payload. */
export interface Envelope {
  readonly id: string
  /** The inbox key: the message id, or the contract's business key. */
  readonly dedupeKey: string
  readonly type: string
  readonly version: number
  readonly headers: Readonly<Record<string, string>>
  readonly partitionKey: string | undefined
  readonly tenantId: string | undefined
  /** 1 on the first try; grows with each retry. */
  readonly attempt: number
}

export interface HandlerContext<A> {
  readonly payload: A
  readonly envelope: Envelope
  /** The transaction the inbox row is written in: write your effects with it. */
  // biome-ignore lint/suspicious/noExplicitAny: the service's own database type; annotate in the handler
  readonly trx: Transaction<any>
}

export interface Handler {
  readonly contract: AnyContract
  readonly handle: (context: HandlerContext<unknown>) => Effect.Effect<void, unknown>
  readonly dedupeKey: ((payload: unknown, envelope: Omit<Envelope, "dedupeKey">) => string) | undefined
}

/** Registers a handler for one contract. `dedupeKey` replaces the message id as the inbox key (e.g. a business id). */
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

export interface InboxConfig {
  /** Names this consuming service: its queue and its inbox rows. */
  readonly consumer: string
  readonly handlers: ReadonlyArray<Handler>
  /** @default "idempotent" */
  readonly mode?: "idempotent" | "store-then-process"
  /** Deliveries in flight at once. @default 32 */
  readonly prefetch?: number
  /** Handler retries: backoff and `maxAttempts` before a message is dead. @default defaultRetryPolicy */
  readonly retry?: Partial<RetryPolicy>
  /** Store-then-process: rows claimed per processor cycle. @default 100 */
  readonly batchSize?: number
  /** Store-then-process: how long a processor's claim holds its rows. @default "30 seconds" */
  readonly lease?: Duration.Input
  /** Store-then-process: fallback poll when no NOTIFY arrives. @default "1 second" */
  readonly pollInterval?: Duration.Input
  /** Store-then-process: handlers run at once by the processor, each in its own transaction. @default 4 */
  readonly processorConcurrency?: number
  /**
   * Runs after the inbox transaction committed and before the broker ack
   * (idempotent mode: after the handler's commit; store-then-process: after
   * the delivery was stored). For metrics, and for tests that crash there.
   */
  readonly afterCommit?: (delivery: Delivery) => Effect.Effect<void>
}

export interface InboxStats {
  readonly processed: number
  readonly duplicates: number
  readonly retried: number
  readonly dead: number
  readonly stored: number
  readonly lastActivityAt: Date | undefined
}

export interface InboxHealth {
  /** Use as a readiness probe: the broker connection (and so the subscription) is up. */
  readonly ready: boolean
  readonly brokerConnected: boolean
  readonly lastActivityAt: Date | undefined
}

export interface InboxHandle {
  readonly stats: Effect.Effect<InboxStats>
  readonly health: Effect.Effect<InboxHealth>
}

const deadMetric = Metric.withAttributes(Metrics.dead, { side: "inbox" })
const retriedMetric = Metric.withAttributes(Metrics.retried, { side: "inbox" })

const CONSUMER = /^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$/

/** A handler's own failure (as opposed to the inbox failing to reach its database). */
class HandlerFailed {
  readonly _tag = "HandlerFailed"
  readonly error: string
  constructor(error: string) {
    this.error = error
  }
}

const describe = (error: unknown): string => {
  if (error instanceof Error) return error.message
  if (typeof error === "object" && error !== null && "message" in error) return String(error.message)
  return typeof error === "string" ? error : (JSON.stringify(error) ?? String(error))
}

type Decoded =
  | {
      readonly _tag: "Ok"
      readonly handler: Handler
      readonly payload: unknown
      readonly row: inboxSql.InboxRow
      readonly envelope: Envelope
    }
  | { readonly _tag: "Bad"; readonly row: inboxSql.InboxRow }

const sha256Hex = (text: string) =>
  Effect.promise(async () => {
    const digest = await globalThis.crypto.subtle.digest("SHA-256", new TextEncoder().encode(text))
    return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("")
  })

const resolveConfig = (config: InboxConfig) => {
  if (typeof config.consumer !== "string" || !CONSUMER.test(config.consumer)) {
    throw new ConfigError({
      reason: `consumer name ${JSON.stringify(config.consumer)} must match ${CONSUMER.source}`,
    })
  }
  if (config.handlers.length === 0) throw new ConfigError({ reason: "an inbox needs at least one handler" })
  const prefetch = config.prefetch ?? 32
  const batchSize = config.batchSize ?? 100
  if (!Number.isInteger(prefetch) || prefetch < 1 || prefetch > 10_000) {
    throw new ConfigError({ reason: `prefetch must be an integer in 1..10000, got ${prefetch}` })
  }
  if (!Number.isInteger(batchSize) || batchSize < 1 || batchSize > 10_000) {
    throw new ConfigError({ reason: `batchSize must be an integer in 1..10000, got ${batchSize}` })
  }
  const processorConcurrency = config.processorConcurrency ?? 4
  if (!Number.isInteger(processorConcurrency) || processorConcurrency < 1 || processorConcurrency > 256) {
    throw new ConfigError({
      reason: `processorConcurrency must be an integer in 1..256, got ${processorConcurrency}`,
    })
  }
  return {
    processorConcurrency,
    consumer: config.consumer,
    mode: config.mode ?? "idempotent",
    prefetch,
    batchSize,
    leaseMs: Duration.toMillis(Duration.fromInputUnsafe(config.lease ?? "30 seconds")),
    pollMs: Duration.toMillis(Duration.fromInputUnsafe(config.pollInterval ?? "1 second")),
    retry: makeRetryPolicy(config.retry),
    outage: makeRetryPolicy({ initialDelay: "200 millis", maxDelay: "10 seconds" }),
  }
}

/** Starts the inbox in the current scope: its subscription (and, in store-then-process mode, its processor). */
export const make = (
  config: InboxConfig,
): Effect.Effect<InboxHandle, ConfigError, Database | Transport | Scope.Scope> =>
  Effect.gen(function* () {
    const c = yield* Effect.try({ try: () => resolveConfig(config), catch: (e) => e as ConfigError })
    const registry = yield* makeRegistry(config.handlers.map((h) => h.contract))
    const handlers = new Map(config.handlers.map((h) => [`${h.contract.type}@${h.contract.version}`, h]))
    const db = yield* Database
    const transport = yield* Transport
    const stats = {
      processed: 0,
      duplicates: 0,
      retried: 0,
      dead: 0,
      stored: 0,
      lastActivityAt: undefined as Date | undefined,
    }
    const touch = () => {
      stats.lastActivityAt = new Date()
    }

    const decodeDelivery = (delivery: Delivery) => decodeWith(registry, handlers, c.consumer, delivery)

    const recordDead = (row: inboxSql.InboxRow) =>
      tryStore("Inbox.insertDead", () => inboxSql.insertDead(db.db, db.schema, [row])).pipe(
        Effect.tap(() =>
          Effect.sync(() => {
            stats.dead++
            touch()
          }).pipe(Effect.andThen(Metric.update(deadMetric, 1))),
        ),
      )

    /** A database outage: bring the message back later without spending its attempts on it. */
    const outageDecision = (delivery: Delivery, error: StoreError): Effect.Effect<DeliveryDecision> =>
      Effect.as(Effect.logWarning(`inbox ${c.consumer}: ${error.message}; retrying delivery`), {
        _tag: "Retry",
        delayMs: delayFor(c.outage, Math.min(delivery.attempt, 8)),
      } as const)

    // biome-ignore lint/suspicious/noExplicitAny: the caller's database
    const runHandler = (decoded: Extract<Decoded, { _tag: "Ok" }>, trx: Transaction<any>) =>
      decoded.handler.handle({ payload: decoded.payload, envelope: decoded.envelope, trx }).pipe(
        Effect.catchCause((cause) => Effect.fail(new HandlerFailed(describe(Cause.squash(cause))))),
        (handle) => Metrics.timed(Metrics.handlerDuration, handle),
        Effect.withSpan("Inbox.handle", {
          attributes: { "txbox.type": decoded.envelope.type, "txbox.consumer": c.consumer },
          ...withParent(decoded.envelope.headers.traceparent),
        }),
      )

    const afterHandlerFailure = (
      decoded: Extract<Decoded, { _tag: "Ok" }>,
      failure: HandlerFailed,
    ): Effect.Effect<DeliveryDecision, StoreError> => {
      const attempt = decoded.envelope.attempt
      if (attempt >= c.retry.maxAttempts) {
        const row = {
          ...decoded.row,
          attempts: attempt,
          last_error: `${failure.error} (after ${attempt} attempts)`,
        }
        return Effect.as(recordDead(row), { _tag: "Ack" } as const)
      }
      stats.retried++
      return Effect.as(Metric.update(retriedMetric, 1), {
        _tag: "Retry",
        delayMs: delayFor(c.retry, attempt),
      } as const)
    }

    const idempotent = (delivery: Delivery): Effect.Effect<DeliveryDecision> =>
      Effect.gen(function* () {
        const decoded = yield* decodeDelivery(delivery)
        if (decoded._tag === "Bad") return yield* Effect.as(recordDead(decoded.row), { _tag: "Ack" } as const)
        const outcome = yield* withTransaction(db.db, (trx) =>
          Effect.gen(function* () {
            const row = { ...decoded.row, attempts: delivery.attempt }
            const fresh = yield* tryStore("Inbox.insertProcessed", () =>
              inboxSql.insertProcessed(trx, db.schema, row),
            )
            if (!fresh) return "duplicate" as const
            yield* runHandler(decoded, trx)
            return "processed" as const
          }),
        ).pipe(Effect.result)
        if (outcome._tag === "Success") {
          if (outcome.success === "duplicate") {
            stats.duplicates++
            yield* Metric.update(Metrics.duplicates, 1)
          } else {
            stats.processed++
            yield* Metric.update(Metrics.processed, 1)
          }
          touch()
          if (config.afterCommit) yield* config.afterCommit(delivery)
          return { _tag: "Ack" } as const
        }
        const failure = outcome.failure
        if (failure instanceof HandlerFailed) return yield* afterHandlerFailure(decoded, failure)
        if (failure.retryable) return yield* outageDecision(delivery, failure)
        // The database refused our own statement for good (a bug or a schema
        // drift): treat it like a handler failure so the message ends dead, not looping.
        return yield* afterHandlerFailure(decoded, new HandlerFailed(failure.message))
      }).pipe(Effect.catch((error: StoreError) => outageDecision(delivery, error)))

    const storeBatcher = makeBatcher<inboxSql.InboxRow, number, StoreError>((rows) =>
      tryStore("Inbox.store", () => inboxSql.insertPending(db, rows)),
    )

    const store = (delivery: Delivery): Effect.Effect<DeliveryDecision> =>
      Effect.gen(function* () {
        const decoded = yield* decodeDelivery(delivery)
        if (decoded._tag === "Bad") return yield* Effect.as(recordDead(decoded.row), { _tag: "Ack" } as const)
        yield* storeBatcher.submit(decoded.row)
        stats.stored++
        touch()
        if (config.afterCommit) yield* config.afterCommit(delivery)
        return { _tag: "Ack" } as const
      }).pipe(Effect.catch((error: StoreError) => outageDecision(delivery, error)))

    // Subscribe now, so a caller that publishes right after `make` finds the
    // queue. If the broker is away, keep trying in the background instead of
    // failing the service: health reports not-ready meanwhile.
    const subscribe = transport.subscribe(
      { consumer: c.consumer, types: registry.types, prefetch: c.prefetch },
      c.mode === "idempotent" ? idempotent : store,
    )
    const first = yield* Effect.result(subscribe)
    if (first._tag === "Failure") {
      if (!first.failure.retryable) {
        return yield* new ConfigError({ reason: `inbox ${c.consumer}: ${first.failure.message}` })
      }
      yield* Effect.logWarning(`inbox ${c.consumer}: ${first.failure.message}; subscribing in the background`)
      yield* Effect.forkScoped(
        subscribe.pipe(
          Effect.retry({ schedule: schedule(c.outage), while: (e: TransportError) => e.retryable }),
          Effect.catch((e) => Effect.logError(`inbox ${c.consumer}: cannot subscribe: ${e.message}`)),
        ),
      )
    }

    // The processor runs in both modes: in store-then-process it does all the
    // work; in idempotent mode it only picks up rows an operator redrove
    // (`txbox dead redrive`), so it polls without LISTEN.
    yield* startProcessor(db, c, registry, handlers, stats, runHandler)
    const health = Effect.map(transport.isConnected, (brokerConnected) => ({
      ready: brokerConnected,
      brokerConnected,
      lastActivityAt: stats.lastActivityAt,
    }))
    return { stats: Effect.sync(() => ({ ...stats })), health } satisfies InboxHandle
  })

/** The inbox as a layer: it consumes as long as the layer lives. */
export const layer = (config: InboxConfig): Layer.Layer<never, ConfigError, Database | Transport> =>
  Layer.effectDiscard(make(config))

const withParent = (traceparent: string | undefined) => {
  const parent = parentFromTraceparent(traceparent)
  return parent ? { parent } : {}
}

const decodeWith = (
  registry: Registry,
  handlers: ReadonlyMap<string, Handler>,
  consumer: string,
  delivery: Delivery,
): Effect.Effect<Decoded> =>
  Effect.gen(function* () {
    const base = {
      consumer,
      type: delivery.type ?? null,
      version: delivery.version ?? null,
      headers: delivery.headers,
      partition_key: delivery.partitionKey ?? null,
      tenant_id: delivery.tenantId ?? null,
      attempts: delivery.attempt,
    }
    const bad = (messageId: string, reason: string): Decoded => ({
      _tag: "Bad",
      row: { ...base, message_id: messageId, payload: null, raw: delivery.body, last_error: reason },
    })
    // A message without an id still gets a stable key, so its redeliveries collapse into one dead row.
    const messageId =
      delivery.messageId ?? `missing-id:${yield* sha256Hex(`${delivery.type}\n${delivery.body}`)}`
    if (delivery.messageId === undefined) return bad(messageId, "message has no message id")
    if (delivery.type === undefined) return bad(messageId, "message has no type")
    const contract = yield* Effect.result(registry.resolve(delivery.type, delivery.version))
    if (contract._tag === "Failure") return bad(messageId, contract.failure.message)
    const payload = yield* Effect.result(decode(contract.success, delivery.body))
    if (payload._tag === "Failure") return bad(messageId, payload.failure.message)
    const handler = handlers.get(`${contract.success.type}@${contract.success.version}`)!
    const envelopeBase = {
      id: messageId,
      type: contract.success.type,
      version: contract.success.version,
      headers: delivery.headers,
      partitionKey: delivery.partitionKey,
      tenantId: delivery.tenantId,
      attempt: delivery.attempt,
    }
    let dedupeKey = messageId
    if (handler.dedupeKey) {
      try {
        dedupeKey = String(handler.dedupeKey(payload.success, envelopeBase))
      } catch (error) {
        return bad(messageId, `dedupeKey threw: ${describe(error)}`)
      }
    }
    return {
      _tag: "Ok",
      handler,
      payload: payload.success,
      envelope: { ...envelopeBase, dedupeKey },
      row: { ...base, message_id: dedupeKey, payload: delivery.body, raw: null, last_error: null },
    }
  })

type RowRunner = (
  decoded: Extract<Decoded, { _tag: "Ok" }>,
  // biome-ignore lint/suspicious/noExplicitAny: the caller's database
  trx: Transaction<any>,
) => Effect.Effect<void, HandlerFailed>

/** Store-then-process: claims pending rows and runs their handlers, each in its own transaction. */
const startProcessor = (
  db: DatabaseShape,
  c: ReturnType<typeof resolveConfig>,
  registry: Registry,
  handlers: ReadonlyMap<string, Handler>,
  stats: { processed: number; retried: number; dead: number; lastActivityAt: Date | undefined },
  run: RowRunner,
) =>
  Effect.gen(function* () {
    const wake = makeSignal()
    if (c.mode === "store-then-process") {
      yield* db
        .listen(`${db.schema}.inbox`, wake.notify)
        .pipe(
          Effect.catch((e) =>
            Effect.logWarning(`inbox ${c.consumer}: LISTEN unavailable, polling: ${e.message}`),
          ),
        )
    }

    const processRow = (row: inboxSql.InboxRow, token: string) =>
      Effect.gen(function* () {
        const delivery: Delivery = {
          messageId: row.message_id,
          type: row.type ?? undefined,
          version: row.version ?? undefined,
          body: row.payload ?? "",
          headers: row.headers ?? {},
          partitionKey: row.partition_key ?? undefined,
          tenantId: row.tenant_id ?? undefined,
          attempt: row.attempts + 1,
          redelivered: false,
        }
        const decoded = yield* decodeWith(registry, handlers, c.consumer, delivery)
        if (decoded._tag === "Bad") {
          return {
            messageId: row.message_id,
            status: "dead",
            delayMs: 0,
            error: decoded.row.last_error ?? "bad",
          } as const
        }
        // The stored key is already the dedupe key; keep it whatever the contract computes now.
        const fixed = { ...decoded, envelope: { ...decoded.envelope, dedupeKey: row.message_id } }
        const result = yield* withTransaction(db.db, (trx) =>
          Effect.gen(function* () {
            const mine = yield* tryStore("Inbox.markProcessed", () =>
              inboxSql.markProcessed(trx, db.schema, row, token),
            )
            if (mine) yield* run(fixed, trx)
            return mine
          }),
        ).pipe(Effect.result)
        if (result._tag === "Success") {
          if (result.success) {
            stats.processed++
            yield* Metric.update(Metrics.processed, 1)
          }
          return undefined
        }
        const error = result.failure instanceof HandlerFailed ? result.failure.error : result.failure.message
        const attempt = row.attempts + 1
        const dead = attempt >= c.retry.maxAttempts
        return {
          messageId: row.message_id,
          status: dead ? "dead" : "pending",
          delayMs: dead ? 0 : delayFor(c.retry, attempt),
          error: dead ? `${error} (after ${attempt} attempts)` : error,
        } as const
      })

    const cycle = Effect.gen(function* () {
      const token = uuidv7()
      const rows = yield* tryStore("Inbox.claimPending", () =>
        inboxSql.claimPending(db, c.consumer, c.batchSize, token, c.leaseMs),
      )
      // Each row in its own transaction, several at once (each on its own
      // pooled connection): one at a time capped the processor at ~800 msg/s
      // while the consumer side stored ~3,000 (bench/README.md "inbox").
      const results = yield* Effect.forEach(rows, (row) => processRow(row, token), {
        concurrency: c.processorConcurrency,
      })
      const failures = results.filter((f): f is inboxSql.FailureMark => f !== undefined)
      yield* tryStore("Inbox.markFailures", () => inboxSql.markFailures(db, c.consumer, token, failures))
      for (const f of failures) {
        if (f.status === "dead") stats.dead++
        else stats.retried++
        yield* Metric.update(f.status === "dead" ? deadMetric : retriedMetric, 1)
      }
      if (rows.length > 0) stats.lastActivityAt = new Date()
      return rows.length
    })

    const loop = Effect.gen(function* () {
      while (true) {
        const claimed = yield* Effect.uninterruptible(cycle).pipe(
          Effect.tapError((e: StoreError) =>
            Effect.logWarning(`inbox ${c.consumer} processor: ${e.message}`),
          ),
          Effect.retry({ schedule: schedule(c.outage), while: (e) => e.retryable }),
        )
        if (claimed < c.batchSize) yield* wake.wait(c.pollMs)
      }
    })
    yield* Effect.forkScoped(
      loop.pipe(
        Effect.catchCause((cause) => Effect.logError(`inbox ${c.consumer} processor stopped`, cause)),
      ),
    )
  })

/**
 * Collects concurrent submissions into one call: the first submission opens
 * a batch, everything submitted before the current flush finishes joins the
 * next one. With `prefetch` deliveries in flight, that is one INSERT for many.
 */
const makeBatcher = <I, O, E>(flush: (items: ReadonlyArray<I>) => Effect.Effect<O, E>) => {
  let batch: { items: I[]; done: Promise<{ ok: true; value: O } | { ok: false; error: E }> } | undefined
  const submit = (item: I): Effect.Effect<O, E> =>
    Effect.suspend(() => {
      if (!batch) {
        const items: I[] = []
        const done = Promise.resolve().then(async () => {
          batch = undefined
          const exit = await Effect.runPromise(Effect.result(flush(items)))
          return exit._tag === "Success"
            ? ({ ok: true, value: exit.success } as const)
            : ({ ok: false, error: exit.failure } as const)
        })
        batch = { items, done }
      }
      batch.items.push(item)
      const { done } = batch
      return Effect.flatMap(
        Effect.promise(() => done),
        (r) => (r.ok ? Effect.succeed(r.value) : Effect.fail(r.error)),
      )
    })
  return { submit }
}
