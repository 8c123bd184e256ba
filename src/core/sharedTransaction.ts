/**
 * Several messages handled in one transaction, and what happens when one of
 * them fails it. The transaction commits or rolls back as a whole, so the
 * others must not pay for the failing one beyond their batch:
 *
 * - a handler failed it: its failure is its attempt (it does not run again
 *   alone: a failing handler runs once per attempt, so at most `maxAttempts`
 *   times), the messages before it (whose handlers just ran well) share a new
 *   transaction, and so do those after it (not run yet); either may split
 *   again the same way;
 * - nobody in particular failed it (a value the database refuses, a commit
 *   refused): each runs alone;
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

/**
 * Items that must run in their given order, each only after the ones before it
 * of its chain succeeded (an ordered key's rows): the parts of a failed batch
 * run one after another, and an item whose chain failed before it is not run
 * (its result is `heldBack`).
 */
export interface Chains<I, E> {
  readonly same: (a: I, b: I) => boolean
  readonly heldBack: E
}

export const runShared = <I, O, E>(
  items: ReadonlyArray<I>,
  together: (items: ReadonlyArray<I>) => Effect.Effect<ReadonlyArray<O>, FailedAt<E> | E>,
  isOutage: (error: E) => boolean,
  chains?: Chains<I, E>,
): Effect.Effect<ReadonlyArray<ItemResult<O, E>>> => {
  type Result = ItemResult<O, E>
  const heldBack: Result | undefined = chains && { ok: false, error: chains.heldBack }
  /** Each item alone; with chains, in order, and none after its chain failed. */
  const alone = (items: ReadonlyArray<I>): Effect.Effect<ReadonlyArray<Result>> => {
    if (chains === undefined)
      return Effect.forEach(items, (item) => run([item]), { concurrency: "unbounded" }).pipe(
        Effect.map((results) => results.flat()),
      )
    const failed: I[] = []
    return Effect.forEach(items, (item) =>
      failed.some((f) => chains.same(f, item))
        ? Effect.succeed(heldBack!)
        : Effect.map(run([item]), ([result]) => {
            if (!result!.ok) failed.push(item)
            return result!
          }),
    )
  }
  const run = (items: ReadonlyArray<I>): Effect.Effect<ReadonlyArray<Result>> =>
    together(items).pipe(
      Effect.map((outputs) => outputs.map((value): Result => ({ ok: true, value }))),
      Effect.catch((failure): Effect.Effect<ReadonlyArray<Result>> => {
        const error = failure instanceof FailedAt ? (failure.error as E) : (failure as E)
        if (items.length === 1 || (!(failure instanceof FailedAt) && isOutage(error)))
          return Effect.succeed(items.map((): Result => ({ ok: false, error })))
        if (!(failure instanceof FailedAt)) return alone(items)
        const at = failure.index
        const failing = items[at]!
        const own: Result = { ok: false, error }
        if (chains === undefined)
          return Effect.all(
            [
              at === 0 ? Effect.succeed([]) : run(items.slice(0, at)),
              Effect.succeed([own]),
              at + 1 === items.length ? Effect.succeed([]) : run(items.slice(at + 1)),
            ],
            { concurrency: "unbounded" },
          ).pipe(Effect.map((results) => results.flat()))
        // In order. After the failing item its chain's items wait for it (handed back), and so do
        // those of any chain that failed before it (the items before it ran again, and one may
        // fail this time); the others share a batch again.
        return Effect.gen(function* () {
          const before = at === 0 ? [] : yield* run(items.slice(0, at))
          const failed = [failing, ...items.slice(0, at).filter((_, i) => !before[i]!.ok)]
          const after = items.slice(at + 1)
          const holds = after.map((item) => failed.some((f) => chains.same(f, item)))
          const rest = after.filter((_, i) => !holds[i])
          const others = rest.length === 0 ? [] : yield* run(rest)
          let next = 0
          return [...before, own, ...holds.map((held) => (held ? heldBack! : others[next++]!))]
        })
      }),
    )
  return run(items)
}
