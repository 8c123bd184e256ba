/**
 * The `OutboxStore` port in memory, for unit tests of the relay: no database,
 * and every "now" read from Effect's `Clock`, so `TestClock.adjust` is what
 * expires leases and brings retries due (never a real sleep). Each operation
 * mirrors its SQL statement (storage/sql/SqlOutboxStore.ts), including the rules
 * that matter to the relay: a claim skips rows another claim holds, a mark or
 * release only touches rows its token still holds.
 *
 * Usage: `make()` gives a handle (the store plus test controls: seed rows,
 * inspect them, take the store "down"); `layer(handle)` provides that handle's
 * store as `OutboxStore`, `layer()` a fresh one nobody inspects. Run the store
 * under the same `TestClock` the test adjusts, e.g. one
 * `ManagedRuntime.make(Layer.merge(layer(handle), TestClock.layer()))`.
 */
import { Effect, Layer } from "effect"
import { uuidv7 } from "../../core/uuid.ts"
import { StoreError } from "../../Errors.ts"
import type { Claim } from "../../ports/lease.ts"
import {
  type OutboxMark,
  type OutboxMessage,
  type OutboxShard,
  OutboxStore,
  type OutboxStoreShape,
} from "../../ports/OutboxStore.ts"
import type { PartitionPosition } from "../../ports/Transport.ts"
import { applyFailure, makeWakeups } from "./failureAndWakeups.ts"

/** A message to seed, as a producer's committed transaction would have written it. */
export interface MemoryOutboxInsert {
  /** The message id: unique in the table, and the consumers' dedupe key. */
  readonly id: string
  /** The event type. */
  readonly type: string
  /** The contract version the payload was written as. @default 1 */
  readonly version?: number
  /** JSON text. @default "{}" */
  readonly payload?: string
  /** String headers carried to the consumer. @default {} */
  readonly headers?: Readonly<Record<string, string>>
  /** Routing key on the topic exchange; null: the type. @default null */
  readonly routingKey?: string | null
  /** The ordering key; null for an unordered message. @default null */
  readonly partitionKey?: string | null
  /** Its place in the partition key's sequence; null without a key. @default null */
  readonly position?: PartitionPosition | null
  /** The tenant it was enqueued for, if any. @default null */
  readonly tenantId?: string | null
  /** When it comes due, in epoch ms of the `Clock`. @default now */
  readonly visibleAt?: number
}

/** One outbox row as a test sees it; times are epoch ms of the `Clock`. */
export interface MemoryOutboxRow extends Omit<OutboxMessage, "occurredAt"> {
  /** When it was enqueued. */
  readonly occurredAt: number
  /** `pending` until the broker confirms it (`sent`) or the relay gives up on it (`dead`). */
  readonly status: "pending" | "sent" | "dead"
  /** Publish attempts spent (an outage spends none). */
  readonly attempts: number
  /** When it is due: a delay or a retry's backoff moves it on, and so does a claim, by its lease. */
  readonly visibleAt: number
  /** The claim holding the row: a mark applies only while it still matches. */
  readonly lockToken: string | null
  /** Why the last attempt failed, or why it is dead. */
  readonly lastError: string | null
  /** When the broker confirmed it; null until sent. */
  readonly publishedAt: number | null
}

/** What `make` gives: the store, plus the controls a test seeds, inspects and breaks it with. */
export interface MemoryOutbox {
  /** The port itself. */
  readonly store: OutboxStoreShape
  /**
   * Inserts pending messages and wakes every `wakeups` listener, as the
   * migration's NOTIFY trigger does. A test fixture, not a port operation:
   * `setDown` leaves it working so a test can seed rows during an outage. Fails
   * (constraint) on an id already present, as the primary key would.
   */
  readonly enqueue: (rows: ReadonlyArray<MemoryOutboxInsert>) => Effect.Effect<void, StoreError>
  /** A snapshot of every row, in insertion order. */
  readonly rows: () => ReadonlyArray<MemoryOutboxRow>
  /** While down, every port operation fails with a retryable `StoreError` (reason "connection"). */
  readonly setDown: (down: boolean) => void
}

type Row = { -readonly [K in keyof MemoryOutboxRow]: MemoryOutboxRow[K] } & { readonly seq: number }

const snapshot = ({ seq: _seq, ...row }: Row): MemoryOutboxRow => ({ ...row, headers: { ...row.headers } })

const toMessage = (row: Row): OutboxMessage => ({
  id: row.id,
  type: row.type,
  version: row.version,
  payload: row.payload,
  headers: { ...row.headers },
  routingKey: row.routingKey,
  partitionKey: row.partitionKey,
  position: row.position ?? null,
  tenantId: row.tenantId,
  occurredAt: new Date(row.occurredAt),
  attempts: row.attempts,
})

// Due order as the claim's index gives it; insertion order breaks ties so runs are reproducible.
const byDue = (a: Row, b: Row): number => a.visibleAt - b.visibleAt || a.seq - b.seq

/** What one store holds: every operation below reads and writes it, and `make` gives each store its own. */
interface State {
  // A Map keeps insertion order, which `rows()` reports.
  readonly table: Map<string, Row>
  /** The next row's insertion number. */
  seq: number
  /** Set by `setDown`: every port operation fails while it is. */
  down: boolean
  /** Housekeeping tasks: who holds each, until when (ms on the `Clock`). */
  readonly tasks: Map<string, { holder: string; until: number }>
}

/**
 * One operation: the down check, then `f` with the `Clock`'s now in one
 * synchronous step, so no other fiber interleaves (as one SQL statement).
 */
const op = <A>(state: State, operation: string, f: (now: number) => A): Effect.Effect<A, StoreError> =>
  Effect.clockWith((clock) =>
    Effect.suspend(() =>
      state.down
        ? Effect.fail(new StoreError({ reason: "connection", operation, cause: "memory store is down" }))
        : Effect.succeed(f(clock.currentTimeMillisUnsafe())),
    ),
  )

/** FNV-1a, 32 bits: a stable hash for the memory store's hash shares (PostgreSQL's is `hashtext`). */
const hash32 = (text: string): number => {
  let h = 0x811c9dc5
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193)
  return h >>> 0
}

/** Whether `row` is in `shard` (every row without one). */
const inShard = (row: Row, shard: OutboxShard | undefined, now: number): boolean => {
  if (shard === undefined) return true
  if ("sweepAfterMs" in shard)
    return row.visibleAt > row.occurredAt || row.occurredAt <= now - shard.sweepAfterMs
  if ("tenants" in shard) return row.tenantId !== null && shard.tenants.includes(row.tenantId)
  return hash32(row.partitionKey ?? row.id) % shard.of === shard.index
}

const claim = (state: State) => (limit: number, leaseMs: number, shard?: OutboxShard) =>
  op(state, "OutboxStore.claim", (now): Claim<OutboxMessage> => {
    const token = uuidv7()
    // An expired lease needs no special case: its row is pending with visibleAt <= now again.
    const due = [...state.table.values()]
      .filter((r) => r.status === "pending" && r.visibleAt <= now && inShard(r, shard, now))
      .sort(byDue)
      .slice(0, Math.max(0, limit))
    for (const row of due) {
      row.lockToken = token
      row.visibleAt = now + leaseMs
    }
    return { token, rows: due.map(toMessage) }
  })

/** `mark`, or with a null token `settle`: rows no claim holds, settled whoever holds them. */
const mark = (state: State) => (token: string | null, marks: ReadonlyArray<OutboxMark>) =>
  op(state, token === null ? "OutboxStore.settle" : "OutboxStore.mark", (now) => {
    let changed = 0
    for (const { id, verdict } of marks) {
      const row = state.table.get(id)
      // The token check is what keeps a relay whose lease ran out from settling another's claim.
      if (row === undefined || (token !== null && row.lockToken !== token) || row.status !== "pending")
        continue
      if (verdict._tag === "Done") {
        // lastError stays: the SQL keeps it (COALESCE) as a trace of earlier failures.
        // The token stays, as the SQL stores keep it: it names the relay that published.
        row.status = "sent"
        row.publishedAt = now
      } else applyFailure(row, verdict, now)
      changed++
    }
    return changed
  })

const release = (state: State) => (token: string) =>
  op(state, "OutboxStore.release", (now) => {
    let released = 0
    for (const row of state.table.values()) {
      if (row.lockToken !== token || row.status !== "pending") continue
      row.lockToken = null
      row.visibleAt = now
      released++
    }
    return released
  })

const extend = (state: State) => (token: string, leaseMs: number) =>
  op(state, "OutboxStore.extend", (now) => {
    let extended = 0
    for (const row of state.table.values()) {
      if (row.lockToken !== token || row.status !== "pending") continue
      row.visibleAt = now + leaseMs
      extended++
    }
    return extended
  })

const lagSeconds = (state: State) =>
  op(state, "OutboxStore.lag", (now) => {
    let oldest = Number.POSITIVE_INFINITY
    for (const row of state.table.values()) {
      if (row.status === "pending" && row.visibleAt <= now && row.visibleAt < oldest) oldest = row.visibleAt
    }
    return oldest === Number.POSITIVE_INFINITY ? 0 : Math.max(0, (now - oldest) / 1000)
  })

const nextDueMs = (state: State) =>
  op(state, "OutboxStore.nextDue", (now) => {
    let first = Number.POSITIVE_INFINITY
    for (const row of state.table.values()) {
      if (row.status === "pending" && row.visibleAt < first) first = row.visibleAt
    }
    return first === Number.POSITIVE_INFINITY ? undefined : first - now
  })

// The SQL deletes in batches of `batchSize` until none is left; in memory one pass
// deletes the same rows, and the count is the same.
const purgeSent = (state: State) => (olderThanSeconds: number, _batchSize: number) =>
  op(state, "OutboxStore.purgeSent", (now) => {
    const cutoff = now - olderThanSeconds * 1000
    let deleted = 0
    for (const [id, row] of state.table) {
      if (row.status === "sent" && row.publishedAt !== null && row.publishedAt < cutoff) {
        state.table.delete(id)
        deleted++
      }
    }
    return deleted
  })

// The lease row of migration 0012: taken when free or expired, renewed by its holder.
const holdTask = (state: State) => (task: string, holder: string, ttlMs: number) =>
  op(state, "OutboxStore.holdTask", (now) => {
    const held = state.tasks.get(task)
    if (held !== undefined && held.holder !== holder && held.until >= now) return false
    state.tasks.set(task, { holder, until: now + ttlMs })
    return true
  })

/** The test fixture `MemoryOutbox.enqueue`; `wake` is the store's, for the NOTIFY it stands in for. */
const enqueue = (state: State, wake: () => void) => (rows: ReadonlyArray<MemoryOutboxInsert>) =>
  Effect.clockWith((clock) =>
    Effect.suspend(() => {
      const now = clock.currentTimeMillisUnsafe()
      const ids = new Set<string>()
      for (const r of rows) {
        // All or nothing, as one INSERT statement.
        if (state.table.has(r.id) || ids.has(r.id)) {
          return Effect.fail(
            new StoreError({
              reason: "constraint",
              operation: "MemoryOutbox.enqueue",
              cause: `duplicate outbox id ${r.id}`,
            }),
          )
        }
        ids.add(r.id)
      }
      for (const r of rows) {
        state.table.set(r.id, {
          seq: state.seq++,
          id: r.id,
          type: r.type,
          version: r.version ?? 1,
          payload: r.payload ?? "{}",
          headers: { ...r.headers },
          routingKey: r.routingKey ?? null,
          partitionKey: r.partitionKey ?? null,
          position: r.position ?? null,
          tenantId: r.tenantId ?? null,
          occurredAt: now,
          status: "pending",
          attempts: 0,
          visibleAt: r.visibleAt ?? now,
          lockToken: null,
          lastError: null,
          publishedAt: null,
        })
      }
      if (rows.length > 0) wake()
      return Effect.void
    }),
  )

/** A fresh, empty outbox store: its handle, the store plus test controls. */
export const make = (): Effect.Effect<MemoryOutbox> =>
  Effect.sync(() => {
    const state: State = { table: new Map(), seq: 0, down: false, tasks: new Map() }
    const { wake, wakeups } = makeWakeups((operation, f) => op(state, operation, f))
    return {
      store: {
        claim: claim(state),
        mark: mark(state),
        settle: (marks) => mark(state)(null, marks),
        release: release(state),
        extend: extend(state),
        lagSeconds: lagSeconds(state),
        nextDueMs: nextDueMs(state),
        purgeSent: purgeSent(state),
        holdTask: holdTask(state),
        wakeups,
      },
      enqueue: enqueue(state, wake),
      rows: () => [...state.table.values()].map(snapshot),
      setDown: (value: boolean) => {
        state.down = value
      },
    } satisfies MemoryOutbox
  })

/** Provides `handle`'s store as `OutboxStore`; without one, a fresh store. */
export const layer = (handle?: MemoryOutbox): Layer.Layer<OutboxStore> =>
  handle === undefined
    ? Layer.effect(OutboxStore)(Effect.map(make(), (h) => h.store))
    : Layer.succeed(OutboxStore)(handle.store)
