/**
 * `txbox/promise`: the same outbox, relay and inbox for code that does not use
 * Effect. Everything here is a thin shell over the Effect services: one
 * runtime per `createTxbox`, started and stopped with Promises.
 *
 * ```ts
 * const txbox = createTxbox({
 *   database: PgStore.layer({ url }),         // from "txbox/pg" (or PostgresJsStore, PgliteStore, KyselyStore)
 *   transport: AmqpTransport.layer({ url }),  // from "txbox/amqp" (or MemoryTransport from "txbox/testing")
 * })
 * await txbox.transaction(db, (trx) => txbox.enqueue(trx, OrderPlaced, { ... })) // the row goes with the COMMIT
 * const relay = txbox.relay(); await relay.start()
 * const inbox = txbox.inbox({ consumer: "billing", handlers: [on(OrderPlaced, async ({ payload, trx }) => ...)] })
 * await inbox.start()
 * ...
 * await txbox.close() // stops what is running, closes pools and connections
 * ```
 */
import { Cause, Effect, Exit, Layer, ManagedRuntime, Scope } from "effect"
import type { Transaction } from "kysely"
import type { AnyContract, InputOf, PayloadOf } from "../Contract.ts"
import * as Inbox from "../Inbox.ts"
import * as Outbox from "../Outbox.ts"
import type { TxboxStore } from "../ports/stores.ts"
import type { Transport } from "../ports/Transport.ts"
import * as Relay from "../Relay.ts"

export type {
  Envelope,
  Handler,
  HandlerContext,
  InboxConfig,
  InboxHealth,
  InboxMode,
  InboxStats,
} from "../Inbox.ts"
export type {
  ClientOf,
  EnqueuedMessage,
  EnqueueOptions,
  EventInput,
  Executor,
  SqlClient,
  SqlPool,
  TransactionOf,
  TransactionTarget,
} from "../Outbox.ts"
export type { OutboxShard } from "../ports/OutboxStore.ts"
export type { RelayConfig, RelayHealth, RelayStats } from "../Relay.ts"
export type { RetryPolicy } from "../Retry.ts"

/** What `createTxbox` runs on: the store and the transport, each as the Effect layer its driver gives. */
export interface TxboxOptions {
  /** A store layer: `PgStore.layer({ url, schema? })` (or another driver's store) or `PgliteStore.layer()`. Its schema is the one enqueue, relay and inbox use. */
  readonly database: Layer.Layer<TxboxStore, unknown>
  /** A transport layer: `AmqpTransport.layer({ url })` or `MemoryTransport.layer()`. */
  readonly transport: Layer.Layer<Transport, unknown>
}

/** A running part (relay or inbox): `start()` resolves once it is up, `stop()` once it has drained. */
export interface Service<S, H> {
  /** Starts it; resolves once it is up, a no-op when already running. Rejects on invalid options. */
  readonly start: () => Promise<void>
  /** Stops it gracefully (in-flight work drains); a no-op when not running. */
  readonly stop: () => Promise<void>
  /** Its counters since start; rejects when not started. */
  readonly stats: () => Promise<S>
  /** Its health check (`ready` for a readiness probe); rejects when not started. */
  readonly health: () => Promise<H>
}

/** What an `on` handler is given: the decoded message and the inbox transaction. */
export interface PromiseHandlerContext<A> {
  /** The payload, validated (and upcast) to the handler's contract. */
  readonly payload: A
  /** The message's id, dedupe key, headers, partition position, attempt… */
  readonly envelope: Inbox.Envelope
  /** The transaction the inbox row is written in: write your effects with it, so they commit with the row. */
  // biome-ignore lint/suspicious/noExplicitAny: the service's own database type
  readonly trx: Transaction<any>
}

/** Registers an async handler for a contract (the Promise twin of `Inbox.handler`). */
export const on = <C extends AnyContract>(
  contract: C,
  handle: (context: PromiseHandlerContext<PayloadOf<C>>) => Promise<void>,
  options: {
    readonly dedupeKey?: (payload: PayloadOf<C>, envelope: Omit<Inbox.Envelope, "dedupeKey">) => string
  } = {},
): Inbox.Handler =>
  Inbox.handler(
    contract,
    (context) => Effect.tryPromise({ try: () => handle(context), catch: (e) => e }),
    options,
  )

/** Turns a failed Effect into a rejected Promise carrying the typed error itself (not a FiberFailure). */
const run = <A, E, R>(runtime: ManagedRuntime.ManagedRuntime<R, never>, effect: Effect.Effect<A, E, R>) =>
  runtime.runPromiseExit(effect).then((exit) => {
    if (Exit.isSuccess(exit)) return exit.value
    throw Cause.squash(exit.cause)
  })

/** What `createTxbox` returns: spelled out, as JSR publishes no inferred types. */
export interface Txbox {
  /** Writes one event in the caller's Kysely transaction. Rejects with `ValidationError` and writes nothing if invalid. */
  readonly enqueue: <C extends AnyContract>(
    trx: Outbox.Executor,
    contract: C,
    payload: InputOf<C>,
    options?: Outbox.EnqueueOptions,
  ) => Promise<Outbox.EnqueuedMessage>
  /** Writes many events with one INSERT in the caller's transaction. */
  readonly enqueueMany: (
    trx: Outbox.Executor,
    events: ReadonlyArray<Outbox.EventInput>,
  ) => Promise<ReadonlyArray<Outbox.EnqueuedMessage>>
  /**
   * Runs `body` in a transaction txbox opens on `db` (a Kysely, a node-postgres pool or client) and
   * commits, the rows of `enqueue(trx, …)` going with the COMMIT in one round trip (`Outbox.transaction`).
   * Rejects with the body's error, or a `StoreError` when BEGIN or the COMMIT fails; nothing is committed then.
   */
  readonly transaction: <T extends Outbox.TransactionTarget, A>(
    db: T,
    body: (trx: Outbox.TransactionOf<T>) => Promise<A>,
  ) => Promise<A>
  /** A relay over this store and transport, not yet started: it publishes the outbox. */
  readonly relay: (config?: Relay.RelayConfig) => Service<Relay.RelayStats, Relay.RelayHealth>
  /** An inbox for one consumer, not yet started: it runs the handlers made with `on`. */
  readonly inbox: (config: Inbox.InboxConfig) => Service<Inbox.InboxStats, Inbox.InboxHealth>
  /** Stops every started relay and inbox (gracefully), then closes pools and connections. */
  readonly close: () => Promise<void>
}

/**
 * Builds the Promise API over one store and one transport. Nothing connects
 * until first used; `close()` releases it all.
 */
export const createTxbox = (options: TxboxOptions): Txbox => {
  // Two runtimes over one memo map: enqueue needs only the store (a producer
  // must not wait for the broker), relay and inbox need both; the store layer
  // is built once and shared.
  const memoMap = Effect.runSync(Layer.makeMemoMap)
  const database = options.database.pipe(Layer.orDie)
  const storeRuntime = ManagedRuntime.make(database, { memoMap })
  const runtime = ManagedRuntime.make(Layer.mergeAll(database, options.transport.pipe(Layer.orDie)), {
    memoMap,
  })
  const running = new Set<() => Promise<void>>()

  const service = <H extends { stats: Effect.Effect<unknown>; health: Effect.Effect<unknown> }>(
    make: Effect.Effect<H, unknown, TxboxStore | Transport | Scope.Scope>,
  ): Service<Effect.Success<H["stats"]>, Effect.Success<H["health"]>> => {
    let state: { scope: Scope.Closeable; handle: H } | undefined
    const stop = async () => {
      if (!state) return
      const { scope } = state
      state = undefined
      running.delete(stop)
      await Effect.runPromise(Scope.close(scope, Exit.void))
    }
    const current = () => {
      if (!state) throw new Error("not started: call start() first")
      return state.handle
    }
    return {
      start: async () => {
        if (state) return
        const scope = Effect.runSync(Scope.make())
        const handle = await runtime.runPromise(Scope.provide(make, scope)).catch(async (error) => {
          await Effect.runPromise(Scope.close(scope, Exit.void))
          throw error
        })
        state = { scope, handle }
        running.add(stop)
      },
      stop,
      stats: async () => Effect.runPromise(current().stats) as Promise<Effect.Success<H["stats"]>>,
      health: async () => Effect.runPromise(current().health) as Promise<Effect.Success<H["health"]>>,
    }
  }

  return {
    /** Writes one event in the caller's Kysely transaction. Rejects with `ValidationError` and writes nothing if invalid. */
    enqueue: <C extends AnyContract>(
      trx: Outbox.Executor,
      contract: C,
      payload: InputOf<C>,
      enqueueOptions: Outbox.EnqueueOptions = {},
    ): Promise<Outbox.EnqueuedMessage> =>
      run(storeRuntime, Outbox.enqueue(trx, contract, payload, enqueueOptions)),
    /** Writes many events with one INSERT in the caller's transaction. */
    enqueueMany: (trx: Outbox.Executor, events: ReadonlyArray<Outbox.EventInput>) =>
      run(storeRuntime, Outbox.enqueueMany(trx, events)),
    transaction: <T extends Outbox.TransactionTarget, A>(
      db: T,
      body: (trx: Outbox.TransactionOf<T>) => Promise<A>,
    ): Promise<A> =>
      run(
        storeRuntime,
        Outbox.transaction(db, (trx) => Effect.tryPromise({ try: () => body(trx), catch: (e) => e })),
      ),
    relay: (config: Relay.RelayConfig = {}) => service(Relay.make(config)),
    inbox: (config: Inbox.InboxConfig) => service(Inbox.make(config)),
    /** Stops every started relay and inbox (gracefully), then closes pools and connections. */
    close: async () => {
      await Promise.all([...running].map((stop) => stop()))
      await runtime.dispose()
      await storeRuntime.dispose()
    },
  }
}
