/**
 * A transaction's BEGIN sent with its first statement, in one round trip, on txbox's own
 * node-postgres pool. Kysely opens a transaction with `begin` alone and waits for the answer
 * before the first statement: a round trip per transaction, and the idempotent inbox opens one per
 * share of deliveries (bench/cost.ts: a loopback write cost its sender 80–140 µs of CPU on the
 * 2-core machine). Here `begin` is answered at once and goes to the server with the statement that
 * follows, in one simple-protocol text, when that statement is one of txbox's own
 * (`inline.ts`'s `isOwnText`: its values written in as literals); any other goes as it is, with
 * the BEGIN written in front of it in the same write (`beginAhead.ts`). A transaction that sent nothing
 * commits or rolls back without a word to the server.
 */
import { inlinedText, isOwnText } from "../../sql/inline.ts"
import { beginAhead } from "./beginAhead.ts"

/** The part of a node-postgres client this needs: its `query`. */
export interface Queryable {
  query: (...args: ReadonlyArray<unknown>) => unknown
}

/** What node-postgres answers a statement with, as far as Kysely reads it. */
interface Answer {
  readonly command: string
  readonly rowCount: number | null
  readonly rows: ReadonlyArray<unknown>
}

const answered = (command: string): Promise<Answer> => Promise.resolve({ command, rowCount: null, rows: [] })

/**
 * The word a short statement with no values is (`query(text)` or `query(text, [])`): `begin`,
 * `commit`, `rollback`. A longer text is none of them, and is not copied to find out: every
 * statement on the pool passes here.
 */
export const bareWord = (args: ReadonlyArray<unknown>): string | undefined => {
  if (typeof args[0] !== "string" || args[0].length > 16) return undefined
  if (args.length > 2) return undefined
  if (args.length === 2 && !(Array.isArray(args[1]) && args[1].length === 0)) return undefined
  return args[0].trim().toLowerCase()
}

/** A multi-statement text's answer is one per statement: the caller asked for the last. */
const lastOf = (answer: unknown): unknown => (Array.isArray(answer) ? answer[answer.length - 1] : answer)

/**
 * Wraps `client.query` (after any other wrapper: it calls the one it finds). `reset` forgets a
 * BEGIN not yet sent: the pool calls it when it lends the client, so a transaction never
 * finished by its borrower cannot open the next one's.
 */
export const beginWithFirstStatement = (client: Queryable): { readonly reset: () => void } => {
  const query = client.query.bind(client)
  let pending = false
  client.query = (...args: ReadonlyArray<unknown>) => {
    const word = bareWord(args)
    if (!pending) {
      if (word !== "begin") return query(...args)
      pending = true
      return answered("BEGIN")
    }
    pending = false
    // Nothing ran in it: there is nothing to end.
    if (word === "commit") return answered("COMMIT")
    if (word === "rollback") return answered("ROLLBACK")
    const [text, values] = args
    if (typeof text === "string" && args.length <= 2 && isOwnText(text)) {
      let written: string | undefined
      try {
        written = inlinedText(text, Array.isArray(values) ? values : [])
      } catch {
        // A value no literal carries: the statement goes as it is, after a BEGIN of its own.
      }
      if (written !== undefined) return Promise.resolve(query(`BEGIN;\n${written}`)).then(lastOf)
    }
    // Any other statement goes as it is, the BEGIN in front of it in the same write
    // (beginAhead.ts); where that cannot be, queued on the connection ahead of it (a BEGIN that
    // fails leaves the connection broken, and the statement fails with it).
    if (beginAhead(client) === undefined) Promise.resolve(query("BEGIN")).catch(() => undefined)
    return query(...args)
  }
  return {
    reset: () => {
      pending = false
    },
  }
}
