/**
 * The relay's claims held in a transaction (`Database.holdsClaims`): a claim
 * locks its rows with `FOR UPDATE SKIP LOCKED` and writes nothing; the mark
 * records the verdicts and commits in the same transaction. One row write per
 * message instead of two (a lease, then the mark). The transaction is the
 * lease: a relay that dies drops its connection and PostgreSQL hands the rows
 * back at once; one that stays silent longer than its lease between two
 * statements is cut off by `idle_in_transaction_session_timeout`, set by the
 * claim; `extend` runs a statement in the transaction to restart that clock.
 */
import { CompiledQuery, type ControlledTransaction, type Kysely } from "kysely"
import type { OutboxMark } from "../../ports/OutboxStore.ts"
import type { TxboxDatabase } from "../../ports/tables.ts"
import { affected } from "./fragments.ts"
import type { ClaimedRow, OutboxStatements } from "./SqlOutboxStore.ts"

interface Held {
  readonly trx: ControlledTransaction<TxboxDatabase>
  readonly rows: ReadonlyArray<ClaimedRow>
}

const SELECT_1 = CompiledQuery.raw("SELECT 1")

export const makeHeldClaims = (
  db: Kysely<TxboxDatabase>,
  q: OutboxStatements,
  verdictsOf: (marks: ReadonlyArray<OutboxMark>) => string,
) => {
  const held = new Map<string, Held>()
  const idsOf = (rows: ReadonlyArray<{ readonly id: string }>) => JSON.stringify(rows.map((row) => row.id))
  const rollback = (trx: ControlledTransaction<TxboxDatabase>) =>
    trx
      .rollback()
      .execute()
      .catch(() => undefined)

  /** Hands a held claim's rows back (its transaction rolled back); undefined: `token` holds none. */
  const release = (token: string): Promise<number> | undefined => {
    const claim = held.get(token)
    if (claim === undefined) return undefined
    held.delete(token)
    return rollback(claim.trx).then(() => claim.rows.length)
  }

  /** Up to `limit` due rows, held for `token` until its mark or release; none: nothing left open. */
  const claim = async (token: string, limit: number, leaseMs: number): Promise<ReadonlyArray<ClaimedRow>> => {
    const trx = await db.startTransaction().execute()
    try {
      const { rows } = await trx.executeQuery(q.claimHeld({ limit, idleMs: `${Math.ceil(leaseMs)}ms` }))
      if (rows.length === 0) await trx.commit().execute()
      else held.set(token, { trx, rows })
      return rows
    } catch (error) {
      await rollback(trx)
      throw error
    }
  }

  /**
   * Records `marks` and commits; undefined: `token` holds no claim here. A failure rolls back:
   * nothing recorded, the rows come due again as they were (published twice at worst).
   */
  const mark = (token: string, marks: ReadonlyArray<OutboxMark>): Promise<number> | undefined => {
    const claim = held.get(token)
    if (claim === undefined) return undefined
    held.delete(token)
    if (marks.length === 0) return rollback(claim.trx).then(() => 0)
    return (async () => {
      try {
        const allSent = marks.length === claim.rows.length && marks.every((m) => m.verdict._tag === "Done")
        const statement = allSent
          ? q.markHeldSent({ ids: idsOf(claim.rows) })
          : q.markHeld({ verdicts: verdictsOf(marks) })
        const updated = affected(await claim.trx.executeQuery(statement))
        await claim.trx.commit().execute()
        return updated
      } catch (error) {
        await rollback(claim.trx)
        throw error
      }
    })()
  }

  /** Restarts the held transaction's idle clock; undefined: `token` holds no claim here. */
  const extend = (token: string): Promise<number> | undefined => {
    const claim = held.get(token)
    if (claim === undefined) return undefined
    return claim.trx.executeQuery(SELECT_1).then(() => claim.rows.length)
  }

  /** Hands back every claim still held (the store is closing: a pool waits for its clients). */
  const releaseAll = (): Promise<unknown> => Promise.all([...held.keys()].map(release))

  return { claim, mark, extend, release, releaseAll, holds: (token: string) => held.has(token) }
}
