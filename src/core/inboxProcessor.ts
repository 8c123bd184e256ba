/**
 * One processor batch (store-then-process, and redriven rows in either mode):
 * claim pending rows under a lease, run each handler in its own transaction
 * that also marks the row processed, then record the failures in one
 * statement. The loop around it is `leaseLoop.ts`.
 */
import { Effect, Metric } from "effect"
import type { StoreError } from "../Errors.ts"
import * as Metrics from "../Metrics.ts"
import type { InboxMark, InboxRow, OrderedDeadPolicy } from "../ports/InboxStore.ts"
import { bounded } from "./bounded.ts"
import { decodeDelivery, rowAsDelivery } from "./decodeDelivery.ts"
import { runHandler } from "./handler.ts"
import { holdingLease } from "./heartbeat.ts"
import { deadInbox, failureOf, type InboxParts, retriedInbox, STATEMENTS_MS } from "./inboxConsumer.ts"
import { permanent, verdictFor } from "./verdict.ts"

export interface ProcessorSettings {
  readonly batchSize: number
  readonly leaseMs: number
  /** Handlers run at once, each in its own transaction (its own pooled connection). */
  readonly concurrency: number
  readonly onOrderedDead: OrderedDeadPolicy
}

export const processorCycle = (p: InboxParts, s: ProcessorSettings): Effect.Effect<number, StoreError> => {
  // Rows of ordered keys processed this cycle: each made its key's next row claimable.
  let advancedKeys = 0
  const processRow = (row: InboxRow, token: string): Effect.Effect<InboxMark | undefined> =>
    Effect.gen(function* () {
      const delivery = rowAsDelivery(row)
      const decoded = yield* decodeDelivery(p.registry, p.handlers, p.consumer, delivery, row.attempts)
      if (decoded._tag === "Bad") {
        const verdict = verdictFor(row.attempts, permanent(decoded.row.lastError ?? "undecodable"), p.retry)
        return verdict._tag === "Done" ? undefined : { key: row.key, verdict }
      }
      // The stored key is already the dedupe key; keep it whatever the contract computes now.
      const envelope = { ...decoded.envelope, dedupeKey: row.key }
      const result = yield* p.store
        .transaction((tx) =>
          Effect.gen(function* () {
            const mine = yield* tx.markProcessed(p.consumer, row.key, token, delivery.attempt)
            if (mine) {
              yield* runHandler(
                p.consumer,
                decoded.handler,
                decoded.payload,
                envelope,
                tx.trx,
                p.handlerTimeoutMs,
                p.messaging,
              )
            }
            return mine
          }),
        )
        .pipe(bounded("Inbox.transaction", p.handlerTimeoutMs + STATEMENTS_MS), Effect.result)
      if (result._tag === "Success") {
        if (result.success) {
          p.counters.processed++
          if (row.position != null) advancedKeys++
          yield* Metric.update(Metrics.processed, 1)
        }
        return undefined
      }
      const verdict = verdictFor(row.attempts, failureOf(result.failure), p.retry)
      return verdict._tag === "Done" ? undefined : { key: row.key, verdict }
    })

  return Effect.gen(function* () {
    advancedKeys = 0
    const { token, rows } = yield* Effect.suspend(() =>
      p.store.claim(p.consumer, s.batchSize, s.leaseMs, s.onOrderedDead),
    ).pipe(bounded("Inbox.claim", STATEMENTS_MS))
    if (rows.length === 0) return 0
    const ordered = new Set(rows.filter((r) => r.position != null).map((r) => r.key))
    // Each row in its own transaction, several at once: one at a time capped
    // the processor far below what the consumer side stores (bench/README.md "inbox").
    const results = yield* holdingLease(
      p.store.extend(p.consumer, token, s.leaseMs),
      s.leaseMs,
      Effect.forEach(rows, (row) => processRow(row, token), { concurrency: s.concurrency }),
    )
    const marks = results.filter((m): m is InboxMark => m !== undefined)
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
