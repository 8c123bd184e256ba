/**
 * The relay's claims held in a transaction (`Database.holdsClaims`): a claim
 * locks its rows with `FOR UPDATE SKIP LOCKED` and writes nothing; the mark
 * records the verdicts and commits in the same transaction. One row write per
 * message instead of two (a lease, then the mark). The transaction is the
 * lease: a relay that dies drops its connection and PostgreSQL hands the rows
 * back at once; one that stays silent longer than its lease between two
 * statements is cut off by `idle_in_transaction_session_timeout`, set by the
 * claim; `extend` runs a statement in the transaction to restart that clock.
 *
 * On a store with sessions (`Database.session`, node-postgres) `BEGIN` goes
 * with the claim and `COMMIT` with the mark, each pair in one round trip:
 * two a batch, as many as a lease's claim and mark. Elsewhere, Kysely's
 * controlled transaction: four.
 */
import { CompiledQuery, type ControlledTransaction, type Kysely } from "kysely"
import type { DatabaseSession } from "../../ports/Database.ts"
import type { OutboxMark } from "../../ports/OutboxStore.ts"
import type { TxboxDatabase } from "../../ports/tables.ts"
import { markedCount, updatedOf } from "./fragments.ts"
import { inlined } from "./inline.ts"
import type { ShardParams } from "./shard.ts"

/** The statements a held claim runs (SqlOutboxStore.ts's), and how it writes verdicts out. */
export interface HeldStatements<Row> {
  readonly claimHeld: (params: {
    readonly limit: number
    readonly idleMs: string
    /** How far back the claim looks (claimWindow.ts). */
    readonly sinceMs: number
    /** The relay's share of the outbox; undefined: every row. */
    readonly shard?: ShardParams | undefined
  }) => CompiledQuery<Row>
  readonly markHeld: (params: { readonly verdicts: string }) => CompiledQuery
  readonly markHeldSent: (params: { readonly ids: string; readonly token: string }) => CompiledQuery
  readonly verdictsOf: (marks: ReadonlyArray<OutboxMark>) => string
  /**
   * Run in the claim's round trip where that costs none (sessions): its rows come back as `after`.
   * After the claim; in a round trip that carries the last claim's mark, before that mark.
   */
  readonly afterClaim?: CompiledQuery
}

/** One open held claim's transaction. */
interface Tx {
  /** Runs `statement`, then commits; its row count. Rejects (and the rows stay pending) when either fails. */
  readonly finish: (statement: CompiledQuery) => Promise<number>
  /** A statement in the transaction, which restarts its idle clock. */
  readonly touch: () => Promise<void>
  /** Hands the rows back; never rejects. */
  readonly rollback: () => Promise<void>
  /**
   * Sessions only: runs `statement`, commits, and opens the next claim's transaction on the same
   * connection, all in one round trip; `statement`'s row count and the claim's answer. Rejects
   * when any of it fails: whether the commit happened is then unknown (the rows were published;
   * if it did not, they come due again and go out twice, as after a crash).
   */
  readonly finishThenClaim?: <Row>(
    statement: CompiledQuery,
    claim: CompiledQuery<Row>,
    after?: CompiledQuery,
  ) => Promise<{ readonly updated: number; readonly answer: Answer<Row> }>
}

/** A claim's rows, the transaction holding them when there are any, and `after`'s rows. */
interface Answer<Row> {
  readonly rows: ReadonlyArray<Row>
  readonly tx?: Tx
  readonly after?: ReadonlyArray<unknown>
}

/** Opens a transaction, runs `claim` in it (and `after`, where free); with no rows, the transaction is over already. */
type Begin = <Row>(claim: CompiledQuery<Row>, after?: CompiledQuery) => Promise<Answer<Row>>

const SELECT_1 = CompiledQuery.raw("SELECT 1")

/**
 * Through sessions: BEGIN with the claim, COMMIT with the mark, one round trip each; or the mark,
 * its COMMIT and the next claim's BEGIN with that claim, on the same connection, in one.
 */
const sessionBegin =
  (open: () => Promise<DatabaseSession>): Begin =>
  async <Row>(claim: CompiledQuery<Row>, afterClaim?: CompiledQuery) => {
    const session = await open()
    let done = false
    const end = (broken?: Error) => {
      if (done) return
      done = true
      session.release(broken)
    }
    const broken = (error: unknown) => end(error instanceof Error ? error : new Error(String(error)))
    const rollback = () =>
      session.script("ROLLBACK").then(
        () => end(),
        (error: Error) => end(error),
      )
    /**
     * A claim's round trip; with `mark`, the last claim's mark and COMMIT go ahead of its BEGIN
     * (`updated`: the mark's row count), and `after` ahead of the mark: it reads the last publish
     * as it was before this relay's own, which would otherwise always be the last.
     */
    const claimOn = async <R>(
      mark: CompiledQuery | undefined,
      next: CompiledQuery<R>,
      after: CompiledQuery | undefined,
    ): Promise<{ readonly updated: number; readonly answer: Answer<R> }> => {
      // The statements of the round trip, in order, and where each answer sits.
      const parts: string[] = []
      const add = (text: string) => parts.push(text) - 1
      const probeFirst = mark !== undefined && after !== undefined ? add(inlined(after)) : undefined
      const markAt = mark === undefined ? undefined : add(inlined(mark))
      if (mark !== undefined) add("COMMIT")
      add("BEGIN")
      const claimAt = add(inlined(next))
      const afterAt = after === undefined ? undefined : (probeFirst ?? add(inlined(after)))
      let answers: ReadonlyArray<{ readonly rows: ReadonlyArray<unknown>; readonly rowCount: number }>
      try {
        answers = await session.script(parts.join(";"))
      } catch (error) {
        // The transaction is aborted and still open on the connection: close the connection.
        broken(error)
        throw error
      }
      const marked = markAt === undefined ? undefined : answers[markAt]
      const updated = marked === undefined ? 0 : updatedOf(marked.rows, marked.rowCount)
      const rows = (answers[claimAt]?.rows ?? []) as ReadonlyArray<R>
      const afterRows = afterAt === undefined ? undefined : (answers[afterAt]?.rows ?? [])
      if (rows.length === 0) {
        await rollback()
        return { updated, answer: afterRows === undefined ? { rows } : { rows, after: afterRows } }
      }
      const tx: Tx = {
        finish: async (statement) => {
          try {
            const answers = await session.script(`${inlined(statement)};COMMIT`)
            end()
            const marked = answers[0]
            return marked === undefined ? 0 : updatedOf(marked.rows, marked.rowCount)
          } catch (error) {
            broken(error)
            throw error
          }
        },
        finishThenClaim: (statement, claim, after) => claimOn(statement, claim, after),
        touch: () => session.script("SELECT 1").then(() => undefined),
        rollback,
      }
      return { updated, answer: afterRows === undefined ? { rows, tx } : { rows, tx, after: afterRows } }
    }
    return (await claimOn(undefined, claim, afterClaim)).answer
  }

/** Through Kysely's controlled transaction: BEGIN, the claim, the mark and COMMIT, each alone. */
const kyselyBegin =
  (db: Kysely<TxboxDatabase>): Begin =>
  async <Row>(claim: CompiledQuery<Row>) => {
    const trx: ControlledTransaction<TxboxDatabase> = await db.startTransaction().execute()
    const rollback = () =>
      trx
        .rollback()
        .execute()
        .catch(() => undefined)
    try {
      const { rows } = await trx.executeQuery(claim)
      if (rows.length === 0) {
        await trx.commit().execute()
        return { rows }
      }
      const tx: Tx = {
        finish: async (statement) => {
          try {
            const updated = markedCount(await trx.executeQuery(statement))
            await trx.commit().execute()
            return updated
          } catch (error) {
            await rollback()
            throw error
          }
        },
        touch: () => trx.executeQuery(SELECT_1).then(() => undefined),
        rollback,
      }
      return { rows, tx }
    } catch (error) {
      await rollback()
      throw error
    }
  }

/**
 * How long a mark may wait for the next claim's round trip (sessions): at a steady load a relay
 * looks every 25–50 ms from one look's start to the next, so that look comes within this and
 * carries the mark; one that does not come sends it alone. It waits from the confirm, a few ms
 * after the claim: at 45 ms (until 2026-12-05) a mark at the 50 ms cadence went alone a ms or two
 * before the look more often than not. Two A/B rounds at 1 + 1, 1,000 msg/s (bench/cost.ts): relay
 * 83–85 → 77–78 µs per message, PostgreSQL 615–657 → 545–589. Short next to `HOT_MS` (Relay.ts):
 * producers skip their NOTIFY for 100 ms after a row was marked sent.
 */
export const MARK_WAIT_MS = 70

/** A mark waiting for the next claim's round trip. */
interface WaitingMark {
  readonly tx: Tx
  readonly statement: CompiledQuery
  readonly resolve: (updated: number) => void
  readonly reject: (error: unknown) => void
  readonly timer: ReturnType<typeof setTimeout>
}

export const makeHeldClaims = <Row extends { readonly id: string }>(
  db: Kysely<TxboxDatabase>,
  session: (() => Promise<DatabaseSession>) | undefined,
  q: HeldStatements<Row>,
) => {
  const begin = session === undefined ? kyselyBegin(db) : sessionBegin(session)
  // Each held claim with its place in the order claims began (`begun`).
  const held = new Map<string, { readonly tx: Tx; readonly rows: ReadonlyArray<Row>; readonly seq: number }>()
  const idsOf = (rows: ReadonlyArray<{ readonly id: string }>) => JSON.stringify(rows.map((row) => row.id))
  let begun = 0
  // At most one: a mark waits only while no claim began after its own.
  let waiting: WaitingMark | undefined

  /** Sends the waiting mark alone, now; settles when it is answered. */
  const flushWaiting = (): Promise<unknown> => {
    const w = waiting
    if (w === undefined) return Promise.resolve()
    waiting = undefined
    clearTimeout(w.timer)
    return w.tx.finish(w.statement).then(w.resolve, w.reject)
  }

  /** Hands a held claim's rows back (its transaction rolled back); undefined: `token` holds none. */
  const release = (token: string): Promise<number> | undefined => {
    const claim = held.get(token)
    if (claim === undefined) return undefined
    held.delete(token)
    return claim.tx.rollback().then(() => claim.rows.length)
  }

  /**
   * Up to `limit` due rows, held for `token` until its mark or release; none: nothing left open.
   * With them, the rows of `afterClaim` when it ran. A mark waiting goes in the same round trip.
   */
  const claim = async (
    token: string,
    limit: number,
    leaseMs: number,
    sinceMs: number,
    shard: ShardParams | undefined,
  ) => {
    const seq = ++begun
    const statement = q.claimHeld({
      limit,
      idleMs: `${Math.ceil(leaseMs)}ms`,
      sinceMs,
      ...(shard === undefined ? {} : { shard }),
    })
    const w = waiting
    let answer: Answer<Row>
    if (w?.tx.finishThenClaim === undefined) answer = await begin(statement, q.afterClaim)
    else {
      waiting = undefined
      clearTimeout(w.timer)
      try {
        const both = await w.tx.finishThenClaim(w.statement, statement, q.afterClaim)
        w.resolve(both.updated)
        answer = both.answer
      } catch (error) {
        w.reject(error)
        throw error
      }
    }
    if (answer.tx !== undefined) held.set(token, { tx: answer.tx, rows: answer.rows, seq })
    return answer
  }

  /**
   * Records `marks` and commits; undefined: `token` holds no claim here. A failure rolls back:
   * nothing recorded, the rows come due again as they were (published twice at worst). Through a
   * session, and when no claim began after this one (the relay's next look would wait for this
   * batch to settle), the mark waits up to `MARK_WAIT_MS` for the next claim to carry it: a round
   * trip a batch less, for the relay and for PostgreSQL (bench/cost.ts).
   */
  const mark = (token: string, marks: ReadonlyArray<OutboxMark>): Promise<number> | undefined => {
    const claim = held.get(token)
    if (claim === undefined) return undefined
    held.delete(token)
    if (marks.length === 0) return claim.tx.rollback().then(() => 0)
    const allSent = marks.length === claim.rows.length && marks.every((m) => m.verdict._tag === "Done")
    const statement = allSent
      ? q.markHeldSent({ ids: idsOf(claim.rows), token })
      : q.markHeld({ verdicts: q.verdictsOf(marks) })
    if (claim.tx.finishThenClaim === undefined || claim.seq !== begun) return claim.tx.finish(statement)
    // None waits already: its claim was the last to begin, and this one began after it.
    return new Promise<number>((resolve, reject) => {
      waiting = { tx: claim.tx, statement, resolve, reject, timer: setTimeout(flushWaiting, MARK_WAIT_MS) }
    })
  }

  /** Restarts the held transaction's idle clock; undefined: `token` holds no claim here. */
  const extend = (token: string): Promise<number> | undefined => {
    const claim = held.get(token)
    if (claim === undefined) return undefined
    return claim.tx.touch().then(() => claim.rows.length)
  }

  /** Hands back every claim still held, and sends a waiting mark (the store is closing: a pool waits for its clients). */
  const releaseAll = (): Promise<unknown> => Promise.all([flushWaiting(), ...[...held.keys()].map(release)])

  return { claim, mark, extend, release, releaseAll, holds: (token: string) => held.has(token) }
}
