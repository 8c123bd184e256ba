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
 * - each reservation learns which connection it holds: postgres.js hands the
 *   connection to a statement's `onexecute` when it sends a simple one (the
 *   transaction's BEGIN). When that connection closes, the reservation's
 *   statements fail at once with CONNECTION_CLOSED (a connection error: the
 *   caller retries), later ones are refused, and it is not handed back.
 *   Statements sent on it were already failed by postgres.js; the others were
 *   queued inside the reservation (a ROLLBACK sent while the connection was
 *   busy), which a close never fails: they would wait forever.
 * - reservations on the pool's other connections are left alone: their
 *   statements run to their answer, so a COMMIT that the server applied is
 *   never reported as failed (a producer retrying would enqueue twice).
 * - a reservation that has not said yet (no simple statement so far) may hold
 *   the closed connection: it sends nothing more, and its statements that
 *   never reached a connection fail `settleMs` after the close.
 * - a transaction still waiting for a connection when its pool closes asks
 *   the fresh pool instead.
 * - the first close replaces the pool: new work goes to a fresh one, lazily
 *   connected, and the old one is ended once no reservation of it still runs
 *   on a live connection. Its other statements get `graceSeconds` to finish;
 *   what still hangs then is destroyed, which fails it instead of leaving it
 *   waiting.
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

/** A statement of a reservation, sent to postgres.js and not answered yet. */
interface Pending {
  /** postgres.js's query: its `state` stays null until a connection takes it. */
  readonly query: unknown
  readonly fail: () => void
}

/** One reserved connection, as far as the client tracks it. */
interface Reservation {
  /** postgres.js's id of the connection, once a statement's `onexecute` said. */
  connection: number | undefined
  /** Its connection closed, or may have: nothing more is sent on it. */
  lost: boolean
  readonly pending: Set<Pending>
  /** Called when a statement leaves `pending`: a retired pool may be done. */
  readonly onSettled: () => void
}

/** One pool, whether a connection of it has closed, and who waits on it. */
interface Generation {
  readonly sql: postgres.Sql
  closed: boolean
  /** Reservations not handed back yet. */
  readonly reservations: Set<Reservation>
  /** Transactions waiting for a connection: sent to the fresh pool on a close. */
  readonly waiting: Set<() => void>
}

/** What a statement on a reservation whose connection closed fails with, as postgres.js names it. */
const closedConnection = (): Error =>
  Object.assign(new Error("txbox: this transaction's connection closed; the transaction cannot go on"), {
    code: "CONNECTION_CLOSED",
  })

/** A query postgres.js has not handed to any connection: failing it cannot hide a server's answer. */
const neverSent = (query: unknown): boolean => (query as { state?: unknown }).state == null

/** postgres.js calls a query's `onexecute` with the connection it wrote it on (simple statements only). */
type ExecuteOptions = postgres.UnsafeQueryOptions & { onexecute: (connection: { id: number }) => boolean }

/** Runs `text` on `reserved`, failing it when `reservation`'s connection is lost. */
const send = (
  reserved: postgres.ReservedSql,
  reservation: Reservation,
  text: string,
  parameters: Parameters<postgres.ReservedSql["unsafe"]>[1],
) => {
  const onexecute: ExecuteOptions = {
    onexecute: (connection) => {
      reservation.connection = connection.id
      return true // as without the hook: the connection takes more statements
    },
  }
  const query = reserved.unsafe(text, parameters, onexecute)
  const answer = new Promise((resolve, reject) => {
    const settle = () => {
      if (reservation.pending.delete(pending)) reservation.onSettled()
    }
    const pending: Pending = {
      query,
      fail: () => {
        settle()
        reject(closedConnection())
      },
    }
    reservation.pending.add(pending)
    query.then(
      (result) => {
        settle()
        resolve(result)
      },
      (error: unknown) => {
        settle()
        reject(error)
      },
    )
  })
  // Kysely streams through `cursor` (unguarded: a stream is not a transaction's next statement).
  return Object.assign(answer, { cursor: query.cursor.bind(query) })
}

/** A reservation as Kysely's postgres.js dialect uses it (`unsafe`, `release`), refusing a lost connection. */
const guarded = (
  reserved: postgres.ReservedSql,
  reservation: Reservation,
  onRelease: () => void,
): postgres.ReservedSql =>
  ({
    unsafe: (text: string, parameters?: Parameters<postgres.ReservedSql["unsafe"]>[1]) =>
      reservation.lost ? Promise.reject(closedConnection()) : send(reserved, reservation, text, parameters),
    // Handed back, a closed connection would be moved to the pool's open queue and reused.
    release: () => {
      if (!reservation.lost) reserved.release()
      onRelease()
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

/** Whether a reservation keeps its retired pool from ending: it may still get answers. */
const running = (reservation: Reservation): boolean => !reservation.lost || reservation.pending.size > 0

export const makeRenewingClient = (
  create: (onclose: (connection?: number) => void) => postgres.Sql,
  options: { readonly graceSeconds: number; readonly settleMs: number },
): RenewingClient => {
  let renewals = 0
  let ended = false
  /** Replaced pools not ended yet: they wait for their running reservations. */
  const retired = new Set<Generation>()
  const ending = new Set<Promise<void>>()
  const endPool = (pool: Generation, endOptions?: { timeout?: number }) => {
    retired.delete(pool)
    const end = pool.sql.end(endOptions).catch(() => undefined)
    ending.add(end)
    void end.then(() => ending.delete(end))
  }
  const endIfIdle = (pool: Generation) => {
    if (retired.has(pool) && ![...pool.reservations].some(running))
      endPool(pool, { timeout: options.graceSeconds })
  }
  /** After `connection` of the reservation's pool closed (undefined: postgres.js did not say which). */
  const lose = (reservation: Reservation, connection: number | undefined) => {
    const known = connection !== undefined && reservation.connection !== undefined
    if (known && reservation.connection !== connection) return
    reservation.lost = true
    if (known) for (const pending of reservation.pending) pending.fail()
    else
      setTimeout(() => {
        for (const pending of reservation.pending) if (neverSent(pending.query)) pending.fail()
      }, options.settleMs).unref?.()
  }
  const onClose = (pool: Generation, connection: number | undefined) => {
    for (const reservation of pool.reservations) lose(reservation, connection)
    if (!pool.closed) {
      pool.closed = true
      for (const abandon of pool.waiting) abandon()
      if (!ended && pool === current) renew()
    }
  }
  const build = (): Generation => {
    const generation: Generation = {
      closed: false,
      reservations: new Set(),
      waiting: new Set(),
      // Called by postgres.js right after it dropped the socket, before anything else can run on it.
      sql: create((connection) => onClose(generation, connection)),
    }
    return generation
  }
  let current = build()
  function renew() {
    retired.add(current)
    const old = current
    renewals++
    current = build()
    endIfIdle(old)
  }
  const track = (pool: Generation, reserved: postgres.ReservedSql): postgres.ReservedSql => {
    const reservation: Reservation = {
      connection: undefined,
      lost: false,
      pending: new Set(),
      onSettled: () => endIfIdle(pool),
    }
    pool.reservations.add(reservation)
    return guarded(reserved, reservation, () => {
      pool.reservations.delete(reservation)
      endIfIdle(pool)
    })
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
          if (reserved !== undefined) return track(pool, reserved)
        }
      },
      end: async (endOptions?: { timeout?: number }) => {
        ended = true
        for (const pool of retired) endPool(pool, endOptions)
        await Promise.all([current.sql.end(endOptions), ...ending])
      },
    },
  ) as unknown as postgres.Sql
  return { facade, current: () => current.sql, renewals: () => renewals }
}
