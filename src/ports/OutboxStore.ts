/**
 * The outbox as the relay sees it, in domain words: claim due messages under a
 * lease, settle them, hand a lease back, measure the lag, purge what was sent,
 * and wake up when something new commits. The PostgreSQL, PGlite and Kysely
 * stores provide it over SQL (`storage/sql/SqlOutboxStore.ts`);
 * `storage/memory/MemoryOutboxStore.ts` provides it in memory for unit tests.
 * Nothing here names a driver.
 */
import { Context, type Effect, type Scope } from "effect"
import type { StoreError } from "../Errors.ts"
import type { Claim, Verdict } from "./lease.ts"
import type { PartitionPosition } from "./Transport.ts"

/** One claimed outbox message, ready to publish. */
export interface OutboxMessage {
  /** The message id (a UUID): the AMQP `messageId` and the consumers' dedupe key. */
  readonly id: string
  /** The event type. */
  readonly type: string
  /** The contract version the payload was written as. */
  readonly version: number
  /** The payload as JSON text, passed to the broker untouched (never parsed and re-serialised). */
  readonly payload: string
  /** String headers from enqueue (`traceparent` among them). */
  readonly headers: Readonly<Record<string, string>>
  /** Null: route by type. */
  readonly routingKey: string | null
  /** The ordering key it was enqueued with; null for an unordered message. */
  readonly partitionKey: string | null
  /** Its place in the partition key's sequence (enqueued with a key). */
  readonly position?: PartitionPosition | null
  /** The tenant it was enqueued for, if any. */
  readonly tenantId: string | null
  /** When it was enqueued (the database's clock): the CloudEvents `time`. */
  readonly occurredAt: Date
  /** Attempts recorded before this claim. */
  readonly attempts: number
}

/** A verdict for one claimed message. */
export interface OutboxMark {
  /** The claimed message's id. */
  readonly id: string
  /** What becomes of it: sent, retried later, or dead. */
  readonly verdict: Verdict
}

/** What a claim took, and what it saw of the other relays. */
export interface OutboxClaim extends Claim<OutboxMessage> {
  /**
   * The last message any relay marked sent, as the claim saw it: how long before the claim (ms,
   * the database's clock), and whether the relay process that claimed it ranks before this store's
   * (`"before"`), is this store (`"self"`) or ranks after it (`"after"`); `"unknown"` when the row
   * names no claim (a WAL relay's, a per-row verdict's, an older relay's). Null when none was ever
   * sent; undefined when the store does not say. Relays use it so that, at a low rate, one of
   * them does the follow-up looks, not all of them (issue #25).
   */
  readonly lastPublished?: {
    readonly agoMs: number
    readonly by: "self" | "before" | "after" | "unknown"
  } | null
}

/**
 * A relay's share of the outbox (`RelayConfig.shard`): the rows of some tenants, or one of `of`
 * shares by a stable hash of the partition key (the id for a message without one), so that one
 * key is always in one share.
 */
export type OutboxShard =
  | { readonly tenants: ReadonlyArray<string> }
  | { readonly of: number; readonly index: number }
  /**
   * A WAL relay's sweep (issue #27): the rows its log does not publish. Those due later than they
   * were enqueued (a delay, a retry's backoff, a lease), and those enqueued more than `sweepAfterMs`
   * ago and still pending (the log's reader away, its slot lost or created anew).
   */
  | { readonly sweepAfterMs: number }

/** What the `OutboxStore` service does: claim due messages under a lease, settle them, and measure the backlog. */
export interface OutboxStoreShape {
  /**
   * Claims up to `limit` due pending messages (oldest due first) and holds them
   * for `leaseMs`: other claimers skip them meanwhile, and when the lease runs
   * out unsettled they come due again. Interrupting the claim hands back
   * whatever it took. With `shard`, only rows in that share.
   */
  readonly claim: (
    limit: number,
    leaseMs: number,
    shard?: OutboxShard,
  ) => Effect.Effect<OutboxClaim, StoreError>
  /**
   * Records verdicts in one write: `Done` → sent; `Retry` → pending again after
   * its delay (one attempt more only if it `spendsAttempt`); `Dead` → dead, one
   * attempt more. Only rows the claim `token` still holds change; returns how many did.
   */
  readonly mark: (token: string, marks: ReadonlyArray<OutboxMark>) => Effect.Effect<number, StoreError>
  /**
   * Records verdicts for rows no claim holds (what a WAL relay published), in one write, where
   * still pending: as `mark`, whoever holds them. Returns how many changed. Optional: a store
   * without it serves no WAL relay.
   */
  readonly settle?: (marks: ReadonlyArray<OutboxMark>) => Effect.Effect<number, StoreError>
  /**
   * Keeps the rows `token` still holds for another `leaseMs` from now: the
   * relay calls it while a batch is being published, so a slow batch is not
   * claimed (and published) again by another relay. Returns how many.
   */
  readonly extend: (token: string, leaseMs: number) => Effect.Effect<number, StoreError>
  /** Hands every row still held by `token` back, due now, attempts unchanged. Returns how many. */
  readonly release: (token: string) => Effect.Effect<number, StoreError>
  /** Seconds the oldest due pending message has waited (0 when none). */
  readonly lagSeconds: Effect.Effect<number, StoreError>
  /**
   * Milliseconds until the earliest pending message comes due (≤ 0: one is due
   * now; undefined: none is pending), a claimed one at the end of its lease.
   * The relay asks before a wait longer than a second, since a message due by
   * time (a delay, a retry's backoff, a dead relay's lease) wakes nobody.
   * Optional: without it, such a message waits for the poll interval.
   */
  readonly nextDueMs?: Effect.Effect<number | undefined, StoreError>
  /**
   * Deletes sent messages published more than `olderThanSeconds` ago, `batchSize`
   * rows per statement, until none is left; never a pending or dead one. Returns how many.
   */
  readonly purgeSent: (olderThanSeconds: number, batchSize: number) => Effect.Effect<number, StoreError>
  /**
   * Sets the messages marked sent between `fromMsAgo` and `toMsAgo` ago back to pending and due
   * now, so the relay publishes them again (at least once: consumers dedupe), keys' numbers and
   * attempts as they were. Returns how many. The relay calls it after its broker stopped
   * (`brokerStoppedAt`), for the minute before the stop. Optional: a store without it leaves them sent.
   */
  readonly resendSent?: (fromMsAgo: number, toMsAgo: number) => Effect.Effect<number, StoreError>
  /**
   * Keeps the partitioned outbox's partitions (migration 0015): creates those
   * from now to `aheadMs` ahead, `everyMs` long, and, given `dropOlderThanMs`,
   * drops those that ended longer ago and hold no pending or dead row.
   * Returns the partitions created and dropped. Optional: a store without
   * partitions has nothing to keep.
   */
  readonly keepPartitions?: (options: {
    readonly aheadMs: number
    readonly everyMs: number
    readonly dropOlderThanMs?: number
  }) => Effect.Effect<
    { readonly created: ReadonlyArray<string>; readonly dropped: ReadonlyArray<string> },
    StoreError
  >
  /**
   * Whether `holder` holds the housekeeping task `task` now: taken when free or
   * when its holder's lease ran out, renewed when `holder` already holds it,
   * for `ttlMs` from now. The relay runs its lag probe and its retention only
   * while it holds them, so one process at a time does each, however many run.
   * Optional: without it every relay runs them.
   */
  readonly holdTask?: (task: string, holder: string, ttlMs: number) => Effect.Effect<boolean, StoreError>
  /**
   * Calls `onWake` when new messages may be due (a NOTIFY on commit), until the
   * scope closes. Only shortens latency: it may call spuriously or never, and
   * polling alone must stay correct.
   */
  readonly wakeups: (
    onWake: () => void,
    /** Told whether the wake-ups are heard (`Database.listen`'s `onHearing`). */
    onHearing?: (hears: boolean) => void,
  ) => Effect.Effect<void, StoreError, Scope.Scope>
}

// The base class in a variable with its type spelled out: JSR's fast check infers no type from a call.
// `@internal` sits on the name: deno doc reads a variable's tags there, not before `const`.
const /** @internal */ OutboxStoreService: Context.ServiceClass<
    OutboxStore,
    "txbox/OutboxStore",
    OutboxStoreShape
  > = Context.Service<OutboxStore, OutboxStoreShape>()("txbox/OutboxStore")
/** The outbox storage port: the service the relay runs on, provided by a store layer. */
export class OutboxStore extends OutboxStoreService {}
