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
 * - "external": for a handler whose effect is outside the database (an
 *   e-mail, an HTTP call): deliveries are stored as in store-then-process; the
 *   processor claims a row under a lease (the "consuming" record, extended
 *   while the handler runs), runs the handler with no transaction, then marks
 *   the row processed. A duplicate finds the row stored and is acked; the
 *   effect repeats only when the process dies (or its lease lapses) between
 *   the effect and the mark.
 *
 * In the first two modes, effects outside the database transaction (HTTP
 * calls, e-mails) are not covered: they can repeat when a handler fails after
 * making them.
 *
 * This module wires parts together: deliveries are handled by
 * `core/inboxConsumer.ts`, stored rows by `core/inboxProcessor.ts` in the
 * loop of `core/leaseLoop.ts`, retries decided by `core/verdict.ts`.
 */
import { type Duration, Effect, Layer, Schedule, type Scope } from "effect"
import { type AnyContract, makeRegistry } from "./Contract.ts"
import { bounded } from "./core/bounded.ts"
import * as config from "./core/config.ts"
import { indexHandlers } from "./core/decodeDelivery.ts"
import type { Handler } from "./core/handler.ts"
import { makeConsumer, makeInboxCounters } from "./core/inboxConsumer.ts"
import { processorCycle } from "./core/inboxProcessor.ts"
import type { RouteBinding } from "./core/keyRoutes.ts"
import { isLive, makeLoopState, runLeaseLoop } from "./core/leaseLoop.ts"
import { PARTITION_EVERY_MS, PARTITIONS_AHEAD_MS, PARTITIONS_CHECK_MS } from "./core/partitioning.ts"
import { makeSignal, subscribeWakeups } from "./core/signal.ts"
import { subscribe } from "./core/subscription.ts"
import { type ConfigError, StoreError } from "./Errors.ts"
import { InboxStore, type OrderedDeadPolicy } from "./ports/InboxStore.ts"
import { type Delivery, Transport } from "./ports/Transport.ts"
import { makeRetryPolicy, type RetryPolicy } from "./Retry.ts"

export {
  type Envelope,
  type Handler,
  type HandlerContext,
  handler,
} from "./core/handler.ts"

/** `InboxConfig.mode`. */
export type InboxMode = "idempotent" | "store-then-process" | "external"

/** Options of an inbox (`Inbox.make`, `Inbox.layer`, `txbox.inbox()`): its consumer name, its handlers, and how it runs them. */
export interface InboxConfig {
  /** Names this consuming service: its queue and its inbox rows. */
  readonly consumer: string
  /** One per contract, made with `Inbox.handler`; their event types are what the queue subscribes to. */
  readonly handlers: ReadonlyArray<Handler>
  /**
   * How deliveries become handled: see the module doc for `"idempotent"`, `"store-then-process"`
   * and `"external"` (effects outside the database: the handler gets no transaction, and its
   * effect may repeat if the process dies between the effect and the mark). @default "idempotent"
   */
  readonly mode?: InboxMode
  /** Deliveries in flight at once. @default 32 */
  readonly prefetch?: number
  /**
   * Idempotent mode: inbox transactions open at once. Deliveries that arrive
   * while all are busy wait and share the next one (one insert for their
   * rows, their handlers one after another): under load, fewer transactions
   * for the same work. Raise it for handlers that spend their time waiting
   * (on I/O, on locks). @default 4
   */
  readonly transactions?: number
  /** Handler retries: backoff and `maxAttempts` (handler runs) before a message is dead. @default defaultRetryPolicy */
  readonly retry?: Partial<RetryPolicy>
  /** Processor: rows claimed per cycle. @default 100 */
  readonly batchSize?: number
  /** Processor: how long a claim holds its rows. @default "30 seconds" */
  readonly lease?: Duration.Input
  /**
   * Processor: fallback poll when no NOTIFY arrives. While its LISTEN works and nothing is pending,
   * an idle processor polls ten times less often (at most every 30 s): stored and redriven rows
   * notify, and a row due by time (a retry's backoff, a lease run out) is claimed when it comes
   * due. @default "1 second"
   */
  readonly pollInterval?: Duration.Input
  /** Processor: handlers run at once, each in its own transaction. @default 4 */
  readonly processorConcurrency?: number
  /**
   * A handler still running after this long counts as failed (retried, then
   * dead): its transaction is rolled back and its connection freed. The
   * processor's claim is kept alive meanwhile. One watchdog per transaction
   * holds each of its handlers to this (noticed within a quarter of it, or of
   * 10 s when shorter). @default "30 seconds"
   */
  readonly handlerTimeout?: Duration.Input
  /**
   * What a dead message of an ordered key (`partitionKey`) does to the key's
   * later messages. `"block"`: they wait until it is redriven (`txbox dead
   * redrive`) or skipped (`txbox dead skip`); `txbox status` lists the key as
   * blocked. `"skip"`: they go on as if it had been handled; the dead row stays
   * for the record (redriven later, it runs out of order). @default "block"
   */
  readonly onOrderedDead?: OrderedDeadPolicy
  /**
   * Retention by dropping whole days of the inbox (migration 0015): this
   * inbox keeps the inbox's day partitions, made three days ahead, and drops
   * one once its range ended more than `olderThan` ago, its last row was
   * processed more than `olderThan` ago, and it holds no pending or dead row
   * (dead rows go to `inbox_archive` first). `olderThan` is the dedupe window:
   * a copy of a message redelivered after its partition went is applied again,
   * so it must cover the broker's longest redelivery. The partitions are shared
   * by every consumer of the database: the shortest window among their inboxes
   * is the one that holds, so give each the same one. Without it
   * no day partition is made (rows stay in the default partition) and none is
   * dropped. @default off
   */
  readonly retention?: { readonly olderThan: Duration.Input }
  /**
   * Runs after the inbox transaction committed and before the broker ack
   * (idempotent mode: after the handler's commit; store-then-process: after
   * the delivery was stored). For metrics, and for tests that crash there.
   */
  readonly afterCommit?: (delivery: Delivery) => Effect.Effect<void>
}

/** Counts since this inbox started (not persisted): what its handlers did with the deliveries. */
export interface InboxStats {
  /** Messages whose handler committed. */
  readonly processed: number
  /** Deliveries skipped because their dedupe key was already in the inbox. */
  readonly duplicates: number
  /** Handler failures scheduled for another attempt. */
  readonly retried: number
  /** Messages given up on (attempts exhausted or never handleable). */
  readonly dead: number
  /** Deliveries persisted for the processor (store-then-process, and ordered messages). */
  readonly stored: number
  /** When a delivery or stored row was last handled; undefined before the first. */
  readonly lastActivityAt: Date | undefined
}

/** A health check of a running inbox, for readiness probes and dashboards. */
export interface InboxHealth {
  /** Use as a readiness probe: the broker connection is up and the processor loop is running cycles. */
  readonly ready: boolean
  /** Whether the transport's broker connection is up now. */
  readonly brokerConnected: boolean
  /** Whether the processor completed a cycle lately without an error. */
  readonly processorRunning: boolean
  /** When a delivery or stored row was last handled; undefined before the first. */
  readonly lastActivityAt: Date | undefined
  /** The processor loop's last failure, cleared by its next successful cycle. */
  readonly lastError: string | undefined
  /**
   * Whether NOTIFY wake-ups reach the processor (stored rows: store-then-process, ordered messages).
   * False means polling only: LISTEN is off or could not start, or its self-test (a NOTIFY the store
   * sends itself through the pool) went unheard — typically a transaction pooler such as PgBouncer
   * without a `listenUrl`. Not part of `ready`: nothing is lost, only latency grows to the poll interval.
   */
  readonly listening: boolean
}

/** What `Inbox.make` returns: the running inbox's stats and health, read on demand. */
export interface InboxHandle {
  /** Reads the counters since start. */
  readonly stats: Effect.Effect<InboxStats>
  /** Checks the broker connection and the processor loop. */
  readonly health: Effect.Effect<InboxHealth>
}

const CONSUMER = /^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$/

/** The validated configuration, durations in milliseconds. */
export interface ResolvedInboxConfig {
  /** `InboxConfig.consumer`, checked against the allowed name pattern. */
  readonly consumer: string
  /** `InboxConfig.mode`, defaulted. */
  readonly mode: InboxMode
  /** `InboxConfig.prefetch`: deliveries in flight at once. */
  readonly prefetch: number
  /** `InboxConfig.transactions`: idempotent-mode inbox transactions open at once. */
  readonly transactions: number
  /** `InboxConfig.batchSize`: rows the processor claims per cycle. */
  readonly batchSize: number
  /** `InboxConfig.processorConcurrency`: handlers the processor runs at once. */
  readonly concurrency: number
  /** `InboxConfig.lease`, in ms: how long a processor claim holds its rows. */
  readonly leaseMs: number
  /** `InboxConfig.pollInterval`, in ms. */
  readonly pollMs: number
  /** `InboxConfig.handlerTimeout`, in ms. */
  readonly handlerTimeoutMs: number
  /** `InboxConfig.onOrderedDead`: `"block"` or `"skip"` the key's later messages. */
  readonly onOrderedDead: OrderedDeadPolicy
  /** `InboxConfig.retention.olderThan`, in ms; undefined when off. */
  readonly retentionMs: number | undefined
  /** Per-message handler retries, over `defaultRetryPolicy`. */
  readonly retry: RetryPolicy
  /** In-memory backoff while the database or broker is away (200 ms to 10 s). */
  readonly outage: RetryPolicy
}

/** A contract as `defineEvent` makes it, down its upcast chain (a cycle is not one). */
const isContract = (value: unknown): boolean => {
  const seen = new Set<unknown>()
  let current = value
  while (typeof current === "object" && current !== null && !seen.has(current)) {
    seen.add(current)
    const { type, version, schema, upcast } = current as Partial<AnyContract>
    if (typeof type !== "string" || !Number.isInteger(version)) return false
    if (typeof schema?.["~standard"]?.validate !== "function") return false
    if (upcast === undefined) return true
    if (typeof upcast !== "object" || upcast === null || typeof upcast.to !== "function") return false
    current = upcast.from
  }
  return false
}

/** Each entry as `Inbox.handler` makes it: anything else would be a TypeError when the inbox starts. */
const checkHandler = (entry: unknown, index: number): void => {
  const field = `inbox handlers[${index}]`
  config.check(
    typeof entry === "object" && entry !== null && "contract" in entry && "handle" in entry,
    field,
    "must be a handler made with Inbox.handler",
    entry,
  )
  const { contract, handle, dedupeKey } = entry as Partial<Handler>
  config.check(
    isContract(contract),
    `${field}.contract`,
    "must be a contract made with defineEvent",
    contract,
  )
  config.check(typeof handle === "function", `${field}.handle`, "must be a function", handle)
  config.check(
    dedupeKey === undefined || typeof dedupeKey === "function",
    `${field}.dedupeKey`,
    "must be a function",
    dedupeKey,
  )
}

/** Validates every option once; a bad one is a `ConfigError` naming it. */
export const resolveConfig = (c: InboxConfig): Effect.Effect<ResolvedInboxConfig, ConfigError> =>
  config.validateConfig(() => {
    config.check(
      typeof c.consumer === "string" && CONSUMER.test(c.consumer),
      "inbox consumer",
      `must match ${CONSUMER.source}`,
      c.consumer,
    )
    config.check(
      Array.isArray(c.handlers) && c.handlers.length > 0,
      "inbox handlers",
      "must list at least one handler",
      c.handlers?.length,
    )
    c.handlers.forEach(checkHandler)
    config.check(
      c.afterCommit === undefined || typeof c.afterCommit === "function",
      "inbox afterCommit",
      "must be a function",
      c.afterCommit,
    )
    const leaseMs = config.millis("inbox lease", c.lease, "30 seconds", { minMs: 1000 })
    const handlerTimeoutMs = config.millis("inbox handlerTimeout", c.handlerTimeout, "30 seconds", {
      minMs: 1,
    })
    return {
      consumer: c.consumer,
      mode: config.oneOf("inbox mode", c.mode, "idempotent", [
        "idempotent",
        "store-then-process",
        "external",
      ]),
      prefetch: config.integer("inbox prefetch", c.prefetch, 32, 1, 10_000),
      transactions: config.integer("inbox transactions", c.transactions, 4, 1, 1_000),
      batchSize: config.integer("inbox batchSize", c.batchSize, 100, 1, 10_000),
      concurrency: config.integer("inbox processorConcurrency", c.processorConcurrency, 4, 1, 256),
      leaseMs,
      handlerTimeoutMs,
      pollMs: config.millis("inbox pollInterval", c.pollInterval, "1 second", { minMs: 1 }),
      onOrderedDead: config.oneOf("inbox onOrderedDead", c.onOrderedDead, "block", ["block", "skip"]),
      retentionMs:
        c.retention === undefined
          ? undefined
          : config.millis("inbox retention.olderThan", c.retention.olderThan, 0, { minMs: 1 }),
      retry: makeRetryPolicy(c.retry, "inbox retry"),
      outage: makeRetryPolicy({ initialDelay: "200 millis", maxDelay: "10 seconds" }, "inbox outageRetry"),
    }
  })

/** How often ordered rows that wait are set aside or brought back, beyond the marks that wake them. */
const UNPARK_EVERY = "5 seconds"
/**
 * An idle processor whose NOTIFY is heard polls this many times less often, its wait cut short
 * when the next pending row comes due: every row that arrives or is redriven notifies, and the
 * probe covers retries and leases. A once-a-second poll was half of an idle consumer's CPU
 * (`bun bench/idle.ts`: 4.0–4.7 ms/s against 2.0–2.3 with a 10 s poll).
 */
const HEARD_POLL_FACTOR = 10
/** …and never less often than this on that account (a longer `pollInterval` stays as it is). */
const HEARD_POLL_MAX_MS = 30_000

const heardPollOf = (c: ResolvedInboxConfig): number =>
  Math.max(c.pollMs, Math.min(c.pollMs * HEARD_POLL_FACTOR, HEARD_POLL_MAX_MS))

/** The processor's probe for its next due row, bounded like a statement, when the store has one. */
const nextDueOf = (store: InboxStore["Service"], c: ResolvedInboxConfig) =>
  store.nextDueMs === undefined
    ? {}
    : {
        nextDueMs: bounded(
          "InboxStore.nextDue",
          Math.min(c.leaseMs / 4, 10_000),
        )(store.nextDueMs(c.consumer)),
      }

/** Starts the inbox in the current scope: its subscription and its processor. */
export const make = (
  inboxConfig: InboxConfig,
): Effect.Effect<InboxHandle, ConfigError, InboxStore | Transport | Scope.Scope> =>
  Effect.gen(function* () {
    const c = yield* resolveConfig(inboxConfig)
    const registry = yield* makeRegistry(inboxConfig.handlers.map((h): AnyContract => h.contract))
    const store = yield* InboxStore
    const transport = yield* Transport
    const counters = makeInboxCounters()
    // Asked for once the queue is bound (below), else at the first ordered delivery; kept once known.
    let bound: ReadonlyArray<RouteBinding> | undefined
    const bindings = Effect.suspend(() =>
      bound !== undefined
        ? Effect.succeed(bound)
        : Effect.flatMap(store.bindings(c.consumer, registry.types, c.onOrderedDead), (b) => {
            // A binding missing would make its route's predecessors "not for me": never guess.
            if (b.length !== registry.types.length) {
              return Effect.fail(
                new StoreError({
                  reason: "serialization",
                  operation: "InboxStore.bindings",
                  cause: `${b.length} of ${registry.types.length} bindings recorded; asking again`,
                }),
              )
            }
            bound = b
            return Effect.succeed(b)
          }),
    )
    const parts = {
      bindings,
      consumer: c.consumer,
      store,
      registry,
      handlers: indexHandlers(inboxConfig.handlers),
      retry: c.retry,
      handlerTimeoutMs: c.handlerTimeoutMs,
      transactions: c.transactions,
      counters,
      afterCommit: inboxConfig.afterCommit,
      messaging: transport.messaging,
    }
    const consumer = makeConsumer(parts)

    yield* subscribe(
      transport,
      { consumer: c.consumer, types: registry.types, prefetch: c.prefetch },
      c.mode === "idempotent" ? consumer.idempotent : consumer.storeThenProcess,
      c.outage,
      // When the bindings began is what a late consumer's ordered messages are measured against:
      // recorded as soon as the queue is bound, not at the first ordered delivery, which may come
      // much later. A database away now leaves it to that first delivery.
      Effect.ignore(bindings),
      c.mode === "idempotent" ? consumer.idempotentMany : undefined,
    )

    // The processor runs in every mode: in store-then-process and external it does all the
    // work; in idempotent mode it runs ordered messages (always stored) and
    // rows an operator redrove. It LISTENs in both: only pending rows notify,
    // so an idempotent consumer with no ordered traffic is never woken.
    const wake = makeSignal()
    const wakeups = yield* subscribeWakeups(
      (onWake, onHearing) => store.wakeups(c.consumer, onWake, onHearing),
      wake,
      (e) => `inbox ${c.consumer}: LISTEN unavailable, polling: ${e.message}`,
    )
    // Ordered rows long blocked leave the front of the due rows, and what may go comes back
    // (`InboxStore.sweep`): what it brings back is claimed at once.
    yield* Effect.forkScoped(
      store.sweep(c.consumer, { onDead: c.onOrderedDead }).pipe(
        Effect.flatMap((n) => (n > 0 ? Effect.sync(wake.notify) : Effect.void)),
        Effect.ignore,
        Effect.repeat(Schedule.spaced(UNPARK_EVERY)),
      ),
    )
    // With retention, the inbox's day partitions (migration 0015), looked after hourly: the next
    // days' made, the old ones dropped. Only then: kept forever, their number would grow by one a
    // day and so would the planning of every statement on the inbox. Without them rows go to the
    // default partition, never lost.
    if (store.keepPartitions !== undefined && c.retentionMs !== undefined) {
      const keep = store.keepPartitions
      const dropOlderThanMs = c.retentionMs
      yield* Effect.forkScoped(
        keep({ aheadMs: PARTITIONS_AHEAD_MS, everyMs: PARTITION_EVERY_MS, dropOlderThanMs }).pipe(
          Effect.tap(({ created, dropped }) =>
            created.length + dropped.length > 0
              ? Effect.logInfo(
                  `inbox ${c.consumer} partitions: created ${created.join(", ") || "none"}; dropped ${dropped.join(", ") || "none"}`,
                )
              : Effect.void,
          ),
          Effect.catch((e) => Effect.logWarning(`inbox ${c.consumer} partitions: ${e.message}`)),
          Effect.repeat(Schedule.spaced(PARTITIONS_CHECK_MS)),
        ),
      )
    }
    const state = makeLoopState()
    const heardPollMs = heardPollOf(c)
    yield* Effect.forkScoped(
      runLeaseLoop({
        name: `inbox ${c.consumer} processor`,
        cycle: processorCycle(parts, { ...c, external: c.mode === "external" }),
        batchSize: c.batchSize,
        pollMs: c.pollMs,
        hearingPollMs: heardPollMs,
        hearing: () => wakeups.listening,
        ...nextDueOf(store, c),
        outage: c.outage,
        wake,
        state,
      }),
    )

    const date = (ms: number | undefined) => (ms === undefined ? undefined : new Date(ms))
    const stats = Effect.sync(
      (): InboxStats => ({ ...counters, lastActivityAt: date(counters.lastActivityAt) }),
    )
    const health = Effect.gen(function* () {
      const brokerConnected = yield* transport.isConnected
      const processorRunning = yield* isLive(state, Math.max(c.pollMs * 3, heardPollMs * 2) + c.leaseMs)
      return {
        ready: brokerConnected && processorRunning,
        brokerConnected,
        processorRunning,
        lastActivityAt: date(counters.lastActivityAt),
        lastError: state.lastError,
        listening: wakeups.listening,
      } satisfies InboxHealth
    })
    return { stats, health } satisfies InboxHandle
  })

/** The inbox as a layer: it consumes as long as the layer lives. */
export const layer = (config: InboxConfig): Layer.Layer<never, ConfigError, InboxStore | Transport> =>
  Layer.effectDiscard(make(config))
