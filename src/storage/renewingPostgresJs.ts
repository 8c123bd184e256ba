/**
 * A postgres.js pool that replaces itself after a connection of it closes.
 *
 * postgres.js 3.4.9 reuses a connection object across reconnects, and one
 * closed mid-write (a database restart under load) can keep a stale write
 * timer: the next query on it is buffered and never sent, so it hangs forever
 * — seen as producer transactions on the store's Kysely stalled after a
 * PostgreSQL restart on Bun (upstream #1066, #1154, #1208). So after any
 * close (debounced: a restart closes them all) new work goes to a fresh pool
 * and the old one is ended: its healthy statements get `graceSeconds` to
 * finish, then whatever still hangs is destroyed, which fails it instead of
 * leaving it waiting. A mitigation, not a fix: a connection of the fresh pool
 * that fails while connecting reconnects without a close event, and a soak
 * in CI still saw one transaction hang (README "Drivers under faults").
 *
 * Closes only come from faults: the pools are built without `max_lifetime`
 * (postgres.js otherwise recycles every connection each 30–60 minutes).
 */
import type postgres from "postgres"

export interface RenewingClient {
  /** What Kysely's dialect takes: `reserve()` and `end()` go to the pool of the moment. */
  readonly facade: postgres.Sql
  /** The pool of the moment, for LISTEN and NOTIFY. */
  readonly current: () => postgres.Sql
  /** How many times the pool was replaced. */
  readonly renewals: () => number
}

export const makeRenewingClient = (
  create: (onclose: () => void) => postgres.Sql,
  options: { readonly debounceMs: number; readonly graceSeconds: number },
): RenewingClient => {
  let generation = 0
  let renewals = 0
  let pending: ReturnType<typeof setTimeout> | undefined
  let ended = false
  const build = (): postgres.Sql => {
    const mine = generation
    return create(() => {
      // Closes of a pool already replaced (its own ending included) change nothing.
      if (ended || mine !== generation || pending !== undefined) return
      pending = setTimeout(renew, options.debounceMs)
    })
  }
  let current = build()
  const retired = new Set<Promise<void>>()
  function renew() {
    pending = undefined
    if (ended) return
    const old = current
    generation++
    renewals++
    current = build()
    const ending = old.end({ timeout: options.graceSeconds }).catch(() => undefined)
    retired.add(ending)
    void ending.then(() => retired.delete(ending))
  }
  const facade = Object.assign(
    () => {
      throw new Error("txbox: the store's postgres.js client is used through Kysely only")
    },
    {
      reserve: () => current.reserve(),
      end: async (endOptions?: { timeout?: number }) => {
        ended = true
        if (pending !== undefined) clearTimeout(pending)
        await Promise.all([current.end(endOptions), ...retired])
      },
    },
  ) as unknown as postgres.Sql
  return { facade, current: () => current, renewals: () => renewals }
}
