/**
 * What txbox's two Kysely dialects (postgres.js, PGlite) share: PostgreSQL's
 * transaction and savepoint statements, and Kysely's PostgreSQL adapter,
 * compiler and introspector. Each dialect adds only how it gets and gives
 * back a connection.
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
  RawNode,
  type TransactionSettings,
} from "kysely"

const savepointCommand = (command: string, name: string) =>
  RawNode.createWithChildren([RawNode.createWithSql(`${command} `), IdentifierNode.create(name)])

/** A driver whose transactions are PostgreSQL's own statements on the acquired connection. */
export abstract class PostgresSessionDriver implements Driver {
  abstract init(): Promise<void>
  abstract acquireConnection(): Promise<DatabaseConnection>
  abstract releaseConnection(connection: DatabaseConnection): Promise<void>
  abstract destroy(): Promise<void>

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
}

/**
 * A dialect with Kysely's PostgreSQL compiler, adapter and introspector around the driver it creates.
 * @internal The shared base of `PostgresJsDialect` and `PgliteDialect`; not exported by any entry.
 */
export abstract class PostgresDialectBase implements Dialect {
  abstract createDriver(): Driver

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
