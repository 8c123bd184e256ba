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
import { affected } from "./fragments.ts"
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
  /** Run after the claim in the same round trip where that costs none (sessions): its rows come back as `after`. */
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
}

/** Opens a transaction, runs `claim` in it (and `after`, where free); with no rows, the transaction is over already. */
type Begin = <Row>(
  claim: CompiledQuery<Row>,
  after?: CompiledQuery,
) => Promise<{ readonly rows: ReadonlyArray<Row>; readonly tx?: Tx; readonly after?: ReadonlyArray<unknown> }>

/**
 * A statement's text with its parameters written in as literals, for the simple query protocol
 * (which carries none). Only what txbox's held-claim statements bind: integers and text. Text goes
 * as an escape string (`E'…'`, backslashes and quotes doubled), read the same whatever
 * `standard_conforming_strings` says.
 */
export const inlined = (statement: CompiledQuery): string => {
  const { parts, slots } = templateOf(statement.sql)
  let text = parts[0]!
  for (let i = 0; i < slots.length; i++)
    text += literalOf(statement.parameters[slots[i]!], slots[i]!) + parts[i + 1]!
  return text
}

/** A statement's text split at its `$n` placeholders: the text between them, and each one's index. */
interface Template {
  readonly parts: ReadonlyArray<string>
  readonly slots: ReadonlyArray<number>
}

/** Split once per text (a relay runs the same few texts every cycle: scanning them was 2 % of its CPU). */
const templates = new Map<string, Template>()

const templateOf = (sql: string): Template => {
  let template = templates.get(sql)
  if (template === undefined) {
    const parts: string[] = []
    const slots: number[] = []
    let last = 0
    for (const match of sql.matchAll(/\$(\d+)/g)) {
      parts.push(sql.slice(last, match.index))
      slots.push(Number(match[1]) - 1)
      last = match.index + match[0].length
    }
    parts.push(sql.slice(last))
    template = { parts, slots }
    // Bounded: the texts are txbox's own, a handful per schema.
    if (templates.size < 1000) templates.set(sql, template)
  }
  return template
}

const literalOf = (value: unknown, index: number): string => {
  if (typeof value === "number" && Number.isSafeInteger(value)) return String(value)
  if (typeof value === "string") {
    if (value.includes("\0")) throw new Error("a NUL byte cannot be written into a statement")
    return `E'${value.replaceAll("\\", "\\\\").replaceAll("'", "''")}'`
  }
  throw new Error(`cannot write parameter $${index + 1} (${typeof value}) into a statement`)
}

const SELECT_1 = CompiledQuery.raw("SELECT 1")

/** Through sessions: BEGIN with the claim, COMMIT with the mark, one round trip each. */
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
    const rollback = () =>
      session.script("ROLLBACK").then(
        () => end(),
        (error: Error) => end(error),
      )
    try {
      const answers = await session.script(
        afterClaim === undefined
          ? `BEGIN;${inlined(claim)}`
          : `BEGIN;${inlined(claim)};${inlined(afterClaim)}`,
      )
      const rows = (answers[1]?.rows ?? []) as ReadonlyArray<Row>
      const after = afterClaim === undefined ? undefined : (answers[2]?.rows ?? [])
      if (rows.length === 0) {
        await rollback()
        return after === undefined ? { rows } : { rows, after }
      }
      const tx: Tx = {
        finish: async (statement) => {
          try {
            const answers = await session.script(`${inlined(statement)};COMMIT`)
            end()
            return answers[0]?.rowCount ?? 0
          } catch (error) {
            // The transaction is aborted and still open on the connection: close the connection.
            end(error instanceof Error ? error : new Error(String(error)))
            throw error
          }
        },
        touch: () => session.script("SELECT 1").then(() => undefined),
        rollback,
      }
      return after === undefined ? { rows, tx } : { rows, tx, after }
    } catch (error) {
      end(error instanceof Error ? error : new Error(String(error)))
      throw error
    }
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
            const updated = affected(await trx.executeQuery(statement))
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

export const makeHeldClaims = <Row extends { readonly id: string }>(
  db: Kysely<TxboxDatabase>,
  session: (() => Promise<DatabaseSession>) | undefined,
  q: HeldStatements<Row>,
) => {
  const begin = session === undefined ? kyselyBegin(db) : sessionBegin(session)
  const held = new Map<string, { readonly tx: Tx; readonly rows: ReadonlyArray<Row> }>()
  const idsOf = (rows: ReadonlyArray<{ readonly id: string }>) => JSON.stringify(rows.map((row) => row.id))

  /** Hands a held claim's rows back (its transaction rolled back); undefined: `token` holds none. */
  const release = (token: string): Promise<number> | undefined => {
    const claim = held.get(token)
    if (claim === undefined) return undefined
    held.delete(token)
    return claim.tx.rollback().then(() => claim.rows.length)
  }

  /**
   * Up to `limit` due rows, held for `token` until its mark or release; none: nothing left open.
   * With them, the rows of `afterClaim` when it ran.
   */
  const claim = async (
    token: string,
    limit: number,
    leaseMs: number,
    sinceMs: number,
    shard: ShardParams | undefined,
  ) => {
    const answer = await begin(
      q.claimHeld({
        limit,
        idleMs: `${Math.ceil(leaseMs)}ms`,
        sinceMs,
        ...(shard === undefined ? {} : { shard }),
      }),
      q.afterClaim,
    )
    if (answer.tx !== undefined) held.set(token, { tx: answer.tx, rows: answer.rows })
    return answer
  }

  /**
   * Records `marks` and commits; undefined: `token` holds no claim here. A failure rolls back:
   * nothing recorded, the rows come due again as they were (published twice at worst).
   */
  const mark = (token: string, marks: ReadonlyArray<OutboxMark>): Promise<number> | undefined => {
    const claim = held.get(token)
    if (claim === undefined) return undefined
    held.delete(token)
    if (marks.length === 0) return claim.tx.rollback().then(() => 0)
    const allSent = marks.length === claim.rows.length && marks.every((m) => m.verdict._tag === "Done")
    return claim.tx.finish(
      allSent
        ? q.markHeldSent({ ids: idsOf(claim.rows), token })
        : q.markHeld({ verdicts: q.verdictsOf(marks) }),
    )
  }

  /** Restarts the held transaction's idle clock; undefined: `token` holds no claim here. */
  const extend = (token: string): Promise<number> | undefined => {
    const claim = held.get(token)
    if (claim === undefined) return undefined
    return claim.tx.touch().then(() => claim.rows.length)
  }

  /** Hands back every claim still held (the store is closing: a pool waits for its clients). */
  const releaseAll = (): Promise<unknown> => Promise.all([...held.keys()].map(release))

  return { claim, mark, extend, release, releaseAll, holds: (token: string) => held.has(token) }
}
