/**
 * One processor batch (store-then-process, and redriven rows in either mode):
 * claim pending rows under a lease, share them out among `concurrency`
 * transactions that each mark their rows processed and run their handlers
 * (`sharedTransaction.ts` says what one failing row does to the others),
 * then record the failures in one statement. The loop around it is `leaseLoop.ts`.
 */
import { Effect, Metric } from "effect"
import type { Transaction } from "kysely"
import type { StoreError } from "../Errors.ts"
import * as Metrics from "../Metrics.ts"
import type { InboxMark, InboxRow, OrderedDeadPolicy } from "../ports/InboxStore.ts"
import { bounded } from "./bounded.ts"
import { type Decoded, decodeDelivery, rowAsDelivery } from "./decodeDelivery.ts"
import { HandlerFailed, nowRunning, runHandler, watchdog } from "./handler.ts"
import { holdingLease } from "./heartbeat.ts"
import {
  deadInbox,
  failureOf,
  type InboxParts,
  isOutage,
  retriedInbox,
  STATEMENTS_MS,
  transactionTimedOut,
} from "./inboxConsumer.ts"
import { FailedAt, runShared } from "./sharedTransaction.ts"
import { makeTransactionSize } from "./transactionSize.ts"
import { permanent, transient, verdictFor } from "./verdict.ts"

export interface ProcessorSettings {
  readonly batchSize: number
  readonly leaseMs: number
  /** Handlers run at once, each in its own transaction (its own pooled connection). */
  readonly concurrency: number
  readonly onOrderedDead: OrderedDeadPolicy
  /**
   * The inbox's "external" mode: each row's handler runs with no transaction, before the
   * transaction that marks its row processed; one row at a time, so a failure never runs another
   * row's effect again.
   */
  readonly external?: boolean
}

/** A claimed row to mark processed: with its decoded message, or a stand-in (core/standIn.ts), whose handler never runs. */
type Ready = {
  readonly row: InboxRow
  readonly decoded: Extract<Decoded, { readonly _tag: "Ok" }> | undefined
}

/** What a chained row gets when the row before it in its key did not go in its batch: back at once, no attempt spent. */
const HELD_BACK = new HandlerFailed("held back: the row before it in its key did not go in this batch")
const heldBack = (row: InboxRow): InboxMark => ({
  key: row.key,
  verdict: { _tag: "Retry", delayMs: 0, error: row.lastError ?? HELD_BACK.error, spendsAttempt: false },
})

/** Rows of one ordered key: they run in claim order, and none after one that fails. */
const keyChains = {
  same: (a: Ready, b: Ready) =>
    a.row.position != null && b.row.position != null && a.row.partitionKey === b.row.partitionKey,
  heldBack: HELD_BACK,
}

/** The ordered key of a row, if it has one. */
const orderedKey = (row: InboxRow): string | null => (row.position != null ? row.partitionKey : null)

/**
 * `concurrency` lanes at once, the claim's rows shared out among them (one
 * transaction per row capped the processor far below what the consumer side
 * stores: bench/README.md "inbox"); an ordered key's rows (a chain the claim
 * took) stay together, in order, in one lane. A lane runs as transactions of
 * `size` rows, one after another.
 */
const lanes = (ready: ReadonlyArray<Ready>, size: number): Ready[][] => {
  const groups = new Map<string, Ready[]>()
  const units: Ready[][] = []
  for (const item of ready) {
    const key = orderedKey(item.row)
    const group = key === null ? undefined : groups.get(key)
    if (group !== undefined) group.push(item)
    else {
      const unit = [item]
      units.push(unit)
      if (key !== null) groups.set(key, unit)
    }
  }
  const chunks: Ready[][] = []
  let current: Ready[] = []
  for (const unit of units) {
    if (current.length > 0 && current.length + unit.length > size) {
      chunks.push(current)
      current = []
    }
    current.push(...unit)
  }
  if (current.length > 0) chunks.push(current)
  return chunks
}

/**
 * One transaction for rows of a claim: marked processed in one statement
 * (a row the token no longer holds is skipped), then each one's handler in
 * turn. Commits or fails as a whole; per row, whether it was ours.
 */
const processTogether =
  (p: InboxParts, token: string) =>
  (
    items: ReadonlyArray<Ready>,
  ): Effect.Effect<ReadonlyArray<boolean>, FailedAt<HandlerFailed> | StoreError> =>
    watchdog(
      (running) =>
        p.store.transaction(
          (tx) => {
            const attempts = (item: Ready) => item.row.attempts + 1
            // The handlers of the rows still ours, in turn, from `from` on. Combinators, not
            // Effect.gen: once per batch (core/inboxConsumer.ts says why).
            const handleFrom = (
              mine: ReadonlyArray<boolean>,
              from: number,
            ): Effect.Effect<ReadonlyArray<boolean>, FailedAt<HandlerFailed> | StoreError> => {
              let i = from
              while (i < items.length && (mine[i] !== true || items[i]!.decoded === undefined)) i++
              if (i === items.length) return Effect.succeed(mine)
              const at = i
              const item = items[at]!
              const decoded = item.decoded!
              // The stored key is already the dedupe key; keep it whatever the contract computes now.
              const envelope = { ...decoded.envelope, dedupeKey: item.row.key }
              return nowRunning(running, at).pipe(
                Effect.andThen(
                  runHandler(
                    p.consumer,
                    decoded.handler,
                    decoded.payload,
                    envelope,
                    tx.trx,
                    undefined,
                    p.messaging,
                  ),
                ),
                Effect.mapError((error) => new FailedAt(at, error)),
                Effect.andThen(nowRunning(running, -1)),
                Effect.flatMap(() => handleFrom(mine, at + 1)),
              )
            }
            const marked: Effect.Effect<ReadonlyArray<boolean>, StoreError> = items.length === 1
              ? Effect.map(
                  tx.markProcessed(p.consumer, items[0]!.row.key, token, attempts(items[0]!)),
                  (mine) => [mine],
                )
              : tx.markProcessedAll(
                  p.consumer,
                  token,
                  items.map((item) => ({ key: item.row.key, attempts: attempts(item) })),
                )
            return Effect.flatMap(marked, (mine) => handleFrom(mine, 0))
          },
          // As in the consumer: the server cancels a handler's statement stuck past its time.
          { statementTimeoutMs: p.handlerTimeoutMs },
        ),
      p.handlerTimeoutMs,
      STATEMENTS_MS,
      (index) => transactionTimedOut(index, p.handlerTimeoutMs),
    )

/** What an "external" handler gets for `trx`: any use fails, saying why. */
// biome-ignore lint/suspicious/noExplicitAny: stands in for the caller's database
const NO_TRANSACTION = new Proxy({} as Transaction<any>, {
  get: (_, property) => {
    throw new TypeError(
      `inbox mode "external": the handler gets no transaction (it read trx.${String(property)}); ` +
        "use mode idempotent or store-then-process for effects in the database",
    )
  },
})

/**
 * One row in the "external" mode: its handler (no transaction), then its row marked processed
 * in a transaction of its own. The claim's lease is the "consuming" record: held (extended) while
 * the handler runs, so no other processor runs it meanwhile; if the process dies between the
 * effect and the mark, the lease lapses and the row runs again. The mark tells whether the row was
 * still ours: false only when the lease lapsed under a handler that outlived it.
 */
const processExternally =
  (p: InboxParts, token: string) =>
  (
    items: ReadonlyArray<Ready>,
  ): Effect.Effect<ReadonlyArray<boolean>, FailedAt<HandlerFailed> | StoreError> => {
    // The lanes give it one row (`size` 1 in processorCycle): a second would go unmarked.
    if (items.length !== 1) return Effect.die(new Error(`external mode: ${items.length} rows in one piece`))
    const item = items[0]!
    const decoded = item.decoded
    const handled =
      decoded === undefined
        ? Effect.void
        : runHandler(
            p.consumer,
            decoded.handler,
            decoded.payload,
            { ...decoded.envelope, dedupeKey: item.row.key },
            NO_TRANSACTION,
            p.handlerTimeoutMs,
            p.messaging,
          ).pipe(Effect.mapError((error) => new FailedAt(0, error)))
    const marked = p.store.transaction((tx) =>
      tx.markProcessed(p.consumer, item.row.key, token, item.row.attempts + 1),
    )
    return Effect.flatMap(handled, () =>
      Effect.flatMap(
        marked,
        (mine): Effect.Effect<ReadonlyArray<boolean>> =>
          mine
            ? Effect.succeed([true])
            : Effect.as(
                Effect.logWarning(
                  `inbox ${p.consumer}: ${item.row.key}'s lease lapsed while its handler ran: another processor may run its effect again`,
                ),
                [false],
              ),
      ),
    )
  }

/**
 * The claimed rows decoded for their handlers, in claim order. What cannot
 * run becomes a mark (dead when undecodable for good, retried when the
 * validator failed), and holds back its key's later rows of the claim.
 */
const decodeClaimed = (
  p: InboxParts,
  rows: ReadonlyArray<InboxRow>,
): Effect.Effect<{ readonly ready: Ready[]; readonly marks: InboxMark[] }> =>
  Effect.gen(function* () {
    const marks: InboxMark[] = []
    const ready: Ready[] = []
    // Keys whose claimed row before this one will not run in this batch (it could not be decoded).
    const stopped = new Set<string>()
    for (const row of rows) {
      const key = orderedKey(row)
      if (key !== null && stopped.has(key)) {
        marks.push(heldBack(row))
        continue
      }
      // A stand-in only holds its key's place: nothing to decode, no handler to run.
      if (row.standsInFor != null) {
        ready.push({ row, decoded: undefined })
        continue
      }
      const decoded = yield* decodeDelivery(
        p.registry,
        p.handlers,
        p.consumer,
        rowAsDelivery(row),
        row.attempts,
      )
      if (decoded._tag === "Ok") {
        ready.push({ row, decoded })
        continue
      }
      // Undecodable is for good; a validator that failed (a registry away) is worth another try.
      const failure =
        decoded._tag === "Failed"
          ? transient(decoded.error)
          : permanent(decoded.row.lastError ?? "undecodable")
      const verdict = verdictFor(row.attempts, failure, p.retry)
      if (verdict._tag !== "Done") marks.push({ key: row.key, verdict })
      if (key !== null) stopped.add(key)
    }
    return { ready, marks }
  })

export const processorCycle = (p: InboxParts, s: ProcessorSettings): Effect.Effect<number, StoreError> => {
  // Rows of ordered keys processed this cycle: each made its key's next row claimable.
  let advancedKeys = 0

  // Rows per transaction: fewer while handlers fail (transactionSize.ts).
  const transactionSize = makeTransactionSize(
    (error) => error instanceof HandlerFailed && error !== HELD_BACK,
  )

  /**
   * A lane's rows, up to `size` to a transaction (fewer while handlers fail),
   * one transaction after another; a key whose row failed holds back its rows
   * after it (they go back, due now, behind the failed one).
   */
  const processLane = (lane: ReadonlyArray<Ready>, size: number, token: string) =>
    Effect.gen(function* () {
      const marks: Array<InboxMark | undefined> = []
      const failedKeys = new Set<string>()
      for (let i = 0; i < lane.length; ) {
        const take = Math.min(size, transactionSize.current())
        const piece: Ready[] = []
        for (const item of lane.slice(i, i + take)) {
          const key = orderedKey(item.row)
          if (key !== null && failedKeys.has(key)) marks.push(heldBack(item.row))
          else piece.push(item)
        }
        i += take
        if (piece.length === 0) continue
        const pieceMarks = yield* processChunk(piece, token)
        for (const [j, mark] of pieceMarks.entries()) {
          const key = orderedKey(piece[j]!.row)
          if (mark !== undefined && key !== null) failedKeys.add(key)
        }
        marks.push(...pieceMarks)
      }
      return marks
    })

  /** What became of a chunk's rows: the failures as marks; the processed ones counted. */
  const processChunk = (items: ReadonlyArray<Ready>, token: string) =>
    Effect.flatMap(
      runShared(
        items,
        s.external ? processExternally(p, token) : processTogether(p, token),
        isOutage,
        keyChains,
      ),
      (results) => {
        transactionSize.settle(results)
        return Effect.forEach(items, (item, i): Effect.Effect<InboxMark | undefined> => {
          const result = results[i]
          if (result !== undefined && !result.ok && result.error === HELD_BACK)
            return Effect.succeed(heldBack(item.row))
          if (result === undefined || !result.ok) {
            const failure =
              result === undefined ? permanent("no result for the row") : failureOf(result.error)
            const verdict = verdictFor(item.row.attempts, failure, p.retry)
            return Effect.succeed(verdict._tag === "Done" ? undefined : { key: item.row.key, verdict })
          }
          if (!result.value) return Effect.succeed(undefined)
          if (item.row.position != null) advancedKeys++
          if (item.decoded === undefined) {
            p.counters.duplicates++
            return Effect.as(Metric.update(Metrics.duplicates, 1), undefined)
          }
          p.counters.processed++
          return Effect.as(Metric.update(Metrics.processed, 1), undefined)
        })
      },
    )

  return Effect.gen(function* () {
    advancedKeys = 0
    const { token, rows } = yield* Effect.suspend(() =>
      p.store.claim(p.consumer, s.batchSize, s.leaseMs, s.onOrderedDead, true),
    ).pipe(bounded("Inbox.claim", STATEMENTS_MS))
    if (rows.length === 0) return 0
    const ordered = new Set(rows.filter((r) => r.position != null).map((r) => r.key))
    const { ready, marks } = yield* decodeClaimed(p, rows)
    const results = yield* holdingLease(
      p.store.extend(p.consumer, token, s.leaseMs),
      s.leaseMs,
      Effect.suspend(() => {
        // External: one row at a time (processExternally).
        const size = s.external ? 1 : Math.ceil(ready.length / s.concurrency)
        return Effect.forEach(lanes(ready, size), (lane) => processLane(lane, size, token), {
          concurrency: s.concurrency,
        })
      }),
    )
    for (const chunk of results) for (const m of chunk) if (m !== undefined) marks.push(m)
    yield* p.store.mark(p.consumer, token, marks).pipe(bounded("Inbox.mark", STATEMENTS_MS))
    for (const m of marks) {
      // Under "skip" a dead ordered row lets its key's next row go, as a processed one does.
      if (m.verdict._tag === "Dead" && s.onOrderedDead === "skip" && ordered.has(m.key)) advancedKeys++
      if (m.verdict._tag === "Dead") p.counters.dead++
      else if (m.verdict.spendsAttempt) p.counters.retried++
      if (m.verdict._tag === "Dead" || m.verdict.spendsAttempt) {
        yield* Metric.update(m.verdict._tag === "Dead" ? deadInbox : retriedInbox, 1)
      }
    }
    p.counters.lastActivityAt = yield* Effect.clockWith((clock) =>
      Effect.succeed(clock.currentTimeMillisUnsafe()),
    )
    // A key that moved on has its next row waiting, which no NOTIFY announces: count the cycle
    // as full so the loop claims again at once instead of waiting for the poll.
    return advancedKeys > 0 ? Math.max(rows.length, s.batchSize) : rows.length
  })
}
