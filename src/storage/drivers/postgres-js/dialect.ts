/**
 * A Kysely dialect over postgres.js: Kysely's PostgreSQL adapter, introspector
 * and compiler, and a driver that runs each Kysely connection on a reserved
 * postgres.js connection. It does what `kysely-postgres-js` 3 does, in the
 * Kysely API shared by 0.28 and 0.29 (that package's later majors need 0.29),
 * so `txbox/postgres-js` needs `postgres` alone. Like Kysely's own dialect
 * configs it declares only the methods it calls, and imports no driver.
 */
import type { CompiledQuery, DatabaseConnection, Driver, QueryResult } from "kysely"
import { PostgresDialectBase, PostgresSessionDriver } from "../shared/postgresDialect.ts"

/** A reserved postgres.js connection, as far as the driver uses it. */
export interface PostgresJsReserved {
  /** Runs one statement with its parameters; `cursor` streams its rows in chunks. */
  unsafe(
    query: string,
    parameters?: ReadonlyArray<unknown>,
  ): PromiseLike<ArrayLike<unknown> & { readonly command?: string; readonly count?: number }> & {
    cursor?: (rows: number) => AsyncIterable<ReadonlyArray<unknown>>
  }
  /** Hands the connection back to the pool. */
  release(): void
}

/** A postgres.js pool (`postgres(url)`), as far as the driver uses it. */
export interface PostgresJsPool {
  /** Takes a connection for one Kysely connection's lifetime (a transaction's statements all run on it). */
  reserve(): Promise<PostgresJsReserved>
  /** Closes the pool: called when the Kysely is destroyed, with a deadline in seconds for what still runs. */
  end(options?: { readonly timeout?: number }): Promise<void>
}

/** What `PostgresJsDialect` runs on. */
export interface PostgresJsDialectConfig {
  /** The postgres.js pool (`postgres(url)`); the dialect ends it when the Kysely is destroyed. */
  readonly postgres: PostgresJsPool
}

// Kysely reports affected rows for these verbs only, as its PostgresDriver does.
const WRITES = new Set(["INSERT", "UPDATE", "DELETE", "MERGE"])

// postgres.js 3.4's end() never settles when a reserved connection is handed back after it began
// (upstream #925), and a later end() with a deadline returns that same promise. So destroy waits for
// the connections Kysely still holds (a transaction finishing after a shutdown interrupted its
// caller), this long at most, then ends the pool with a deadline.
const RELEASE_WAIT_MS = 10_000
const END_DEADLINE_SECONDS = 2

class PostgresJsConnection implements DatabaseConnection {
  readonly reserved: PostgresJsReserved

  constructor(reserved: PostgresJsReserved) {
    this.reserved = reserved
  }

  async executeQuery<R>(compiledQuery: CompiledQuery): Promise<QueryResult<R>> {
    const result = await this.reserved.unsafe(compiledQuery.sql, [...compiledQuery.parameters])
    return {
      rows: Array.from(result) as R[],
      ...(result.command !== undefined && WRITES.has(result.command) && result.count !== undefined
        ? { numAffectedRows: BigInt(result.count) }
        : {}),
    }
  }

  async *streamQuery<R>(
    compiledQuery: CompiledQuery,
    chunkSize = 100,
  ): AsyncIterableIterator<QueryResult<R>> {
    if (!Number.isInteger(chunkSize) || chunkSize <= 0)
      throw new Error("chunkSize must be a positive integer")
    const query = this.reserved.unsafe(compiledQuery.sql, [...compiledQuery.parameters])
    if (typeof query.cursor !== "function") throw new Error("this postgres.js connection cannot stream")
    for await (const rows of query.cursor(chunkSize)) yield { rows: rows as R[] }
  }
}

class PostgresJsDriver extends PostgresSessionDriver {
  readonly #pool: PostgresJsPool
  /** Connections reserved or being reserved, not handed back yet. */
  #held = 0
  #destroying = false
  /** The pool was ended: a connection handed back now is not given to it (its socket may be gone). */
  #ended = false
  /** Called when the last held connection is handed back during a destroy. */
  #allReleased: (() => void) | undefined

  constructor(config: PostgresJsDialectConfig) {
    super()
    this.#pool = config.postgres
  }

  async init(): Promise<void> {}

  async acquireConnection(): Promise<DatabaseConnection> {
    if (this.#destroying) throw new Error("this Kysely was destroyed: its postgres.js pool is ending")
    this.#held++
    try {
      return new PostgresJsConnection(await this.#pool.reserve())
    } catch (error) {
      this.#handedBack()
      throw error
    }
  }

  async releaseConnection(connection: DatabaseConnection): Promise<void> {
    try {
      if (!this.#ended) (connection as PostgresJsConnection).reserved.release()
    } finally {
      this.#handedBack()
    }
  }

  #handedBack(): void {
    this.#held--
    if (this.#held === 0) this.#allReleased?.()
  }

  async destroy(): Promise<void> {
    this.#destroying = true
    if (this.#held > 0) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, RELEASE_WAIT_MS)
        this.#allReleased = () => {
          clearTimeout(timer)
          resolve()
        }
      })
    }
    try {
      await this.#pool.end({ timeout: END_DEADLINE_SECONDS })
    } finally {
      this.#ended = true
    }
  }
}

/** `new Kysely({ dialect: new PostgresJsDialect({ postgres: postgres(url) }) })`. Destroying the Kysely ends the pool. */
export class PostgresJsDialect extends PostgresDialectBase {
  readonly #config: PostgresJsDialectConfig

  /** A dialect over `config.postgres`; no connection is taken before the first query. */
  constructor(config: PostgresJsDialectConfig) {
    super()
    this.#config = config
  }

  /** Kysely's hook: a driver that runs each Kysely connection on a reserved postgres.js connection. */
  createDriver(): Driver {
    return new PostgresJsDriver(this.#config)
  }
}
