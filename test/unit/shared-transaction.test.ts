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

  test("one failing handler: those before it commit together, it runs alone and fails, those after it are a new batch", async () => {
    const h = harness((item) => (item === "c" ? handlerError : undefined))
    expect(await h.run(["a", "b", "c", "d", "e"])).toEqual([
      { ok: true, value: "A" },
      { ok: true, value: "B" },
      { ok: false, error: handlerError },
      { ok: true, value: "D" },
      { ok: true, value: "E" },
    ])
    expect(sorted(h.batches)).toEqual(["a,b", "a,b,c,d,e", "c", "d,e"])
  })

  test("several failing handlers: each fails alone, every other item commits, no item runs alone needlessly", async () => {
    const h = harness((item) => (item === "b" || item === "d" ? handlerError : undefined))
    expect((await h.run(["a", "b", "c", "d", "e", "f"])).map((r) => r.ok)).toEqual([
      true,
      false,
      true,
      false,
      true,
      true,
    ])
    expect(sorted(h.batches)).toEqual(["a", "a,b,c,d,e,f", "b", "c", "c,d,e,f", "d", "e,f"])
  })

  test("those that ran well failing again together: each alone", async () => {
    let calls = 0
    // "a" succeeds in the first batch only (a flaky handler), so the batch of "a" alone fails.
    const h = harness((item) => (item === "b" || (item === "a" && calls++ > 0) ? handlerError : undefined))
    expect((await h.run(["a", "x", "b"])).map((r) => r.ok)).toEqual([false, true, false])
    expect(sorted(h.batches)).toEqual(["a", "a,x", "a,x,b", "b", "x"])
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
