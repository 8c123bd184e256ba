/**
 * The inbox as the consumer and its processor see it, in domain words. Every
 * row is keyed by (consumer, key) where the key is the message id or the
 * handler's business key: the key is the dedupe. The PostgreSQL, PGlite and
 * Kysely stores provide it over SQL (`storage/sql/SqlInboxStore.ts`);
 * `storage/memory/MemoryInboxStore.ts` provides it in memory for unit tests.
 */
import { Context, type Effect, type Scope } from "effect"
import type { Transaction } from "kysely"
import type { RouteBinding } from "../core/keyRoutes.ts"
import type { StoreError } from "../Errors.ts"
import type { Claim, Verdict } from "./lease.ts"
import type { PartitionPosition } from "./Transport.ts"

export type { RouteBinding } from "../core/keyRoutes.ts"

/** One inbox row: a delivery as received (and, once claimed, as the processor sees it). */
export interface InboxRow {
  /** The dedupe key: the message id, or the handler's business key. */
  readonly key: string
  /** The consumer (queue) the row belongs to: each consumer dedupes and orders on its own. */
  readonly consumer: string
  /** The event type; null when the delivery carried none. */
  readonly type: string | null
  /** The contract version; null when the delivery carried none. */
  readonly version: number | null
  /** JSON text of the payload; null when the body could not be decoded. */
  readonly payload: string | null
  /** The body as received, kept only when it could not be decoded, so nothing a producer sent is lost. */
  readonly raw: string | null
  /** The delivery's application headers, as strings. */
  readonly headers: Readonly<Record<string, string>>
  /** The producer's partition key; null for a message enqueued without one. */
  readonly partitionKey: string | null
  /**
   * Its place in the key's sequence. A row with both is ordered: it is
   * claimed only after its predecessor was processed (the consumer's cursor
   * for the key is at `seq − 1`, or it is the first of a newer epoch).
   */
  readonly position?: PartitionPosition | null
  /** The tenant the producer enqueued it for, if any. */
  readonly tenantId: string | null
  /** Tries made so far: 0 for a stored delivery nobody ran yet. */
  readonly attempts: number
  /** Why the last try failed (or why the row is dead); null when no try has failed. */
  readonly lastError: string | null
  /**
   * Set on a stand-in, a row that only holds a place in its key's sequence
   * and whose handler never runs: for a resend under a `dedupeKey` (see
   * `insertPending`), the key it repeats; for a tombstone (a keyed message
   * its producer's relay gave up on), its own key.
   */
  readonly standsInFor?: string | null
}

/** How `InboxStoreShape.transaction` runs a handler's transaction. */
export interface InboxTransactionOptions {
  /**
   * Bounds on the database server too every statement after the transaction's
   * first row inserted or marked processed (`statement_timeout` for the rest
   * of the transaction, set by that write: no round trip of its own). A
   * handler's statement stuck on a lock is cancelled when the handler's time
   * is up, so the rollback and the connection are not held behind it.
   */
  readonly statementTimeoutMs?: number
}

/** The transaction a handler runs in, with the inbox writes that must commit with it. */
export interface InboxTransaction {
  /** Handed to the handler: its writes commit or roll back with the inbox row. */
  // biome-ignore lint/suspicious/noExplicitAny: the service's own database type; handlers annotate it
  readonly trx: Transaction<any>
  /**
   * Inserts the row as processed; false when its key is already there (a
   * duplicate). A processed row is the dedupe record: its payload and headers
   * are not kept (the handler's effects hold what matters of them).
   */
  readonly insertProcessed: (row: InboxRow) => Effect.Effect<boolean, StoreError>
  /**
   * Inserts several rows as processed in one statement: per row, in input
   * order, whether it was new. A key that is already there, or earlier in
   * `rows`, is a duplicate (false).
   */
  readonly insertProcessedAll: (
    rows: ReadonlyArray<InboxRow>,
  ) => Effect.Effect<ReadonlyArray<boolean>, StoreError>
  /**
   * Marks a claimed row processed; false when `token` no longer holds it. An
   * ordered row also moves its key's cursor to it, in the same transaction.
   */
  readonly markProcessed: (
    consumer: string,
    key: string,
    token: string,
    attempts: number,
  ) => Effect.Effect<boolean, StoreError>
  /** `markProcessed` for several rows of one claim in one statement: per row, in input order, whether `token` still held it. */
  readonly markProcessedAll: (
    consumer: string,
    token: string,
    rows: ReadonlyArray<{ readonly key: string; readonly attempts: number }>,
  ) => Effect.Effect<ReadonlyArray<boolean>, StoreError>
}

/**
 * What a dead ordered message does to its key: `block` holds the key's later
 * messages until the dead one is redriven or skipped (`txbox dead skip`);
 * `skip` lets them go on as if it had been handled.
 */
export type OrderedDeadPolicy = "block" | "skip"

/** A verdict for one claimed row (`Done` rows are marked inside their transaction instead). */
export interface InboxMark {
  /** The claimed row's dedupe key. */
  readonly key: string
  /** `Retry` or `Dead`: what becomes of the row. */
  readonly verdict: Exclude<Verdict, { readonly _tag: "Done" }>
}

/**
 * What the `InboxStore` service does: dedupe deliveries in the handler's
 * transaction, store them for later, and claim, settle and order stored rows.
 */
export interface InboxStoreShape {
  /** Runs `use` in one database transaction: commit when it succeeds, roll back when it fails or is interrupted. */
  readonly transaction: <A, E, R>(
    use: (tx: InboxTransaction) => Effect.Effect<A, E, R>,
    options?: InboxTransactionOptions,
  ) => Effect.Effect<A, E | StoreError, R>
  /**
   * Store-then-process: persists deliveries as pending in one write; returns
   * how many were new. An ordered row whose key is already there at another
   * position (a resend under the handler's `dedupeKey`) still takes its place
   * in its key's sequence: it is stored as a stand-in under the key
   * `<key>@<epoch>.<seq>` with `standsInFor` set, so that its key moves on
   * past it. A redelivery of the same position stores nothing.
   */
  readonly insertPending: (rows: ReadonlyArray<InboxRow>) => Effect.Effect<number, StoreError>
  /** Records rows that will never be handled (undecodable, unknown, out of attempts); duplicates are ignored. */
  readonly insertDead: (rows: ReadonlyArray<InboxRow>) => Effect.Effect<number, StoreError>
  /**
   * Claims up to `limit` due pending rows of `consumer` under a lease, as the
   * relay claims the outbox. An ordered row waits for its predecessor; under
   * `onDead: "skip"` a dead predecessor counts as passed. With `chains`, it
   * also claims behind an ordered row the rows of its key that wait for it in
   * turn: a claimed ordered row's predecessor is then handled, passed, or
   * claimed in the same batch before it (each key's rows in the order they
   * must run); up to CHAINED_PER_CLAIM (partitionGate.ts) × `limit` rows in all. The caller then handles a key's claimed rows one after another
   * and stops the key at the first that fails. @default onDead "block", chains false
   */
  readonly claim: (
    consumer: string,
    limit: number,
    leaseMs: number,
    onDead?: OrderedDeadPolicy,
    chains?: boolean,
  ) => Effect.Effect<Claim<InboxRow>, StoreError>
  /**
   * Keeps the due rows' front for what can go: sets aside ordered rows that
   * have waited a while for a predecessor that is not there, and brings back
   * those that may go now; answers how many came back. The mark that handles
   * a predecessor brings its successors back itself; the inbox runs this
   * every few seconds for the rest. A store whose claim reads every row
   * anyway may do nothing. @default onDead "block", waitedMs 2000 (rows
   * received more recently are left alone: their predecessor is likely on
   * its way)
   */
  readonly sweep: (
    consumer: string,
    options?: { readonly onDead?: OrderedDeadPolicy; readonly waitedMs?: number },
  ) => Effect.Effect<number, StoreError>
  /** Keeps the rows of `consumer` that `token` still holds for another `leaseMs` (while their handlers run). */
  readonly extend: (consumer: string, token: string, leaseMs: number) => Effect.Effect<number, StoreError>
  /** Records the failures of a claim in one write: retry later or dead. Returns how many rows changed. */
  readonly mark: (
    consumer: string,
    token: string,
    marks: ReadonlyArray<InboxMark>,
  ) => Effect.Effect<number, StoreError>
  /**
   * When `consumer`'s queue was first bound to each of `patterns` (ms since
   * 1970, the store's clock), recording now for a pattern it has not seen.
   * Called once the queue is bound (at the first delivery), so a recorded
   * time is never before the binding existed.
   */
  readonly bindings: (
    consumer: string,
    patterns: ReadonlyArray<string>,
    /** Recorded beside them for the operator's tools (`txbox status`). */
    onOrderedDead?: OrderedDeadPolicy,
  ) => Effect.Effect<ReadonlyArray<RouteBinding>, StoreError>
  /**
   * Creates the partitioned inbox's partitions (migration 0015) from now to
   * `aheadMs` ahead, `everyMs` long; returns the ones created. Dropping old
   * ones is the operator's (`txbox partitions drop`), who knows the dedupe
   * window. Optional: a store without partitions has nothing to keep.
   */
  readonly keepPartitions?: (options: {
    readonly aheadMs: number
    readonly everyMs: number
    /** Drops the partitions whose range ended, and whose last row was processed, longer ago (the dedupe window). */
    readonly dropOlderThanMs?: number
  }) => Effect.Effect<
    { readonly created: ReadonlyArray<string>; readonly dropped: ReadonlyArray<string> },
    StoreError
  >
  /**
   * Calls `onWake` when pending rows of `consumer` may have arrived (store-then-process), until the
   * scope closes. Latency only: a store may wake more often than that, never less.
   */
  readonly wakeups: (
    consumer: string,
    onWake: () => void,
    /** Told whether the wake-ups are heard (`Database.listen`'s `onHearing`). */
    onHearing?: (hears: boolean) => void,
  ) => Effect.Effect<void, StoreError, Scope.Scope>
  /**
   * Ms until `consumer`'s earliest pending row comes due (≤ 0: one is due now), or undefined when
   * none is pending: a row due by time (a retry's backoff, a lease that ran out) wakes nobody, so
   * an idle processor whose wake-ups are heard waits for it instead of polling. Optional: without
   * it the processor polls every `pollInterval`.
   */
  readonly nextDueMs?: (consumer: string) => Effect.Effect<number | undefined, StoreError>
}

// The base class in a variable with its type spelled out: JSR's fast check infers no type from a call.
// `@internal` sits on the name: deno doc reads a variable's tags there, not before `const`.
const /** @internal */ InboxStoreService: Context.ServiceClass<
    InboxStore,
    "txbox/InboxStore",
    InboxStoreShape
  > = Context.Service<InboxStore, InboxStoreShape>()("txbox/InboxStore")
/** The inbox storage port: the service the inbox processor and consumers run on, provided by a store layer. */
export class InboxStore extends InboxStoreService {}
