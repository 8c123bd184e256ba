/**
 * The outbox's inserts as the database's log tells them, in commit order: what a relay with
 * `source: "wal"` reads instead of claiming (issue #27). `txbox/pg`'s `WalLog.layer` provides it
 * over PostgreSQL logical replication (a durable slot, the `pgoutput` plugin). Nothing here names a
 * driver.
 *
 * At least once: a batch's rows come again after a reconnect unless its position was confirmed,
 * and the log keeps what is not confirmed (the slot holds its WAL) however long the relay is away.
 */
import { Context, type Effect } from "effect"
import type { OutboxMessage } from "./OutboxStore.ts"
import type { OutboxStatus } from "./tables.ts"

/** An inserted outbox row, as committed. */
export interface OutboxLogRow extends OutboxMessage {
  /** Its status when inserted: `pending` unless the producer wrote another. */
  readonly status: OutboxStatus
  /** When it comes due: later than `occurredAt` for a delayed message, which the log's relay leaves to its sweep. */
  readonly visibleAt: Date
}

/** Whole committed transactions' rows, oldest first, and the log position after the last. */
export interface OutboxLogBatch {
  /** The rows, in commit order. */
  readonly rows: ReadonlyArray<OutboxLogRow>
  /** Confirm it once every row is settled: the log then never gives them again. */
  readonly position: bigint
}

/** How the log's reading goes, for health, metrics and `txbox status`. */
export interface OutboxLogStatus {
  /** The replication slot read. */
  readonly slot: string
  /** Whether this process reads the slot now; false while another does (a standby) or while it reconnects. */
  readonly reading: boolean
  /** WAL the slot keeps on the server for its reader, bytes; undefined until first measured, or when the slot is gone. */
  readonly retainedBytes: number | undefined
  /** Whether `retainedBytes` is over the layer's warning threshold. */
  readonly retainedOverWarning: boolean
  /** Why the last connection or setup failed, cleared when reading again. */
  readonly lastError: string | undefined
}

/** What the `OutboxLog` service does. */
export interface OutboxLogShape {
  /**
   * Waits until at least one committed transaction inserted outbox rows, then gives the rows of
   * every whole transaction read so far, up to `maxRows` (more when one transaction alone has
   * more). Never fails: a lost connection is reconnected inside, and what was not confirmed comes
   * again.
   */
  readonly take: (maxRows: number) => Effect.Effect<OutboxLogBatch>
  /** Everything up to `position` is settled: the log may let go of it. */
  readonly confirm: (position: bigint) => Effect.Effect<void>
  /** The reading's state now. */
  readonly status: Effect.Effect<OutboxLogStatus>
}

// The base class in a variable with its type spelled out: JSR's fast check infers no type from a call.
// `@internal` sits on the name: deno doc reads a variable's tags there, not before `const`.
const /** @internal */ OutboxLogService: Context.ServiceClass<OutboxLog, "txbox/OutboxLog", OutboxLogShape> =
    Context.Service<OutboxLog, OutboxLogShape>()("txbox/OutboxLog")
/** The outbox's log port: what a relay with `source: "wal"` reads, provided by `WalLog.layer` (`txbox/pg`). */
export class OutboxLog extends OutboxLogService {}
