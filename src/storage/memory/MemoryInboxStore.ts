/**
 * The `InboxStore` port in memory, for unit tests of the consumer and the
 * inbox processor: no database, and every "now" read from Effect's `Clock`, so
 * `TestClock.adjust` expires leases and brings retries due. Each operation
 * mirrors its SQL statement (storage/sql/SqlInboxStore.ts), keyed by (consumer, key).
 *
 * Transactions keep PostgreSQL's behaviour where handlers can observe it:
 * - Writes through the `InboxTransaction` are buffered and applied on commit,
 *   dropped when `use` fails or is interrupted.
 * - A key inserted by a transaction still open is held: another insert of
 *   that key waits until the holder ends, then sees the committed row (a
 *   duplicate) or, after a rollback, wins. That is what ON CONFLICT does under
 *   PostgreSQL, and it is why a redelivery racing a handler that later fails is
 *   not acknowledged as a duplicate and lost.
 * - A row marked processed by an open transaction is locked: claims skip it
 *   (SKIP LOCKED) and other writes to it wait.
 * Deadlocks (two transactions each waiting on a key the other holds) are not
 * detected: both wait, where PostgreSQL would abort one.
 *
 * Usage as for `MemoryOutboxStore`: `make()` gives a handle, `layer(handle)`
 * provides its store, `layer()` a fresh one.
 */
import { Deferred, Effect, Layer } from "effect"
import type { Transaction } from "kysely"
import { standInsFor } from "../../core/standIn.ts"
import { uuidv7 } from "../../core/uuid.ts"
import { StoreError } from "../../Errors.ts"
import {
  type InboxMark,
  type InboxRow,
  InboxStore,
  type InboxStoreShape,
  type InboxTransaction,
  type OrderedDeadPolicy,
} from "../../ports/InboxStore.ts"
import type { Claim } from "../../ports/lease.ts"
import type { PartitionPosition } from "../../ports/Transport.ts"
import {
  advanced,
  afterOf,
  CHAINED_PER_CLAIM,
  isEarly,
  onlyDeadBefore,
  type PartitionCursor,
} from "../sql/partitionGate.ts"
import { applyFailure, makeWakeups } from "./failureAndWakeups.ts"

/** One inbox row as a test sees it; times are epoch ms of the `Clock`. */
export interface MemoryInboxRow extends InboxRow {
  /** `pending` while stored for the processor, then `processed` (the dedupe record) or `dead`. */
  readonly status: "pending" | "processed" | "dead"
  /** When a pending row is due: a retry's backoff moves it on, and so does a claim, by its lease. */
  readonly visibleAt: number
  /** The claim holding the row: a mark applies only while it still matches. */
  readonly lockToken: string | null
  /** When it was stored. */
  readonly receivedAt: number
  /** When it was marked processed, in its handler's transaction; null until processed. */
  readonly processedAt: number | null
}

/** What `make` gives: the store, plus the controls a test inspects and breaks it with. */
export interface MemoryInbox {
  /** The port itself. */
  readonly store: InboxStoreShape
  /** A snapshot of the committed rows (of one consumer, if given), in insertion order. */
  readonly rows: (consumer?: string) => ReadonlyArray<MemoryInboxRow>
  /** While down, every port operation fails with a retryable `StoreError` (reason "connection"), commit included. */
  readonly setDown: (down: boolean) => void
}

type Row = { -readonly [K in keyof MemoryInboxRow]: MemoryInboxRow[K] } & { readonly seq: number }

/** An open transaction: what it will write on commit, and the keys it holds meanwhile. */
interface Tx {
  open: boolean
  readonly inserts: Map<string, Row>
  readonly marks: Map<string, { readonly token: string; readonly attempts: number; readonly at: number }>
  /** Completed when the transaction ends, either way: whoever waits on one of its keys looks again. */
  readonly ended: Deferred.Deferred<void>
}

/** A write that has to wait for `tx` to end before it can decide. */
class Blocked {
  readonly tx: Tx
  constructor(tx: Tx) {
    this.tx = tx
  }
}

const rowKey = (consumer: string, key: string): string => JSON.stringify([consumer, key])

const snapshot = ({ seq: _seq, ...row }: Row): MemoryInboxRow => ({ ...row, headers: { ...row.headers } })

/** The port's fields of a row (a copy, headers included): what a claim hands out and an insert stores. */
const toInboxRow = (row: InboxRow): InboxRow => ({
  key: row.key,
  consumer: row.consumer,
  type: row.type,
  version: row.version,
  payload: row.payload,
  raw: row.raw,
  headers: { ...row.headers },
  partitionKey: row.partitionKey,
  position: row.position ?? null,
  tenantId: row.tenantId,
  attempts: row.attempts,
  lastError: row.lastError,
  standsInFor: row.standsInFor ?? null,
})

/** The claim's per-key gate: an ordered row waits until it is next (or, under "skip", until only dead rows are before it). */
const waits = (
  row: Row,
  cursor: PartitionCursor | undefined,
  deadBefore: ((at: PartitionPosition) => boolean) | undefined,
): boolean =>
  row.position != null &&
  row.partitionKey !== null &&
  isEarly(row.position, cursor) &&
  !(deadBefore?.(row.position) ?? false)

const byDue = (a: Row, b: Row): number => a.visibleAt - b.visibleAt || a.seq - b.seq

/**
 * What a handler gets as `trx`: unit-test handlers write nothing through SQL,
 * and one that tries should fail loudly rather than silently do nothing.
 * Symbols and `then` answer undefined so inspecting the transaction or
 * resolving a promise with it does not throw.
 */
// biome-ignore lint/suspicious/noExplicitAny: the port's own type for `trx`
type AnyTransaction = Transaction<any>

const noSqlTransaction: AnyTransaction = new Proxy(Object.freeze({}), {
  get(_target, property) {
    if (typeof property === "symbol" || property === "then") return undefined
    throw new Error(
      `the memory inbox store has no SQL transaction: the handler used trx.${property}. ` +
        "Unit tests on MemoryInboxStore cannot run SQL; test SQL side effects against PostgreSQL or PGlite.",
    )
  },
}) as unknown as AnyTransaction

/** What one store holds: every operation below reads and writes it, and `make` gives each store its own. */
interface State {
  readonly table: Map<string, Row>
  /** Per (consumer, partition key): the last number processed. */
  readonly cursors: Map<string, PartitionCursor>
  /** Keys an open transaction has inserted (not yet in `table`) or marked (locked). */
  readonly held: Map<string, Tx>
  /** When each (consumer, pattern) was first bound: the first time it was asked for. */
  readonly boundAt: Map<string, number>
  /** The next row's insertion number. */
  seq: number
  /** Set by `setDown`: every port operation fails while it is. */
  down: boolean
}

const downError = (operation: string) =>
  new StoreError({ reason: "connection", operation, cause: "memory store is down" })

/**
 * One operation: the down check, then `f` with the `Clock`'s now in one
 * synchronous step (as one SQL statement). When `f` answers `Blocked`, waits
 * for that transaction to end and runs `f` again from the start.
 */
const op = <A>(
  state: State,
  operation: string,
  f: (now: number) => A | Blocked,
): Effect.Effect<A, StoreError> =>
  Effect.clockWith((clock) =>
    Effect.suspend((): Effect.Effect<A, StoreError> => {
      if (state.down) return Effect.fail(downError(operation))
      const result = f(clock.currentTimeMillisUnsafe())
      return result instanceof Blocked
        ? Effect.flatMap(Deferred.await(result.tx.ended), () => op(state, operation, f))
        : Effect.succeed(result)
    }),
  )

/** The first of `keys` held by a transaction other than `self`. */
const blocker = (state: State, keys: Iterable<string>, self?: Tx): Blocked | undefined => {
  for (const k of keys) {
    const tx = state.held.get(k)
    if (tx !== undefined && tx !== self) return new Blocked(tx)
  }
  return undefined
}

const newRow = (state: State, row: InboxRow, now: number, status: Row["status"]): Row => ({
  seq: state.seq++,
  ...toInboxRow(row),
  status,
  visibleAt: now,
  lockToken: null,
  receivedAt: now,
  processedAt: null,
})

/** INSERT … ON CONFLICT DO NOTHING of a batch; a key in the batch twice is stored once. */
const insertRows = (
  state: State,
  operation: string,
  rows: ReadonlyArray<InboxRow>,
  status: "pending" | "dead",
) =>
  op(state, operation, (now) => {
    const { table } = state
    const fresh = rows.map((r) => rowKey(r.consumer, r.key)).filter((k) => !table.has(k))
    const blocked = blocker(state, fresh)
    if (blocked) return blocked
    let inserted = 0
    const keys = new Set<string>()
    for (const r of rows) {
      const k = rowKey(r.consumer, r.key)
      if (table.has(k)) continue
      table.set(k, newRow(state, r, now, status))
      keys.add(r.key)
      inserted++
    }
    if (status !== "pending") return inserted
    for (const r of standInsFor(rows, keys)) {
      const k = rowKey(r.consumer, r.key)
      const repeated = table.get(rowKey(r.consumer, r.standsInFor!))
      const samePlace =
        repeated?.position != null &&
        r.position != null &&
        repeated.position.epoch === r.position.epoch &&
        repeated.position.seq === r.position.seq
      if (table.has(k) || samePlace) continue
      table.set(k, newRow(state, r, now, status))
      inserted++
    }
    return inserted
  })

// Only pending rows wake the processor, as the migration's trigger decides.
const insertPending = (state: State, wake: () => void) => (rows: ReadonlyArray<InboxRow>) =>
  Effect.tap(insertRows(state, "InboxStore.insertPending", rows, "pending"), (n) =>
    n > 0 ? Effect.sync(wake) : Effect.void,
  )

const insertDead = (state: State) => (rows: ReadonlyArray<InboxRow>) =>
  insertRows(state, "InboxStore.insertDead", rows, "dead")

const bindings = (state: State) => (consumer: string, patterns: ReadonlyArray<string>) =>
  op(state, "InboxStore.bindings", (now) =>
    patterns.map((pattern) => {
      const k = rowKey(consumer, pattern)
      if (!state.boundAt.has(k)) state.boundAt.set(k, now)
      return { pattern, boundAtMs: state.boundAt.get(k)! }
    }),
  )

/** Under "skip", per partition key: whether only dead rows of `consumer` stand before a position. */
const deadBeforeOf =
  (state: State, consumer: string, onDead: OrderedDeadPolicy) =>
  (key: string): ((at: PartitionPosition) => boolean) | undefined =>
    onDead === "skip"
      ? (at: PartitionPosition) =>
          onlyDeadBefore(at, (seq) =>
            [...state.table.values()].some(
              (r) =>
                r.consumer === consumer &&
                r.partitionKey === key &&
                r.status === "dead" &&
                r.position?.epoch === at.epoch &&
                r.position.seq === seq,
            ),
          )
      : undefined

/** The claim's first pick: up to `limit` due rows of `consumer` that no open transaction holds and no gate stops. */
const dueRows = (state: State, consumer: string, limit: number, onDead: OrderedDeadPolicy, now: number) => {
  const deadBefore = deadBeforeOf(state, consumer, onDead)
  return (
    [...state.table.entries()]
      // Rows an open transaction has locked are skipped, not waited for (SKIP LOCKED).
      .filter(
        ([k, r]) =>
          r.consumer === consumer &&
          r.status === "pending" &&
          r.visibleAt <= now &&
          !state.held.has(k) &&
          !(
            r.partitionKey !== null &&
            waits(r, state.cursors.get(rowKey(consumer, r.partitionKey)), deadBefore(r.partitionKey))
          ),
      )
      .map(([, r]) => r)
      .sort(byDue)
      .slice(0, Math.max(0, limit))
  )
}

/** Behind each ordered row taken, the rows of its key that wait for it, in turn (as the SQL claim's chains). */
const chainBehind = (state: State, consumer: string, limit: number, due: Row[], now: number): void => {
  for (let i = 0; i < due.length && due.length < limit * CHAINED_PER_CLAIM; i++) {
    const taken = due[i]!
    if (taken.position == null || taken.partitionKey === null) continue
    const next = [...state.table.entries()].find(
      ([k, r]) =>
        r.consumer === consumer &&
        r.status === "pending" &&
        r.visibleAt <= now &&
        !state.held.has(k) &&
        r.partitionKey === taken.partitionKey &&
        r.position?.epoch === taken.position!.epoch &&
        afterOf(r.position) === taken.position!.seq &&
        !due.includes(r),
    )
    if (next !== undefined) due.push(next[1])
  }
}

const claim =
  (state: State) =>
  (consumer: string, limit: number, leaseMs: number, onDead: OrderedDeadPolicy = "block", chains = false) =>
    op(state, "InboxStore.claim", (now): Claim<InboxRow> => {
      const token = uuidv7()
      const due = dueRows(state, consumer, limit, onDead, now)
      if (chains) chainBehind(state, consumer, limit, due, now)
      for (const row of due) {
        row.lockToken = token
        row.visibleAt = now + leaseMs
      }
      return { token, rows: due.map(toInboxRow) }
    })

const extend = (state: State) => (consumer: string, token: string, leaseMs: number) =>
  op(state, "InboxStore.extend", (now) => {
    let extended = 0
    for (const [k, row] of state.table.entries()) {
      // Rows an open transaction holds are skipped (SKIP LOCKED), as in SQL.
      if (
        row.consumer !== consumer ||
        row.lockToken !== token ||
        row.status !== "pending" ||
        state.held.has(k)
      )
        continue
      row.visibleAt = now + leaseMs
      extended++
    }
    return extended
  })

const mark = (state: State) => (consumer: string, token: string, marks: ReadonlyArray<InboxMark>) =>
  op(state, "InboxStore.mark", (now) => {
    // Only existing rows can be locked; an insert still uncommitted is invisible here, as in SQL.
    const blocked = blocker(
      state,
      marks.map((m) => rowKey(consumer, m.key)).filter((k) => state.table.has(k)),
    )
    if (blocked) return blocked
    let changed = 0
    for (const { key, verdict } of marks) {
      const row = state.table.get(rowKey(consumer, key))
      if (row === undefined || row.lockToken !== token || row.status !== "pending") continue
      applyFailure(row, verdict, now)
      changed++
    }
    return changed
  })

/** Ends `tx` either way: frees its keys and wakes whoever waits on them. Idempotent. */
const end = (state: State, tx: Tx) => {
  if (!tx.open) return
  tx.open = false
  for (const [k, holder] of state.held) if (holder === tx) state.held.delete(k)
  Deferred.doneUnsafe(tx.ended, Effect.void)
}

const commit = (state: State, tx: Tx) =>
  op(state, "InboxStore.commit", () => {
    for (const [k, row] of tx.inserts) state.table.set(k, row)
    for (const [k, m] of tx.marks) {
      const row = state.table.get(k)
      // Still true, since the lock kept every other write off the row; checked all the same.
      if (row === undefined || row.lockToken !== m.token || row.status !== "pending") continue
      row.status = "processed"
      row.processedAt = m.at
      row.attempts = m.attempts
      row.lockToken = null
      if (row.partitionKey !== null && row.position != null) {
        const ck = rowKey(row.consumer, row.partitionKey)
        state.cursors.set(ck, advanced(state.cursors.get(ck), row.position))
      }
    }
    end(state, tx)
  })

/** The `InboxTransaction` a handler writes through: its writes go to `tx`'s buffers, and hold their keys. */
const handle = (state: State, tx: Tx): InboxTransaction => {
  const inTx = <A>(operation: string, f: (now: number) => A | Blocked) =>
    op(state, operation, (now) => {
      if (!tx.open) {
        // A handler kept its transaction past the end of `use`: a bug in the caller, said plainly.
        throw new Error(`${operation}: the memory inbox transaction has already ended`)
      }
      return f(now)
    })
  const self: InboxTransaction = {
    trx: noSqlTransaction,
    insertProcessed: (row) =>
      inTx("InboxStore.insertProcessed", (now) => {
        const k = rowKey(row.consumer, row.key)
        if (state.table.has(k) || tx.inserts.has(k)) return false
        const blocked = blocker(state, [k], tx)
        if (blocked) return blocked
        state.held.set(k, tx)
        // As the SQL's single-row insert: processed now, the dedupe record only (no payload,
        // headers, raw body or error).
        tx.inserts.set(k, {
          ...newRow(
            state,
            { ...row, payload: null, headers: {}, raw: null, lastError: null },
            now,
            "processed",
          ),
          processedAt: now,
        })
        return true
      }),
    insertProcessedAll: (rows) => Effect.forEach(rows, (row) => self.insertProcessed(row)),
    markProcessedAll: (consumer, token, rows) =>
      Effect.forEach(rows, ({ key, attempts }) => self.markProcessed(consumer, key, token, attempts)),
    markProcessed: (consumer, key, token, attempts) =>
      inTx("InboxStore.markProcessed", (now) => {
        const k = rowKey(consumer, key)
        // Marked already in this transaction: the row reads processed here, so no match.
        if (tx.marks.has(k) || !state.table.has(k)) return false
        const blocked = blocker(state, [k], tx)
        if (blocked) return blocked
        const row = state.table.get(k)
        if (row === undefined || row.lockToken !== token || row.status !== "pending") return false
        state.held.set(k, tx)
        tx.marks.set(k, { token, attempts, at: now })
        return true
      }),
  }
  return self
}

const transaction =
  (state: State) =>
  <A, E, R>(use: (tx: InboxTransaction) => Effect.Effect<A, E, R>): Effect.Effect<A, E | StoreError, R> =>
    Effect.acquireUseRelease(
      op(
        state,
        "InboxStore.begin",
        (): Tx => ({
          open: true,
          inserts: new Map(),
          marks: new Map(),
          ended: Deferred.makeUnsafe<void>(),
        }),
      ),
      (tx) => Effect.flatMap(use(handle(state, tx)), (a) => Effect.as(commit(state, tx), a)),
      // After a commit this does nothing; otherwise it is the rollback: the buffered writes go.
      (tx) => Effect.sync(() => end(state, tx)),
    )

/** A fresh, empty inbox store: its handle, the store plus test controls. */
export const make = (): Effect.Effect<MemoryInbox> =>
  Effect.sync(() => {
    const state: State = {
      table: new Map(),
      cursors: new Map(),
      held: new Map(),
      boundAt: new Map(),
      seq: 0,
      down: false,
    }
    const { wake, wakeups } = makeWakeups((operation, f) => op(state, operation, f))
    return {
      // Nothing is parked here: the memory store's claim reads every row anyway.
      store: {
        transaction: transaction(state),
        insertPending: insertPending(state, wake),
        insertDead: insertDead(state),
        claim: claim(state),
        extend: extend(state),
        mark: mark(state),
        bindings: bindings(state),
        sweep: () => Effect.succeed(0),
        // Every consumer's listeners wake on any pending row: more often than SQL's per-consumer
        // channel, which the port allows (latency only).
        wakeups: (_consumer, onWake) => wakeups(onWake),
      },
      rows: (consumer?: string) =>
        [...state.table.values()]
          .filter((r) => consumer === undefined || r.consumer === consumer)
          .map(snapshot),
      setDown: (value: boolean) => {
        state.down = value
      },
    } satisfies MemoryInbox
  })

/** Provides `handle`'s store as `InboxStore`; without one, a fresh store. */
export const layer = (handle?: MemoryInbox): Layer.Layer<InboxStore> =>
  handle === undefined
    ? Layer.effect(InboxStore)(Effect.map(make(), (h) => h.store))
    : Layer.succeed(InboxStore)(handle.store)
