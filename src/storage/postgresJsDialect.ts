/**
 * A Kysely dialect over postgres.js: Kysely's PostgreSQL adapter, introspector
 * and compiler, and a driver that runs each Kysely connection on a reserved
 * postgres.js connection. It does what `kysely-postgres-js` 3 does, in the
 * Kysely API shared by 0.28 and 0.29 (that package's later majors need 0.29),
 * so `txbox/postgres-js` needs `postgres` alone. Like Kysely's own dialect
 * configs it declares only the methods it calls, and imports no driver.
 */
import {
  CompiledQuery,
  type DatabaseConnection,
  type DatabaseIntrospector,
  type Dialect,
  type DialectAdapter,
  type Driver,
  IdentifierNode,
  type Kysely,
  PostgresAdapter,
  PostgresIntrospector,
  PostgresQueryCompiler,
  type QueryCompiler,
  type QueryResult,
  RawNode,
  type TransactionSettings,
} from "kysely"

/** A reserved postgres.js connection, as far as the driver uses it. */
export interface PostgresJsReserved {
  unsafe(
    query: string,
    parameters?: ReadonlyArray<unknown>,
  ): PromiseLike<ArrayLike<unknown> & { readonly command?: string; readonly count?: number }> & {
    cursor?: (rows: number) => AsyncIterable<ReadonlyArray<unknown>>
  }
  release(): void
}

/** A postgres.js pool (`postgres(url)`), as far as the driver uses it. */
export interface PostgresJsPool {
  reserve(): Promise<PostgresJsReserved>
  end(): Promise<void>
}

export interface PostgresJsDialectConfig {
  readonly postgres: PostgresJsPool
}

// Kysely reports affected rows for these verbs only, as its PostgresDriver does.
const WRITES = new Set(["INSERT", "UPDATE", "DELETE", "MERGE"])

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

const savepointCommand = (command: string, name: string) =>
  RawNode.createWithChildren([RawNode.createWithSql(`${command} `), IdentifierNode.create(name)])

class PostgresJsDriver implements Driver {
  readonly #pool: PostgresJsPool

  constructor(config: PostgresJsDialectConfig) {
    this.#pool = config.postgres
  }

  async init(): Promise<void> {}

  async acquireConnection(): Promise<DatabaseConnection> {
    return new PostgresJsConnection(await this.#pool.reserve())
  }

  async beginTransaction(connection: DatabaseConnection, settings: TransactionSettings): Promise<void> {
    let statement = "begin"
    if (settings.isolationLevel || settings.accessMode) {
      statement = "start transaction"
      if (settings.isolationLevel) statement += ` isolation level ${settings.isolationLevel}`
      if (settings.accessMode) statement += ` ${settings.accessMode}`
    }
    await connection.executeQuery(CompiledQuery.raw(statement))
  }

  async commitTransaction(connection: DatabaseConnection): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw("commit"))
  }

  async rollbackTransaction(connection: DatabaseConnection): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw("rollback"))
  }

  async savepoint(
    connection: DatabaseConnection,
    name: string,
    compileQuery: QueryCompiler["compileQuery"],
  ): Promise<void> {
    await connection.executeQuery(compileQuery(savepointCommand("savepoint", name), { queryId: name }))
  }

  async rollbackToSavepoint(
    connection: DatabaseConnection,
    name: string,
    compileQuery: QueryCompiler["compileQuery"],
  ): Promise<void> {
    await connection.executeQuery(compileQuery(savepointCommand("rollback to", name), { queryId: name }))
  }

  async releaseSavepoint(
    connection: DatabaseConnection,
    name: string,
    compileQuery: QueryCompiler["compileQuery"],
  ): Promise<void> {
    await connection.executeQuery(compileQuery(savepointCommand("release", name), { queryId: name }))
  }

  async releaseConnection(connection: DatabaseConnection): Promise<void> {
    ;(connection as PostgresJsConnection).reserved.release()
  }

  async destroy(): Promise<void> {
    await this.#pool.end()
  }
}

/** `new Kysely({ dialect: new PostgresJsDialect({ postgres: postgres(url) }) })`. Destroying the Kysely ends the pool. */
export class PostgresJsDialect implements Dialect {
  readonly #config: PostgresJsDialectConfig

  constructor(config: PostgresJsDialectConfig) {
    this.#config = config
  }

  createDriver(): Driver {
    return new PostgresJsDriver(this.#config)
  }

  createQueryCompiler(): QueryCompiler {
    return new PostgresQueryCompiler()
  }

  createAdapter(): DialectAdapter {
    return new PostgresAdapter()
  }

  // biome-ignore lint/suspicious/noExplicitAny: the Dialect interface's own signature
  createIntrospector(db: Kysely<any>): DatabaseIntrospector {
    return new PostgresIntrospector(db)
  }
}
