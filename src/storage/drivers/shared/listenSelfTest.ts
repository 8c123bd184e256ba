/**
 * Does the LISTEN connection hear a NOTIFY sent the way producers send theirs? Through a
 * transaction pooler (PgBouncer in `pool_mode = transaction`) it may not: the server connection
 * that ran LISTEN goes back to the pool, and a NOTIFY reaches whichever client holds it then, or
 * nobody. Wake-ups then fall back to the poll interval by chance, and nothing else would say so.
 *
 * So after each LISTEN the store sends itself a NOTIFY through the pool and waits for it. Silence
 * is said once in the log (not on every reconnect) and the loops keep polling; an answer after a
 * silence is said too. A database that is away proves nothing and says nothing.
 */
import { Deferred, Effect, Exit, Option } from "effect"
import type { StoreError } from "../../../Errors.ts"

/** Every payload txbox sends itself starts with this: never a wake-up. */
const OWN_PREFIX = "txbox:"
const SELF_TEST_PREFIX = `${OWN_PREFIX}selftest:`
/** How long a self-test waits for its NOTIFY: a NOTIFY arrives within milliseconds when LISTEN works. */
export const SELF_TEST_WITHIN_MS = 2_000

/** A payload txbox sent itself (a liveness ping, a self-test), which wakes no loop. */
export const isOwnPayload = (payload: string | undefined): boolean => payload?.startsWith(OWN_PREFIX) === true

/** What is said, once, when a LISTEN is found to hear no NOTIFY. */
export const deafWarning = (channel: string, withinMs: number): string =>
  `txbox: LISTEN on ${JSON.stringify(channel)} heard no NOTIFY within ${withinMs} ms ` +
  "(a transaction pooler such as PgBouncer between txbox and PostgreSQL?): wake-ups fall back " +
  "to the poll interval; give the store a listenUrl that connects directly"

/** What is said when a LISTEN found deaf hears again. */
export const hearsAgain = (channel: string): string =>
  `txbox: LISTEN on ${JSON.stringify(channel)} hears NOTIFY again`

/** The self-test of one LISTEN channel. */
export interface ListenSelfTest {
  /** Give it every own payload the LISTEN connection hears. */
  readonly heard: (payload: string) => void
  /** One test: NOTIFY through `notify`, wait up to `SELF_TEST_WITHIN_MS`, log a change of verdict. Never fails. */
  readonly check: Effect.Effect<void>
  /** Tells `onHearing` each verdict from now on (and the last one, if a test already gave it); returns its removal. */
  readonly watch: (onHearing: (hears: boolean) => void) => () => void
}

export const listenSelfTest = (
  channel: string,
  notify: (payload: string) => Effect.Effect<unknown, StoreError>,
): Effect.Effect<ListenSelfTest> =>
  Effect.sync(() => {
    const waiting = new Map<string, Deferred.Deferred<void>>()
    let deaf = false
    // Undefined until a test gave a verdict.
    let verdict: boolean | undefined
    const watchers = new Set<(hears: boolean) => void>()
    const tell = (hears: boolean) => {
      verdict = hears
      for (const watcher of watchers) watcher(hears)
    }
    const watch = (onHearing: (hears: boolean) => void) => {
      watchers.add(onHearing)
      if (verdict !== undefined) onHearing(verdict)
      return () => {
        watchers.delete(onHearing)
      }
    }
    const heard = (payload: string) => {
      const answer = waiting.get(payload)
      if (answer !== undefined) Deferred.doneUnsafe(answer, Exit.void)
    }
    const check = Effect.suspend(() => {
      const payload = `${SELF_TEST_PREFIX}${crypto.randomUUID()}`
      return test(payload).pipe(Effect.ensuring(Effect.sync(() => waiting.delete(payload))))
    }).pipe(Effect.ignore)
    const test = (payload: string) =>
      Effect.gen(function* () {
        const answer = yield* Deferred.make<void>()
        waiting.set(payload, answer)
        const sent = yield* Effect.exit(notify(payload))
        if (Exit.isFailure(sent)) return
        const answered = Option.isSome(
          yield* Deferred.await(answer).pipe(Effect.timeoutOption(SELF_TEST_WITHIN_MS)),
        )
        tell(answered)
        if (!answered && !deaf) {
          deaf = true
          yield* Effect.logWarning(deafWarning(channel, SELF_TEST_WITHIN_MS))
        } else if (answered && deaf) {
          deaf = false
          yield* Effect.logInfo(hearsAgain(channel))
        }
      })
    return { heard, check, watch }
  })
