/**
 * How many rows the processor puts in one transaction (and how many
 * deliveries share one in idempotent mode), adapted to how often handlers
 * fail. Rows share a transaction to spread its round trips, but a
 * handler that fails rolls the whole transaction back, and the rows before it
 * run again (`sharedTransaction.ts`): with 5 % of handler runs failing, a
 * transaction of 250 rows ran each handler 3 times, one of 16 1.4 times
 * (bench/ordered.ts `--handler-failures 0.05`). Halved for each handler that
 * failed a transaction, one row more after each that committed: under a steady
 * failure rate it settles where failures are rare per transaction, and with
 * none it stays at its cap.
 * Pure; one per processor, one per idempotent consumer (cap 64).
 */
import type { ItemResult } from "./batcher.ts"

/** Rows in one processor transaction at most. */
export const MAX_ROWS_PER_TRANSACTION = 16

export interface TransactionSize {
  /** Rows the next transaction may take. */
  readonly current: () => number
  /**
   * What a transaction's rows came to: halved for each whose handler failed, one more when every
   * row committed; anything else (our database away) leaves the size as it is.
   */
  readonly settle: (results: ReadonlyArray<ItemResult<unknown, unknown>>) => void
}

export const makeTransactionSize = (
  /** Whether a row's error is its own handler's failure. */
  handlerFailed: (error: unknown) => boolean,
  max: number = MAX_ROWS_PER_TRANSACTION,
): TransactionSize => {
  let size = max
  return {
    current: () => size,
    settle: (results) => {
      let failed = 0
      let committed = true
      for (const result of results) {
        if (result.ok) continue
        committed = false
        if (handlerFailed(result.error)) failed++
      }
      if (failed > 0) size = Math.max(1, Math.floor(size / 2 ** failed))
      else if (committed) size = Math.min(max, size + 1)
    },
  }
}
