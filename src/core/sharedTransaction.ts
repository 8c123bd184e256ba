/**
 * Several messages handled in one transaction, and what happens when one of
 * them fails it. The transaction commits or rolls back as a whole, so the
 * others must not pay for the failing one beyond their batch:
 *
 * - a handler failed it: the messages before it (whose handlers just ran
 *   well) commit together, it runs alone (its failure is then its own, or
 *   not), and those after it (not run yet) are a new shared batch;
 * - a batch of those that ran well fails again, or nobody in particular
 *   failed it (a value the database refuses, a commit refused): each runs
 *   alone;
 * - our database is away: every message gets the outage as it is.
 *
 * A handler of a rolled-back batch runs again: its writes through the
 * transaction commit once, what it does outside the database may repeat (as
 * after a crash before the commit).
 */
import { Effect } from "effect"
import type { ItemResult } from "./batcher.ts"

/** The shared transaction failed because of the item at `index`: its handler's failure. */
export class FailedAt<E> {
  readonly _tag = "FailedAt"
  readonly index: number
  readonly error: E
  constructor(index: number, error: E) {
    this.index = index
    this.error = error
  }
}

export const runShared = <I, O, E>(
  items: ReadonlyArray<I>,
  together: (items: ReadonlyArray<I>) => Effect.Effect<ReadonlyArray<O>, FailedAt<E> | E>,
  isOutage: (error: E) => boolean,
): Effect.Effect<ReadonlyArray<ItemResult<O, E>>> => {
  type Result = ItemResult<O, E>
  const run = (items: ReadonlyArray<I>, shareAgain: boolean): Effect.Effect<ReadonlyArray<Result>> =>
    together(items).pipe(
      Effect.map((outputs) => outputs.map((value): Result => ({ ok: true, value }))),
      Effect.catch((failure): Effect.Effect<ReadonlyArray<Result>> => {
        const error = failure instanceof FailedAt ? (failure.error as E) : (failure as E)
        if (items.length === 1 || (!(failure instanceof FailedAt) && isOutage(error)))
          return Effect.succeed(items.map((): Result => ({ ok: false, error })))
        if (!(failure instanceof FailedAt) || !shareAgain)
          return Effect.forEach(items, (item) => run([item], false), { concurrency: "unbounded" }).pipe(
            Effect.map((results) => results.flat()),
          )
        const at = failure.index
        const parts = [items.slice(0, at), items.slice(at, at + 1), items.slice(at + 1)] as const
        return Effect.all(
          [
            parts[0].length === 0 ? Effect.succeed([]) : run(parts[0], false),
            run(parts[1], false),
            parts[2].length === 0 ? Effect.succeed([]) : run(parts[2], true),
          ],
          { concurrency: "unbounded" },
        ).pipe(Effect.map((results) => results.flat()))
      }),
    )
  return run(items, true)
}
