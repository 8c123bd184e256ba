/**
 * `Outbox.transaction`: the caller's business transaction, opened and
 * committed by txbox, so that the outbox rows its `Outbox.enqueue` calls make
 * go to the server with the COMMIT, in the same round trip, instead of one
 * round trip each. On a node-postgres pool or client the BEGIN goes in the
 * same write as the body's first statement (drivers/pg/beginAhead.ts). A
 * producer's transaction of one business write and one event is then two
 * round trips (BEGIN + the write, INSERT + COMMIT) where enqueue in the
 * caller's own transaction makes four: half the producer's writes, and of
 * PostgreSQL's protocol work, per transaction (bench/cost.ts).
 *
 * The rows are checked by their contracts when enqueue is called, as always;
 * they reach the table at commit, atomically with everything else. A failure
 * to write them fails the commit (nothing is committed). Keyed rows
 * (`partitionKey`) go with them, numbered from their keys' counter rows at the
 * end (one keyed row in the same text, several in a round trip just before),
 * whose row locks then last only until the COMMIT (numbers still follow
 * commit order).
 *
 * Several statements in one round trip need the simple query protocol:
 * node-postgres and postgres.js send a statement without parameters that way,
 * PGlite does not. So the first transaction on each database target asks,
 * once, whether a two-statement text runs both (in a transaction it rolls
 * back); where it does not, the INSERT and the COMMIT go one after the other.
 */
import { type Context, Effect, Exit, type Fiber } from "effect"
import { CompiledQuery, type Kysely } from "kysely"
import { StoreError } from "../../Errors.ts"
import type { SqlClient } from "../../ports/OutboxWriter.ts"
import { type BeginAhead, beginAhead } from "../drivers/pg/beginAhead.ts"
import { commitInserts, enqueueError, type RidingRow, riding, scopeOf } from "./enqueue.ts"
import { classifyDbError } from "./errors.ts"

/** A node-postgres `Pool` (or one like it): a client per transaction, released after. */
export interface SqlPool {
  /** A client for one transaction, given back with `release` (an error: dropped instead of kept). */
  // biome-ignore lint/suspicious/noExplicitAny: node-postgres types release's argument loosely
  connect(): Promise<SqlClient & { release(error?: any): void }>
  /** Tells a pool from a client (node-postgres's `Pool` has it). */
  readonly idleCount: number
}

/** What `Outbox.transaction` opens its transaction on. */
// biome-ignore lint/suspicious/noExplicitAny: the caller's own database
export type TransactionTarget = Kysely<any> | SqlPool | SqlClient

/**
 * What the body is given: for a Kysely, a Kysely on the transaction's one connection; for a
 * pool, the client it lent; for a client, the client.
 */
export type TransactionOf<T> = T extends Kysely<infer DB> ? Kysely<DB> : T extends SqlPool ? ClientOf<T> : T

/** A pool's client: node-postgres's `connect` also has a callback form, which `ReturnType` would pick. */
export type ClientOf<P> = P extends {
  connect(): Promise<infer C>
  connect(callback: (...args: never[]) => void): void
}
  ? C
  : P extends { connect(): Promise<infer C> }
    ? C
    : never

/** One connection with the transaction on it. */
interface Session {
  /** What the body is given, and what its enqueue calls are known by. */
  readonly trx: object
  /** Runs a text (no parameters: the simple protocol where the driver has it); the last statement's rows. */
  readonly run: (text: string) => Promise<ReadonlyArray<Record<string, unknown>>>
}

// biome-ignore lint/suspicious/noExplicitAny: the caller's own database
const isKysely = (target: TransactionTarget): target is Kysely<any> => "getExecutor" in target
const isPool = (target: TransactionTarget): target is SqlPool =>
  "idleCount" in target && typeof (target as SqlPool).connect === "function"

/** node-postgres answers a text of several statements with one result each. */
const lastRows = (result: unknown): ReadonlyArray<Record<string, unknown>> => {
  const last = Array.isArray(result) ? result[result.length - 1] : result
  return (last as { rows?: ReadonlyArray<Record<string, unknown>> } | undefined)?.rows ?? []
}

const clientSession = (client: SqlClient): Session => ({
  trx: client,
  run: (text) => client.query(text).then(lastRows),
})

// biome-ignore lint/suspicious/noExplicitAny: the caller's own database
const kyselySession = (conn: Kysely<any>): Session => ({
  trx: conn,
  run: (text) => conn.executeQuery(CompiledQuery.raw(text)).then((r) => r.rows as never),
})

/** Per target: whether a text of two statements runs both (asked once, in a transaction rolled back). */
const multiStatement = new WeakMap<object, boolean | Promise<boolean>>()

const MARK = "txbox.multi_statement"

const asksMultiStatement = async (session: Session): Promise<boolean> => {
  try {
    await session.run("BEGIN")
    await session.run(`SELECT 1; SELECT set_config('${MARK}', 'on', true)`)
    const rows = await session.run(`SELECT current_setting('${MARK}', true) AS on`)
    return rows[0]?.on === "on"
  } catch (cause) {
    // A lost connection says nothing about the driver: asked again on the next transaction.
    const error = classifyDbError("Outbox.transaction begin", cause)
    if (error.reason === "connection") throw error
    return false
  } finally {
    await session.run("ROLLBACK").catch(() => undefined)
  }
}

const multiStatementOn = (target: object, session: Session): boolean | Promise<boolean> => {
  const known = multiStatement.get(target)
  if (known !== undefined) return known
  const answer = asksMultiStatement(session).then(
    (multi) => {
      multiStatement.set(target, multi)
      return multi
    },
    (error) => {
      multiStatement.delete(target)
      throw error
    },
  )
  multiStatement.set(target, answer)
  return answer
}

/** BEGIN on `session`, now; whether its target takes two statements in a text. */
const begin = async (target: object, session: Session): Promise<boolean> => {
  const multi = await multiStatementOn(target, session)
  await sendBegin(session)
  return multi
}

const sendBegin = (session: Session): Promise<unknown> =>
  session.run("BEGIN").catch((cause) => Promise.reject(classifyDbError("Outbox.transaction begin", cause)))

/**
 * BEGIN on a client's `session`, in front of its next statement where it is a node-postgres client
 * that takes two statements in a text (drivers/pg/beginAhead.ts), else alone, now.
 */
const beginOnClient = async (
  target: object,
  client: object,
  session: Session,
): Promise<{ readonly multi: boolean; readonly ahead: BeginAhead | undefined }> => {
  const multi = await multiStatementOn(target, session)
  const ahead = multi ? beginAhead(client) : undefined
  if (ahead === undefined) await sendBegin(session)
  return { multi, ahead }
}

/**
 * The rows with the COMMIT, in one text where the target takes it. A statement goes before COMMIT
 * even with no rows: in a transaction in which a statement failed (and the body caught it) it
 * fails, where COMMIT would answer ROLLBACK and no error. Rejects with a `StoreError`; the
 * transaction is then rolled back (or was: a failed COMMIT ends it).
 */
const commit = async (
  session: Session,
  multi: boolean,
  rows: ReadonlyArray<RidingRow>,
  ahead?: BeginAhead,
): Promise<void> => {
  let committed: () => void
  try {
    const inserts = await commitInserts(scopeOf(session.trx as SqlClient), rows, session.run)
    committed = inserts.committed
    const texts = inserts.texts
    const before = texts.length > 0 ? texts : ["SELECT 1"]
    if (multi) await session.run(`${before.join(";\n")};\nCOMMIT`)
    else {
      for (const text of before) await session.run(text)
      await session.run("COMMIT")
    }
  } catch (cause) {
    await rollback(session, ahead)
    throw enqueueError(cause, "Outbox.transaction commit")
  }
  committed()
}

/**
 * Never rejects; its error, if it failed: a connection that cannot roll back is dropped by its pool
 * (see `release`). A BEGIN still waiting for a statement was never sent: nothing to roll back.
 */
const rollback = (session: Session, ahead?: BeginAhead): Promise<unknown> => {
  if (ahead?.pending()) {
    ahead.cancel()
    return Promise.resolve(undefined)
  }
  return session.run("ROLLBACK").then(
    () => undefined,
    (cause) => cause,
  )
}

/** A promise as an Effect, without an AbortController per call (one per business transaction). */
const promised = <A>(run: () => Promise<A>): Effect.Effect<A, StoreError> =>
  Effect.callback<A, StoreError>((resume) => {
    run().then(
      (a) => resume(Effect.succeed(a)),
      (cause) =>
        resume(
          Effect.fail(cause instanceof StoreError ? cause : classifyDbError("Outbox.transaction", cause)),
        ),
    )
  })

interface Open {
  readonly session: Session
  readonly multi: boolean
  /** The BEGIN, when it waits for the first statement (`beginOnClient`). */
  readonly ahead: BeginAhead | undefined
  /** Gives a pool's client back (a BEGIN still waiting forgotten); `broken`: dropped instead of kept. */
  readonly release: (broken?: unknown) => void
}

/** node-postgres's clients are event emitters; one that loses its connection while lent emits `error`. */
interface Emitter {
  on(event: "error", listener: (error: unknown) => void): unknown
  removeListener(event: "error", listener: (error: unknown) => void): unknown
}

const isEmitter = (client: object): client is Emitter =>
  typeof (client as Partial<Emitter>).on === "function" &&
  typeof (client as Partial<Emitter>).removeListener === "function"

const open = async (target: SqlPool | SqlClient): Promise<Open> => {
  if (!isPool(target)) {
    const session = clientSession(target)
    const { multi, ahead } = await beginOnClient(target, target, session)
    return { session, multi, ahead, release: () => ahead?.cancel() }
  }
  const client = await target.connect()
  // A pool listens for its idle clients' errors, not for a lent one's: a connection lost between two
  // statements (a restart, a terminated backend) would be an unhandled `error` event, which ends
  // the process. The statement that follows fails, and the client goes back broken.
  let lost: unknown
  const onError = (error: unknown) => {
    lost ??= error
  }
  const emitter = isEmitter(client) ? client : undefined
  emitter?.on("error", onError)
  let ahead: BeginAhead | undefined
  const release = (broken?: unknown) => {
    ahead?.cancel()
    emitter?.removeListener("error", onError)
    client.release(broken ?? lost)
  }
  const session = clientSession(client)
  try {
    const begun = await beginOnClient(target, client, session)
    ahead = begun.ahead
    return { session, multi: begun.multi, ahead, release }
  } catch (cause) {
    release(cause)
    throw cause
  }
}

/** On a pool or a client: the body runs in the caller's fiber, between BEGIN and the COMMIT. */
const onClient = <A, E, R>(
  target: SqlPool | SqlClient,
  body: (trx: object) => Effect.Effect<A, E, R>,
): Effect.Effect<A, E | StoreError, R> =>
  Effect.acquireUseRelease(
    promised(() => open(target)),
    ({ session, multi, ahead }) => {
      const rows: RidingRow[] = []
      riding.set(session.trx, rows)
      return Effect.flatMap(
        Effect.ensuring(
          Effect.suspend(() => body(session.trx)),
          Effect.sync(() => riding.delete(session.trx)),
        ),
        (value) =>
          Effect.as(
            promised(() => commit(session, multi, rows, ahead)),
            value,
          ),
      )
    },
    ({ session, ahead, release }, exit) =>
      Exit.isSuccess(exit)
        ? Effect.sync(() => release())
        : // A failed COMMIT rolled back already; a second ROLLBACK only warns.
          Effect.promise(async () => release(await rollback(session, ahead))),
  )

/**
 * On a Kysely: its one connection (`connection()`, a callback) for the transaction, the body in a
 * fiber of its own with the caller's services, interrupted with the caller.
 */
const onKysely = <A, E, R>(
  // biome-ignore lint/suspicious/noExplicitAny: the caller's own database
  db: Kysely<any>,
  body: (trx: object) => Effect.Effect<A, E, R>,
): Effect.Effect<A, E | StoreError, R> =>
  Effect.withFiber((caller) =>
    Effect.callback<A, E | StoreError>((resume) => {
      let interrupted = false
      let child: Fiber.Fiber<A, E> | undefined
      db.connection()
        .execute(async (conn) => {
          const session = kyselySession(conn)
          const multi = await begin(db, session)
          const rows: RidingRow[] = []
          riding.set(conn, rows)
          const exit = await new Promise<Exit.Exit<A, E>>((done) => {
            if (interrupted) return done(Exit.interrupt())
            const fiber = Effect.runForkWith(caller.context as Context.Context<R>)(
              Effect.suspend(() => body(conn)),
            )
            child = fiber
            fiber.addObserver(done)
          }).finally(() => riding.delete(conn))
          if (Exit.isFailure(exit)) await rollback(session)
          else await commit(session, multi, rows)
          return exit
        })
        .then(
          (exit) => resume(exit),
          (cause) =>
            resume(
              Effect.fail(cause instanceof StoreError ? cause : classifyDbError("Outbox.transaction", cause)),
            ),
        )
      return Effect.sync(() => {
        interrupted = true
        child?.interruptUnsafe()
      })
    }),
  )

/**
 * Runs `body` in a transaction on `db` (a Kysely, a node-postgres pool or client) and commits it,
 * with the outbox rows of every `Outbox.enqueue(trx, …)` in it written in the COMMIT's round trip;
 * rolls back when `body` fails or is interrupted. Fails with the body's error, or `StoreError` when
 * BEGIN or COMMIT (with the rows) fails: nothing is committed then. The body must not commit or
 * roll back itself.
 */
export const outboxTransaction = <T extends TransactionTarget, A, E = never, R = never>(
  db: T,
  body: (trx: TransactionOf<T>) => Effect.Effect<A, E, R>,
): Effect.Effect<A, E | StoreError, R> =>
  isKysely(db)
    ? onKysely(db, body as (trx: object) => Effect.Effect<A, E, R>)
    : onClient(db, body as (trx: object) => Effect.Effect<A, E, R>)
