/**
 * Collects concurrent submissions into one call. The items submitted in the
 * same tick share a flush (the store-then-process INSERT; the events of one
 * batch message in one inbox transaction), up to `maxSize` items each. With
 * `concurrency`, at most that many flushes run at once, and everything
 * submitted while they are all busy waits for the next: under light load
 * each item is flushed alone at once, under load the batches grow by
 * themselves. The flush answers per item, so one item the database refuses
 * does not fail the others.
 */
import { Effect, Exit } from "effect"

export type ItemResult<O, E> =
  | { readonly ok: true; readonly value: O }
  | { readonly ok: false; readonly error: E }

export interface Batcher<I, O, E> {
  readonly submit: (item: I) => Effect.Effect<O, E>
  /**
   * Several items at once, sure to share flushes (up to `maxSize` each): what each came to, in
   * order. No fiber per item: the items of one batch message, handled together.
   */
  readonly submitAll: (items: ReadonlyArray<I>) => Effect.Effect<ReadonlyArray<Exit.Exit<O, E>>>
}

export interface BatcherOptions {
  /** Flushes running at once. @default Infinity */
  readonly concurrency?: number
  /** Items in one flush at most; a function is asked before each flush. @default Infinity */
  readonly maxSize?: number | (() => number)
  /**
   * What waits is spread over the free flushes, this many items or more to each: a flush whose
   * items take a while each (handlers, one after another) ends sooner in parts, while a part
   * this size still spreads the flush's own cost. @default Infinity (all together)
   */
  readonly minShare?: number
}

interface Waiting<I, O, E> {
  readonly item: I
  // biome-ignore lint/suspicious/noExplicitAny: the submitter's context, whatever it holds
  readonly context: any
  readonly resume: (result: Exit.Exit<O, E>) => void
}

export const makeBatcher = <I, O, E>(
  flush: (items: ReadonlyArray<I>) => Effect.Effect<ReadonlyArray<ItemResult<O, E>>, E>,
  options: BatcherOptions = {},
): Batcher<I, O, E> => {
  const concurrency = options.concurrency ?? Number.POSITIVE_INFINITY
  const maxSizeOption = options.maxSize ?? Number.POSITIVE_INFINITY
  const maxSize = typeof maxSizeOption === "number" ? () => maxSizeOption : maxSizeOption
  const minShare = Math.max(1, options.minShare ?? Number.POSITIVE_INFINITY)
  let queue: Array<Waiting<I, O, E>> = []
  let running = 0
  let scheduled = false

  const start = (batch: ReadonlyArray<Waiting<I, O, E>>) => {
    running++
    const items = batch.map((w) => w.item)
    // The flush runs in the context of the batch's first submission (its Clock, its tracer),
    // not in a bare runtime. `exit` never rejects: a defect reaches every item as it is.
    void Effect.runPromiseWith(batch[0]?.context)(Effect.exit(flush(items))).then((exit) => {
      running--
      batch.forEach((w, i) => {
        const r = exit._tag === "Success" ? exit.value[i] : undefined
        w.resume(
          exit._tag === "Failure"
            ? Exit.failCause(exit.cause)
            : r === undefined
              ? Exit.die(new Error("batcher: no result for an item"))
              : r.ok
                ? Exit.succeed(r.value)
                : Exit.fail(r.error),
        )
      })
      pump()
    })
  }

  // Deferred to a microtask, so that submissions of the same tick share a batch.
  const pump = () => {
    if (scheduled) return
    scheduled = true
    queueMicrotask(() => {
      scheduled = false
      while (running < concurrency && queue.length > 0) {
        // What waits goes together, spread over the free flushes only in shares of minShare or
        // more: a flush's cost is mostly per flush (a transaction's BEGIN and COMMIT are round
        // trips), not per item.
        const parts = Math.max(1, Math.min(concurrency - running, Math.floor(queue.length / minShare)))
        const size = Math.max(1, Math.min(maxSize(), Math.ceil(queue.length / parts)))
        start(queue.slice(0, size))
        queue = queue.slice(size)
      }
    })
  }

  const submit = (item: I): Effect.Effect<O, E> =>
    Effect.flatMap(Effect.context<never>(), (context) =>
      Effect.callback<O, E>((resume) => {
        const waiting: Waiting<I, O, E> = { item, context, resume }
        queue.push(waiting)
        pump()
        // Interrupted before its batch started: it never runs. Once started, the batch runs to
        // its end (a transaction shared with others) and the answer goes nowhere.
        return Effect.sync(() => {
          queue = queue.filter((w) => w !== waiting)
        })
      }),
    )
  const submitAll = (items: ReadonlyArray<I>): Effect.Effect<ReadonlyArray<Exit.Exit<O, E>>> =>
    Effect.flatMap(Effect.context<never>(), (context) =>
      Effect.callback<ReadonlyArray<Exit.Exit<O, E>>>((resume) => {
        const exits = new Array<Exit.Exit<O, E>>(items.length)
        let left = items.length
        if (left === 0) return resume(Effect.succeed(exits))
        const waiting = items.map(
          (item, i): Waiting<I, O, E> => ({
            item,
            context,
            resume: (exit) => {
              exits[i] = exit
              if (--left === 0) resume(Effect.succeed(exits))
            },
          }),
        )
        queue.push(...waiting)
        pump()
        // As for submit: what has not started never runs; what started runs to its end.
        return Effect.sync(() => {
          const mine = new Set(waiting)
          queue = queue.filter((w) => !mine.has(w))
        })
      }),
    )
  return { submit, submitAll }
}
