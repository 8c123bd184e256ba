// The LISTEN watchdog over a fake server, on a TestClock: the logic only. The real listener
// connection is exercised in test/integration/store-faults.test.ts.
import { describe, expect, test } from "bun:test"
import { Effect, Exit, Logger, Scope } from "effect"
import { TestClock } from "effect/testing"
import { StoreError } from "../../src/Errors.ts"
import { PING_PAYLOAD, watchedListen } from "../../src/storage/drivers/shared/listenWatchdog.ts"

const run = <A, E>(body: Effect.Effect<A, E, Scope.Scope>) =>
  Effect.runPromise(body.pipe(Effect.scoped, Effect.provide(TestClock.layer())))

/** A NOTIFY server whose subscriptions can die without a word, as postgres.js lets them. */
const fakeServer = () => {
  const live = new Set<(payload: string) => void>()
  // deaf: subscriptions succeed but hear nothing (LISTEN through a transaction pooler).
  const state = { up: true, deaf: false, subscribed: 0, unlistened: 0, wakes: 0 }
  const send = (payload: string) => {
    for (const deliver of live) deliver(payload)
  }
  const options = {
    subscribe: (onPayload: (payload: string) => void) =>
      Effect.sync(() => {
        state.subscribed++
        if (!state.deaf) live.add(onPayload)
        return {
          unlisten: async () => {
            state.unlistened++
            live.delete(onPayload)
          },
        }
      }),
    ping: Effect.suspend(() =>
      state.up
        ? Effect.sync(() => send(PING_PAYLOAD))
        : Effect.fail(new StoreError({ operation: "listen", reason: "connection", cause: "down" })),
    ),
    onNotify: () => {
      state.wakes++
    },
    resubscribe: <A>(effect: Effect.Effect<A, StoreError>) => Effect.orDie(effect),
    every: 5_000,
    within: 5_000,
    channel: "txbox.outbox",
  }
  return { state, options, send, dropSilently: () => live.clear() }
}

describe("LISTEN watchdog", () => {
  test("a live listener is kept, and pings never wake the loop", () =>
    run(
      Effect.gen(function* () {
        const server = fakeServer()
        yield* watchedListen(server.options)
        yield* TestClock.adjust("1 minute")
        expect(server.state.subscribed).toBe(1)
        expect(server.state.wakes).toBe(0)
        server.send("")
        expect(server.state.wakes).toBe(1)
      }),
    ))

  test("a listener dropped without a word is replaced within two periods, and the loop looks once", () =>
    run(
      Effect.gen(function* () {
        const server = fakeServer()
        yield* watchedListen(server.options)
        server.dropSilently()
        server.send("")
        expect(server.state.wakes).toBe(0)
        yield* TestClock.adjust("10 seconds")
        expect(server.state.subscribed).toBe(2)
        expect(server.state.wakes).toBe(1)
        server.send("")
        expect(server.state.wakes).toBe(2)
        // And it stays: no churn once the new one answers.
        yield* TestClock.adjust("1 minute")
        expect(server.state.subscribed).toBe(2)
      }),
    ))

  test("while the database is away nothing is judged; once it is back a lost listener is replaced", () =>
    run(
      Effect.gen(function* () {
        const server = fakeServer()
        yield* watchedListen(server.options)
        server.state.up = false
        server.dropSilently()
        yield* TestClock.adjust("1 minute")
        expect(server.state.subscribed).toBe(1)
        server.state.up = true
        yield* TestClock.adjust("10 seconds")
        expect(server.state.subscribed).toBe(2)
      }),
    ))

  test("a listener that hears nothing after it was subscribed again is said deaf once, and said to hear again when it does", () => {
    const logged: string[] = []
    return run(
      Effect.gen(function* () {
        const server = fakeServer()
        server.state.deaf = true
        yield* watchedListen(server.options)
        yield* TestClock.adjust("10 seconds")
        // One unheard ping: a listener that died, subscribed again without a word.
        expect(server.state.subscribed).toBe(2)
        expect(logged).toEqual([])
        for (let i = 0; i < 6; i++) yield* TestClock.adjust("10 seconds")
        expect(server.state.subscribed).toBeGreaterThan(3)
        const deaf = logged.filter((line) => line.includes("heard no NOTIFY"))
        expect(deaf).toHaveLength(1)
        expect(deaf[0]).toContain('"txbox.outbox"')
        expect(deaf[0]).toContain("listenUrl")
        // Heard again: the listener subscribed while deaf is replaced by one that hears.
        server.state.deaf = false
        for (let i = 0; i < 3; i++) yield* TestClock.adjust("10 seconds")
        expect(logged.filter((line) => line.includes("hears NOTIFY again"))).toHaveLength(1)
        expect(logged.filter((line) => line.includes("heard no NOTIFY"))).toHaveLength(1)
      }).pipe(Effect.provide(Logger.layer([Logger.make(({ message }) => logged.push(String(message)))]))),
    )
  })

  test("closing the scope unlistens and stops the checks", () =>
    Effect.runPromise(
      Effect.gen(function* () {
        const server = fakeServer()
        const scope = yield* Scope.make()
        yield* watchedListen(server.options).pipe(Scope.provide(scope))
        yield* Scope.close(scope, Exit.void)
        expect(server.state.unlistened).toBe(1)
        server.dropSilently()
        yield* TestClock.adjust("1 minute")
        expect(server.state.subscribed).toBe(1)
      }).pipe(Effect.provide(TestClock.layer())),
    ))
})
