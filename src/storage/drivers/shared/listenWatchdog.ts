/**
 * Keeps a LISTEN alive whose driver cannot say that it died.
 *
 * postgres.js 3.4.9 re-issues LISTEN when its listener connection closes, but
 * if that one attempt fails (the server is still down) it drops the listener
 * silently and never tries again. So txbox checks from the outside: every
 * `every`, it sends a ping on the channel through the pool; if the ping went
 * out and no notification came back within `within`, the listener is gone
 * and is subscribed again. The same check catches a half-open socket.
 */
import { Effect, type Scope } from "effect"
import type { StoreError } from "../../../Errors.ts"
import { deafWarning, hearsAgain } from "./listenSelfTest.ts"

/** The payload of a liveness ping: never a wake-up. Kept short; NOTIFY payloads share a queue. */
export const PING_PAYLOAD = "txbox:ping"

export interface Subscription {
  readonly unlisten: () => Promise<void>
}

export interface WatchdogOptions {
  /** Subscribes once; `onPayload` gets every notification's payload. */
  readonly subscribe: (onPayload: (payload: string) => void) => Effect.Effect<Subscription, StoreError>
  /** Sends the ping; a failure means the database is away, which proves nothing about the listener. */
  readonly ping: Effect.Effect<void, StoreError>
  readonly onNotify: () => void
  /** Told when a LISTEN is found deaf (false) and when it hears again (true). */
  readonly onHearing?: ((hears: boolean) => void) | undefined
  /** Retries a subscription lost after the first one was up. */
  readonly resubscribe: <A>(effect: Effect.Effect<A, StoreError>) => Effect.Effect<A>
  readonly every: number
  readonly within: number
  /** The channel, for the log: a LISTEN that stays deaf after it was subscribed again is said once. */
  readonly channel: string
}

/** Subscribes (failing as `subscribe` fails), then watches the subscription until the scope closes. */
export const watchedListen = (options: WatchdogOptions): Effect.Effect<void, StoreError, Scope.Scope> =>
  Effect.gen(function* () {
    // Any notification heard proves the listener alive, ours or another process's.
    let heard = 0
    const onPayload = (payload: string) => {
      heard++
      if (payload !== PING_PAYLOAD) options.onNotify()
    }
    let current = yield* options.subscribe(onPayload)
    yield* Effect.addFinalizer(() => Effect.promise(() => current.unlisten().catch(() => undefined)))

    // Pings unheard in a row: one is a listener that died (subscribe again, quietly); a second right
    // after subscribing again is a LISTEN that cannot hear (a transaction pooler): said once.
    let misses = 0
    let warned = false
    const check = Effect.gen(function* () {
      const before = heard
      const sent = yield* options.ping.pipe(
        Effect.timeout(options.within),
        Effect.as(true),
        Effect.catch(() => Effect.succeed(false)),
      )
      if (!sent) return
      yield* Effect.sleep(options.within)
      if (heard !== before) {
        misses = 0
        if (warned) {
          warned = false
          options.onHearing?.(true)
          yield* Effect.logInfo(hearsAgain(options.channel))
        }
        return
      }
      if (++misses >= 2 && !warned) {
        warned = true
        options.onHearing?.(false)
        yield* Effect.logWarning(deafWarning(options.channel, options.within))
      }
      yield* Effect.promise(() => current.unlisten().catch(() => undefined))
      current = yield* options.resubscribe(options.subscribe(onPayload))
      // A wake-up may have been missed while the listener was gone: let the loop look once.
      options.onNotify()
    })
    yield* Effect.forkScoped(Effect.forever(Effect.andThen(Effect.sleep(options.every), check)))
  })
