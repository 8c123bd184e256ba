/**
 * Collects concurrent submissions into one call: the first submission opens
 * a batch, everything submitted before the current flush finishes joins the
 * next one. With `prefetch` deliveries in flight, that is one INSERT for many.
 * The flush answers per item, so one item the database refuses does not fail
 * the others.
 */
import { Effect } from "effect"

export type ItemResult<O, E> =
  | { readonly ok: true; readonly value: O }
  | { readonly ok: false; readonly error: E }

export interface Batcher<I, O, E> {
  readonly submit: (item: I) => Effect.Effect<O, E>
}

export const makeBatcher = <I, O, E>(
  flush: (items: ReadonlyArray<I>) => Effect.Effect<ReadonlyArray<ItemResult<O, E>>, E>,
): Batcher<I, O, E> => {
  let batch: { items: I[]; done: Promise<ReadonlyArray<ItemResult<O, E>>> } | undefined
  const submit = (item: I): Effect.Effect<O, E> =>
    Effect.flatMap(Effect.context<never>(), (context) => {
      if (!batch) {
        const items: I[] = []
        // The flush runs in the context of the submission that opened the batch (its Clock, its
        // tracer), not in a bare runtime.
        const done = Promise.resolve().then(async () => {
          batch = undefined
          const exit = await Effect.runPromiseWith(context)(Effect.result(flush(items)))
          return exit._tag === "Success"
            ? exit.success
            : items.map((): ItemResult<O, E> => ({ ok: false, error: exit.failure }))
        })
        batch = { items, done }
      }
      const index = batch.items.push(item) - 1
      const { done } = batch
      return Effect.flatMap(
        Effect.promise(() => done),
        (results) => {
          const r = results[index]
          return r === undefined
            ? Effect.die(new Error("batcher: no result for an item"))
            : r.ok
              ? Effect.succeed(r.value)
              : Effect.fail(r.error)
        },
      )
    })
  return { submit }
}
