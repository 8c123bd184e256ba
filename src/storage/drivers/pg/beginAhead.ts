/**
 * A BEGIN written in front of the next statement a node-postgres client sends, in the same write
 * and round trip, whatever that statement is. `Outbox.transaction` on a pool opens the caller's
 * transaction this way: the business write carries the BEGIN, and a producer's transaction of one
 * write and one event is two round trips instead of three (bench/cost.ts: a loopback write cost
 * its sender ~100 µs of CPU on the 2-core machine).
 *
 * Nothing of the statement changes and nothing is written into it: in the extended protocol the
 * BEGIN goes as its own Parse/Bind/Execute ahead of the statement's messages, with no Sync between
 * (both are answered at the statement's Sync, the BEGIN first, as in one simple-protocol text); in
 * the simple protocol `BEGIN;` goes in front of the text. The BEGIN's CommandComplete is taken
 * away before the statement's query object sees it, so the statement answers as if it went alone.
 *
 * This reaches into node-postgres 8's client (its `connection`, `_activeQuery`), so it checks what
 * it needs first: `beginAhead` gives `undefined` for anything else, and the caller sends BEGIN alone.
 * A statement sent with no query object to answer it (which node-postgres never does) fails as it
 * is sent, and its transaction with it: never a statement outside the transaction.
 */

interface Connection {
  parse(query: { readonly text: string; readonly name?: string }): void
  bind(config: object): void
  execute(config: object): void
  query(text: string): void
  readonly parsedStatements?: Record<string, string | undefined>
}

/** A node-postgres query object (`Query`, or a submittable like pg-cursor's `Cursor`). */
interface Submitted {
  readonly name?: string
  handleCommandComplete(message: { readonly text?: string }, connection: unknown): void
}

interface PgClient {
  readonly connection: Connection
  readonly _activeQuery: Submitted | null | undefined
  readonly readyForQuery: boolean
  readonly pipeline?: boolean
}

const isPgClient = (client: object): client is PgClient => {
  const c = client as Partial<PgClient>
  const conn = c.connection as Partial<Connection> | undefined
  return (
    conn !== undefined &&
    conn !== null &&
    typeof conn.parse === "function" &&
    typeof conn.bind === "function" &&
    typeof conn.execute === "function" &&
    typeof conn.query === "function" &&
    "_activeQuery" in c &&
    c.pipeline !== true
  )
}

/** A connection's hooks: put on it once, for good (taking them off again would change its shape on every transaction). */
interface Hooks {
  /** The client whose next statement carries a BEGIN; undefined while none waits. */
  waiting: PgClient | undefined
}

const hooked = new WeakMap<Connection, Hooks>()

const hooksOf = (conn: Connection): Hooks => {
  const known = hooked.get(conn)
  if (known !== undefined) return known
  const hooks: Hooks = { waiting: undefined }
  const { parse, bind, execute, query } = conn
  /** The query object the statement answers: the BEGIN's answer is taken from it first. */
  const expectBegin = (client: PgClient) => {
    hooks.waiting = undefined
    const submitted = client._activeQuery
    if (!submitted || typeof submitted.handleCommandComplete !== "function")
      throw new Error("txbox: a statement with no query to answer it; BEGIN cannot go ahead of it")
    takeBeginAnswer(submitted, conn)
  }
  /** The BEGIN's own Parse/Bind/Execute, when one waits, ahead of the statement's first message. */
  const beginFirst = () => {
    const client = hooks.waiting
    if (client === undefined) return
    expectBegin(client)
    parse.call(conn, { text: "BEGIN" })
    bind.call(conn, {})
    execute.call(conn, {})
  }
  conn.parse = (statement) => {
    beginFirst()
    parse.call(conn, statement)
  }
  // A named statement parsed before on this connection is bound without a Parse.
  conn.bind = (config) => {
    beginFirst()
    bind.call(conn, config)
  }
  conn.query = (text) => {
    const client = hooks.waiting
    if (client === undefined) return query.call(conn, text)
    expectBegin(client)
    query.call(conn, `BEGIN;\n${text}`)
  }
  hooked.set(conn, hooks)
  return hooks
}

/** A BEGIN waiting for the client's next statement. */
export interface BeginAhead {
  /** Whether it still waits: nothing was sent since. */
  readonly pending: () => boolean
  /** Forgets it, if it still waits: the next statement goes alone. */
  readonly cancel: () => void
}

/**
 * Makes the next statement `client` sends carry a BEGIN. `undefined` when `client` is not an idle
 * node-postgres client (not one, in pipeline mode, or busy with a statement): send BEGIN alone then.
 */
export const beginAhead = (client: object): BeginAhead | undefined => {
  if (!isPgClient(client) || client._activeQuery || client.readyForQuery !== true) return undefined
  const hooks = hooksOf(client.connection)
  hooks.waiting = client
  return {
    pending: () => hooks.waiting === client,
    cancel: () => {
      if (hooks.waiting === client) hooks.waiting = undefined
    },
  }
}

/**
 * The first CommandComplete `submitted` gets is the BEGIN's: it never sees it. The BEGIN's
 * ParseComplete came before it and node-postgres took it for a named statement's: what it then
 * noted of that name is put back (the statement's own ParseComplete, or error, follows).
 */
const takeBeginAnswer = (submitted: Submitted, conn: Connection) => {
  const name = submitted.name
  const parsedBefore = name ? conn.parsedStatements?.[name] : undefined
  const handle = submitted.handleCommandComplete
  let first = true
  // Left in place after (the query object lives for one statement): deleting it would reshape it.
  submitted.handleCommandComplete = function (this: Submitted, message, connection) {
    if (first) {
      first = false
      if (message.text === "BEGIN") {
        if (name && conn.parsedStatements) {
          if (parsedBefore === undefined) delete conn.parsedStatements[name]
          else conn.parsedStatements[name] = parsedBefore
        }
        return
      }
    }
    handle.call(this, message, connection)
  }
}
