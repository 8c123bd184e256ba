/**
 * A postgres.js pool that replaces itself after a connection of it closes,
 * and whose transactions never write on a closed connection.
 *
 * postgres.js 3.4.9 lets a query run on a reserved connection (a transaction)
 * after that connection closed: it writes to a socket it already dropped, and
 * the `TypeError` is thrown from a timer — uncatchable, it ends the process on
 * Node and leaves the query waiting forever on Bun (a database restart under
 * load: upstream #1066, #1154, #1208). Kysely runs such a query at once, e.g.
 * the ROLLBACK after a statement failed with CONNECTION_CLOSED. So:
 *
 * - a reservation stays usable only while its pool has seen no close: after
 *   one, its statements fail at once with CONNECTION_CLOSED (a connection
 *   error: the caller retries) and it is not handed back to the pool. Every
 *   open transaction of that pool fails, not only the one whose connection
 *   closed — postgres.js does not say which connection a reservation holds.
 *   That costs a retry on a fault, never a write on a dead socket.
 * - a statement of such a pool still unanswered `settleMs` after the close
 *   fails too: postgres.js queues a statement sent while its connection is
 *   busy (a ROLLBACK right after the server's "terminating connection"
 *   error) inside the reservation, and a close never fails that queue — it
 *   would wait forever (seen as a producer hung after a PostgreSQL restart).
 * - a transaction still waiting for a connection when its pool closes asks
 *   the fresh pool instead.
 * - the first close replaces the pool: new work goes to a fresh one, lazily
 *   connected, and the old one is ended. Statements already sent on it get
 *   `graceSeconds` to finish; what still hangs then is destroyed, which fails
 *   it instead of leaving it waiting.
 *
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

/** One pool, whether a connection of it has closed, and who waits on it. */
interface Generation {
  readonly sql: postgres.Sql
  closed: boolean
  /** Statements sent and not answered: failed `settleMs` after a close. */
  readonly unanswered: Set<() => void>
  /** Transactions waiting for a connection: sent to the fresh pool on a close. */
  readonly waiting: Set<() => void>
}

/** What a statement on a reservation of a pool that saw a close fails with, as postgres.js names it. */
const closedConnection = (): Error =>
  Object.assign(
    new Error("txbox: a connection of this transaction's pool closed; the transaction cannot go on"),
    {
      code: "CONNECTION_CLOSED",
    },
  )

/**
 * A reservation as Kysely's postgres.js dialect uses it (`unsafe`, `release`),
 * refusing to reach a pool that saw a close.
 */
const guarded = (reserved: postgres.ReservedSql, pool: Generation): postgres.ReservedSql =>
  ({
    unsafe: (...args: Parameters<postgres.ReservedSql["unsafe"]>) => {
      if (pool.closed) return Promise.reject(closedConnection())
      const query = reserved.unsafe(...args)
      const answer = new Promise((resolve, reject) => {
        const giveUp = () => reject(closedConnection())
        pool.unanswered.add(giveUp)
        query.then(
          (result) => {
            pool.unanswered.delete(giveUp)
            resolve(result)
          },
          (error: unknown) => {
            pool.unanswered.delete(giveUp)
            reject(error)
          },
        )
      })
      // Kysely streams through `cursor` (unguarded: a stream is not a transaction's next statement).
      return Object.assign(answer, { cursor: query.cursor.bind(query) })
    },
    // Handed back, a closed connection would be moved to the pool's open queue and reused.
    release: () => {
      if (!pool.closed) reserved.release()
    },
  }) as unknown as postgres.ReservedSql

/** A connection of `pool`, or undefined when the pool closed first (the one it gives later is not used). */
const reserveOn = (pool: Generation): Promise<postgres.ReservedSql | undefined> =>
  new Promise((resolve, reject) => {
    let settled = false
    const abandon = () => {
      settled = true
      resolve(undefined)
    }
    pool.waiting.add(abandon)
    pool.sql.reserve().then(
      (reserved) => {
        pool.waiting.delete(abandon)
        if (!settled) resolve(reserved)
        else if (!pool.closed) reserved.release()
      },
      (error: unknown) => {
        pool.waiting.delete(abandon)
        if (!settled) reject(error)
      },
    )
  })

export const makeRenewingClient = (
  create: (onclose: () => void) => postgres.Sql,
  options: { readonly graceSeconds: number; readonly settleMs: number },
): RenewingClient => {
  let renewals = 0
  let ended = false
  const retired = new Set<Promise<void>>()
  const build = (): Generation => {
    const generation: Generation = {
      closed: false,
      unanswered: new Set(),
      waiting: new Set(),
      // Called by postgres.js right after it dropped the socket, before anything else can run on it.
      sql: create(() => {
        if (generation.closed) return
        generation.closed = true
        for (const abandon of generation.waiting) abandon()
        setTimeout(() => {
          for (const giveUp of generation.unanswered) giveUp()
        }, options.settleMs).unref?.()
        if (!ended && generation === current) renew()
      }),
    }
    return generation
  }
  let current = build()
  function renew() {
    const old = current
    renewals++
    current = build()
    const ending = old.sql.end({ timeout: options.graceSeconds }).catch(() => undefined)
    retired.add(ending)
    void ending.then(() => retired.delete(ending))
  }
  const facade = Object.assign(
    () => {
      throw new Error("txbox: the store's postgres.js client is used through Kysely only")
    },
    {
      reserve: async () => {
        for (;;) {
          const pool = current
          const reserved = await reserveOn(pool)
          if (reserved !== undefined) return guarded(reserved, pool)
        }
      },
      end: async (endOptions?: { timeout?: number }) => {
        ended = true
        await Promise.all([current.sql.end(endOptions), ...retired])
      },
    },
  ) as unknown as postgres.Sql
  return { facade, current: () => current.sql, renewals: () => renewals }
}
