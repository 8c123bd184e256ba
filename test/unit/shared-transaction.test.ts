// What one failing message does to the others of its shared transaction (pure logic: `together`
// here is a stand-in that fails as a transaction would, recording every batch it was given).
import { describe, expect, test } from "bun:test"
import { Effect } from "effect"
import { FailedAt, runShared } from "../../src/core/sharedTransaction.ts"

type Failure = { readonly outage: boolean; readonly why: string }

const harness = (fails: (item: string) => Failure | undefined, whole?: Failure) => {
  const batches: string[][] = []
  const together = (items: ReadonlyArray<string>): Effect.Effect<string[], FailedAt<Failure> | Failure> =>
    Effect.suspend((): Effect.Effect<string[], FailedAt<Failure> | Failure> => {
      batches.push([...items])
      if (whole && items.length > 1) return Effect.fail(whole)
      for (const [i, item] of items.entries()) {
        const failure = fails(item)
        if (failure) return Effect.fail(new FailedAt(i, failure))
      }
      return Effect.succeed(items.map((item) => item.toUpperCase()))
    })
  const run = (items: ReadonlyArray<string>) =>
    Effect.runPromise(runShared(items, together, (f: Failure) => f.outage))
  return { batches, run }
}

const handlerError = { outage: false, why: "handler" }
const sorted = (batches: ReadonlyArray<ReadonlyArray<string>>) => batches.map((b) => b.join(",")).sort()

describe("runShared", () => {
  test("all succeed: one transaction, an answer per item in order", async () => {
    const h = harness(() => undefined)
    expect(await h.run(["a", "b", "c"])).toEqual([
      { ok: true, value: "A" },
      { ok: true, value: "B" },
      { ok: true, value: "C" },
    ])
    expect(h.batches).toEqual([["a", "b", "c"]])
  })

  test("one failing handler: its failure is its attempt (it never runs again alone), those before it commit together, those after it are a new batch", async () => {
    const h = harness((item) => (item === "c" ? handlerError : undefined))
    expect(await h.run(["a", "b", "c", "d", "e"])).toEqual([
      { ok: true, value: "A" },
      { ok: true, value: "B" },
      { ok: false, error: handlerError },
      { ok: true, value: "D" },
      { ok: true, value: "E" },
    ])
    expect(sorted(h.batches)).toEqual(["a,b", "a,b,c,d,e", "d,e"])
  })

  test("several failing handlers: each fails once, every other item commits, no item runs alone needlessly", async () => {
    const h = harness((item) => (item === "b" || item === "d" ? handlerError : undefined))
    expect((await h.run(["a", "b", "c", "d", "e", "f"])).map((r) => r.ok)).toEqual([
      true,
      false,
      true,
      false,
      true,
      true,
    ])
    expect(sorted(h.batches)).toEqual(["a", "a,b,c,d,e,f", "c", "c,d,e,f", "e,f"])
  })

  test("one of those that ran well failing when they run again together: it fails there, the others go on", async () => {
    let calls = 0
    // "a" succeeds in the first batch only (a flaky handler), so the batch of "a" alone fails.
    const h = harness((item) => (item === "b" || (item === "a" && calls++ > 0) ? handlerError : undefined))
    expect((await h.run(["a", "x", "b"])).map((r) => r.ok)).toEqual([false, true, false])
    expect(sorted(h.batches)).toEqual(["a,x", "a,x,b", "x"])
  })

  test("our database away: every item gets the outage, nothing runs again", async () => {
    const outage = { outage: true, why: "database away" }
    const h = harness(() => undefined, outage)
    expect(await h.run(["a", "b"])).toEqual([
      { ok: false, error: outage },
      { ok: false, error: outage },
    ])
    expect(h.batches).toEqual([["a", "b"]])
  })

  test("a failure of nobody in particular (a commit refused): each runs alone", async () => {
    const h = harness(() => undefined, { outage: false, why: "commit refused" })
    expect((await h.run(["a", "b"])).map((r) => r.ok)).toEqual([true, true])
    expect(h.batches).toEqual([["a", "b"], ["a"], ["b"]])
  })

  test("a single item's failure is its own", async () => {
    const h = harness(() => handlerError)
    expect(await h.run(["a"])).toEqual([{ ok: false, error: handlerError }])
    expect(h.batches).toEqual([["a"]])
  })
})

describe("runShared with chains (an ordered key's rows, named key + number: a1, a2, …)", () => {
  const HELD = { outage: false, why: "held back" }
  const chained = (fails: (item: string, tries: number) => boolean, whole?: Failure) => {
    const batches: string[][] = []
    const tries = new Map<string, number>()
    const together = (items: ReadonlyArray<string>): Effect.Effect<string[], FailedAt<Failure> | Failure> =>
      Effect.suspend((): Effect.Effect<string[], FailedAt<Failure> | Failure> => {
        batches.push([...items])
        if (whole && items.length > 1) return Effect.fail(whole)
        for (const [i, item] of items.entries()) {
          const n = (tries.get(item) ?? 0) + 1
          tries.set(item, n)
          if (fails(item, n)) return Effect.fail(new FailedAt(i, handlerError))
        }
        return Effect.succeed(items.map((item) => item.toUpperCase()))
      })
    const run = (items: ReadonlyArray<string>) =>
      Effect.runPromise(
        runShared(items, together, (f: Failure) => f.outage, {
          same: (a, b) => a[0] === b[0],
          heldBack: HELD,
        }),
      )
    return { batches, run }
  }
  const outcome = (results: ReadonlyArray<{ ok: boolean; error?: Failure }>) =>
    results.map((r) => (r.ok ? "ok" : r.error === HELD ? "held" : "failed"))

  test("after a failing row its key's later rows are held back, not run; other keys go on", async () => {
    const h = chained((item) => item === "a2")
    expect(outcome(await h.run(["a1", "a2", "b1", "a3", "b2"]))).toEqual(["ok", "failed", "ok", "held", "ok"])
    // Run in order, one part after another: never a3 (nor b1 with a3).
    expect(h.batches).toEqual([["a1", "a2", "b1", "a3", "b2"], ["a1"], ["b1", "b2"]])
  })

  test("a failing row's failure is its attempt even when its key's earlier row fails on the run again; later rows are held back", async () => {
    // a2 fails the shared run; a1, fine the first time, fails when run again: a2 does not run again.
    const h = chained((item, n) => (item === "a2" && n === 1) || (item === "a1" && n === 2))
    expect(outcome(await h.run(["a1", "a2", "a3"]))).toEqual(["failed", "failed", "held"])
    expect(h.batches).toEqual([["a1", "a2", "a3"], ["a1"]])
  })

  test("each alone after a failure nobody in particular caused: in order, a key stops at its first failure", async () => {
    const h = chained((item) => item === "a1", { outage: false, why: "commit refused" })
    expect(outcome(await h.run(["a1", "b1", "a2"]))).toEqual(["failed", "ok", "held"])
    expect(h.batches).toEqual([["a1", "b1", "a2"], ["a1"], ["b1"]])
  })
})
