/**
 * A Kysely dialect for PGlite: Kysely's own PostgreSQL adapter, introspector
 * and query compiler (PGlite is PostgreSQL), plus a driver over PGlite's
 * `query`.
 *
 * PGlite is ONE session. Its own lock only keeps two queries from mixing on
 * the wire; it does not know about transactions opened with a plain BEGIN, so
 * a Kysely transaction on one fiber would swallow another fiber's statements
 * (they would commit or roll back with it). The driver therefore hands the
 * connection to one user at a time: `acquireConnection` waits for it,
 * `releaseConnection` passes it on, and a transaction holds it from BEGIN to
 * COMMIT. The lock belongs to the PGlite instance, so every Kysely built
 * with this dialect on the same instance shares it. Consequences for callers:
 * - inside a transaction, use the transaction (`trx`), never the outer
 *   `Kysely`: that would wait for the transaction, which waits for it;
 * - other code on the same instance (a raw `pglite.query`, another Kysely
 *   dialect) should run inside `sessionLock(pglite).run(...)`, or it may land
 *   inside a transaction that is open at that moment.
 *
 * Like Kysely's dialect configs, this one declares only the method it calls
 * (`query`), so the dialect module imports nothing from PGlite.
 */
import type { CompiledQuery, DatabaseConnection, Driver, QueryResult } from "kysely"
import { PostgresDialectBase, PostgresSessionDriver } from "../shared/postgresDialect.ts"

/** The part of a PGlite instance (or `PGliteWorker`) the driver uses. */
export interface PgliteClient {
  /** Runs one statement with its parameters on the session. */
  query<R>(
    query: string,
    params?: unknown[],
  ): Promise<{
    readonly rows: R[]
    /** The command tag's verb: "INSERT", "UPDATE", "SELECT", … */
    readonly command?: string
    /** The count from the command tag (rows changed by UPDATE, inserted by INSERT, …). */
    readonly rowCount?: number
    /** Cumulative over a multi-statement query; for one statement, the same as `rowCount` on writes. */
    readonly affectedRows?: number
  }>
}

/** What `PgliteDialect` runs on. */
export interface PgliteDialectConfig {
  /** The PGlite instance, or a function that opens it when Kysely first needs it. */
  readonly pglite: PgliteClient | (() => Promise<PgliteClient>)
}

/**
 * First come, first served. Promise-based rather than an Effect semaphore
 * because Kysely calls it from plain async code.
 */
export class Mutex {
  #locked = false
  readonly #waiters: Array<() => void> = []

  /** Resolves once the caller holds the lock; pair it with `unlock`. */
  lock(): Promise<void> {
    if (!this.#locked) {
      this.#locked = true
      return Promise.resolve()
    }
    return new Promise((resolve) => this.#waiters.push(resolve))
  }

  /** Hands the lock to the next waiter, if any (it stays locked), else frees it. */
  unlock(): void {
    const next = this.#waiters.shift()
    if (next) next()
    else this.#locked = false
  }

  /** Runs `f` while holding the lock: for work on the PGlite session that does not go through Kysely (LISTEN). */
  async run<T>(f: () => Promise<T>): Promise<T> {
    await this.lock()
    try {
      return await f()
    } finally {
      this.unlock()
    }
  }
}

const locks = new WeakMap<PgliteClient, Mutex>()

/** The lock of one PGlite session, shared by every dialect and store on that instance. */
export const sessionLock = (client: PgliteClient): Mutex => {
  let lock = locks.get(client)
  if (lock === undefined) {
    lock = new Mutex()
    locks.set(client, lock)
  }
  return lock
}

// Kysely reports affected rows for these verbs only, as its PostgresDriver does.
const WRITES = new Set(["INSERT", "UPDATE", "DELETE", "MERGE"])

class PgliteConnection implements DatabaseConnection {
  readonly client: PgliteClient

  constructor(client: PgliteClient) {
    this.client = client
  }

  async executeQuery<R>(compiledQuery: CompiledQuery): Promise<QueryResult<R>> {
    const result = await this.client.query<R>(compiledQuery.sql, [...compiledQuery.parameters])
    const count = result.rowCount ?? result.affectedRows
    return {
      rows: result.rows ?? [],
      ...(result.command !== undefined && WRITES.has(result.command) && count !== undefined
        ? { numAffectedRows: BigInt(count) }
        : {}),
    }
  }

  /** PGlite has no cursors over its API: the query runs whole, then its rows come out in chunks. */
  async *streamQuery<R>(
    compiledQuery: CompiledQuery,
    chunkSize = 100,
  ): AsyncIterableIterator<QueryResult<R>> {
    if (!Number.isInteger(chunkSize) || chunkSize <= 0)
      throw new Error("chunkSize must be a positive integer")
    const { rows } = await this.executeQuery<R>(compiledQuery)
    for (let i = 0; i < rows.length; i += chunkSize) yield { rows: rows.slice(i, i + chunkSize) }
  }
}

class PgliteDriver extends PostgresSessionDriver {
  readonly #config: PgliteDialectConfig
  #connection: PgliteConnection | undefined
  #mutex: Mutex | undefined
  #destroyed = false

  constructor(config: PgliteDialectConfig) {
    super()
    this.#config = config
  }

  async init(): Promise<void> {
    const { pglite } = this.#config
    const client = typeof pglite === "function" ? await pglite() : pglite
    this.#connection = new PgliteConnection(client)
    this.#mutex = sessionLock(client)
  }

  async acquireConnection(): Promise<DatabaseConnection> {
    const mutex = this.#mutex
    if (mutex === undefined || this.#connection === undefined)
      throw new Error("the PGlite driver is not initialized")
    await mutex.lock()
    if (this.#destroyed) {
      mutex.unlock()
      throw new Error("the PGlite driver has already been destroyed")
    }
    return this.#connection
  }

  async releaseConnection(_connection: DatabaseConnection): Promise<void> {
    this.#mutex?.unlock()
  }

  /** Waits for the current user of the session; this driver's later callers are refused. PGlite itself stays open. */
  async destroy(): Promise<void> {
    if (this.#destroyed) return
    this.#destroyed = true
    await this.#mutex?.run(async () => {})
  }
}

/** `new Kysely({ dialect: new PgliteDialect({ pglite }) })`. Destroying the Kysely leaves PGlite open. */
export class PgliteDialect extends PostgresDialectBase {
  readonly #config: PgliteDialectConfig

  /** A dialect over `config.pglite`; a function there is called when Kysely first needs the session. */
  constructor(config: PgliteDialectConfig) {
    super()
    this.#config = config
  }

  /** Kysely's hook: a driver that hands the one PGlite session to one user at a time (`sessionLock`). */
  createDriver(): Driver {
    return new PgliteDriver(this.#config)
  }
}
