/**
 * One LISTEN connection per node-postgres store, shared by every channel it listens on (the
 * relay's, each consumer's): a process holds one direct connection for its wake-ups however many
 * loops it runs, which matters most where direct connections are scarce (behind PgBouncer, a
 * `listenUrl` straight to PostgreSQL).
 *
 * One fiber keeps the connection: connect, LISTEN every channel, wait for the connection to end,
 * connect again. (Reconnecting from the client's own `end` event chained a new client per failed
 * attempt, each of which could later connect and stay open.) After a reconnect every channel's
 * loops look once, since a NOTIFY sent while no LISTEN was up is lost, and each channel's
 * self-test runs again (`../shared/listenSelfTest.ts`).
 */
import { Effect, type Scope, Semaphore } from "effect"
import type pg from "pg"
import type { StoreError } from "../../../Errors.ts"
import { classifyDbError } from "../../sql/errors.ts"
import { isOwnPayload, type ListenSelfTest, listenSelfTest } from "../shared/listenSelfTest.ts"
import { relisten, relistenForever } from "../shared/postgresConnection.ts"

/** The listener's settings: where it connects, and how a self-test NOTIFY goes (through the pool). */
export interface ListenerOptions {
  readonly driver: typeof pg
  readonly url: string
  readonly timeoutSeconds: number
  readonly notify: (channel: string, payload: string) => Effect.Effect<unknown, StoreError>
}

interface Channel {
  readonly wakes: Set<() => void>
  readonly selfTest: ListenSelfTest
}

const quoted = (channel: string) => `"${channel.replaceAll('"', '""')}"`

/** Makes the store's `listen`; the connection opens with the first channel and closes with the scope. */
export const makeListener = (
  options: ListenerOptions,
): Effect.Effect<
  (
    channel: string,
    onNotify: () => void,
    onHearing?: (hears: boolean) => void,
  ) => Effect.Effect<void, StoreError, Scope.Scope>,
  never,
  Scope.Scope
> =>
  Effect.gen(function* () {
    const storeScope = yield* Effect.scope
    const channels = new Map<string, Channel>()
    const lock = yield* Semaphore.make(1)
    let current: pg.Client | undefined
    let started = false

    const connect = Effect.tryPromise({
      try: async (signal) => {
        const client = new options.driver.Client({
          connectionString: options.url,
          connectionTimeoutMillis: options.timeoutSeconds * 1000,
          application_name: "txbox/pg-listen",
        })
        client.on("error", () => {})
        client.on("notification", (message) => {
          const channel = channels.get(message.channel)
          if (channel === undefined) return
          if (isOwnPayload(message.payload)) channel.selfTest.heard(message.payload ?? "")
          else for (const wake of channel.wakes) wake()
        })
        try {
          await client.connect()
          for (const channel of channels.keys()) await client.query(`LISTEN ${quoted(channel)}`)
        } catch (error) {
          await client.end().catch(() => undefined)
          throw error
        }
        // Given up on while connecting (scope closed): never leave it open.
        if (signal.aborted) {
          await client.end().catch(() => undefined)
          throw new Error("listen: abandoned")
        }
        current = client
        return client
      },
      catch: (cause) => classifyDbError("listen", cause),
    })
    const ended = (client: pg.Client) =>
      Effect.callback<void>((resume) => {
        const done = () => resume(Effect.void)
        client.once("end", done)
        return Effect.sync(() => {
          client.off("end", done)
        })
      })
    const checkAll = Effect.suspend(() =>
      Effect.forEach([...channels.values()], (channel) => channel.selfTest.check, {
        concurrency: "unbounded",
        discard: true,
      }),
    )
    const serve = (first: pg.Client): Effect.Effect<never> =>
      Effect.gen(function* () {
        let client = first
        while (true) {
          yield* ended(client)
          current = undefined
          client = yield* connect.pipe(Effect.retry({ schedule: relistenForever }), Effect.orDie)
          // A NOTIFY sent while no LISTEN was up is lost: look once now that one is (before
          // the LISTEN, a NOTIFY could still slip between the look and the LISTEN).
          for (const channel of channels.values()) for (const wake of channel.wakes) wake()
          yield* Effect.forkChild(checkAll)
        }
      })
    yield* Effect.addFinalizer(() =>
      Effect.promise(async () => {
        await current?.end().catch(() => undefined)
      }),
    )

    return (channel: string, onNotify: () => void, onHearing?: (hears: boolean) => void) =>
      Effect.gen(function* () {
        let entry = channels.get(channel)
        const fresh = entry === undefined
        if (entry === undefined) {
          entry = {
            wakes: new Set(),
            selfTest: yield* listenSelfTest(channel, (payload) => options.notify(channel, payload)),
          }
          channels.set(channel, entry)
        }
        const wakes = entry.wakes
        wakes.add(onNotify)
        yield* Effect.addFinalizer(() => Effect.sync(() => wakes.delete(onNotify)))
        if (onHearing !== undefined) {
          const unwatch = entry.selfTest.watch(onHearing)
          yield* Effect.addFinalizer(() => Effect.sync(unwatch))
        }
        if (!fresh) return
        yield* lock.withPermits(1)(
          Effect.gen(function* () {
            if (!started) {
              // LISTENs every channel registered so far, this one included.
              const first = yield* connect.pipe(Effect.retry({ schedule: relisten, times: 5 }))
              started = true
              yield* Effect.forkIn(serve(first), storeScope)
            } else if (current !== undefined) {
              const client = current
              // Failing here means the connection is going: its reconnect LISTENs this channel too.
              yield* Effect.ignore(Effect.tryPromise(() => client.query(`LISTEN ${quoted(channel)}`)))
            }
          }),
        )
        yield* Effect.forkIn(entry.selfTest.check, storeScope)
      })
  })
