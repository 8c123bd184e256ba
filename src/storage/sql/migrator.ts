/**
 * Applies migrations/*.sql (embedded in migrations.generated.ts) to a schema.
 *
 * - Idempotent: applied versions are recorded in `<schema>.txbox_migrations`
 *   with a checksum; a changed file that was already applied is an error, not
 *   a silent skip.
 * - Safe when several processes migrate at once: everything runs in one
 *   transaction that first takes a transaction-scoped advisory lock (released
 *   at commit, so nothing session-level survives for PgBouncer to trip on);
 *   the second process waits, then finds nothing left to do.
 */

import { Effect } from "effect"
import { type Kysely, sql } from "kysely"
import { validateConfig } from "../../core/config.ts"
import { quoteIdent, validateSchemaName } from "../../core/identifier.ts"
import { type ConfigError, StoreError } from "../../Errors.ts"
import { migrations as embedded } from "./migrations.generated.ts"
import { splitStatements } from "./splitStatements.ts"

/** One schema migration: a file of migrations/*.sql, as `migrations` embeds it. */
export interface Migration {
  /** Its number, the file's 4-digit prefix: migrations apply in this order, each once. */
  readonly version: number
  /** The file name after the prefix, without `.sql`. */
  readonly name: string
  /** The SQL, run with `search_path` set to the schema; its checksum is recorded with the version. */
  readonly sql: string
}

/** What `migrate` did. */
export interface MigrateResult {
  /** The schema migrated. */
  readonly schema: string
  /** The migrations applied now, in order; empty when the schema was up to date. */
  readonly applied: ReadonlyArray<{ readonly version: number; readonly name: string }>
}

/** FNV-1a, hex: enough to notice an edited migration; no crypto module needed on the edge. */
export const checksum = (text: string): string => {
  let hash = 0x811c9dc5
  for (let i = 0; i < text.length; i++) {
    hash ^= text.charCodeAt(i)
    hash = Math.imul(hash, 0x01000193)
  }
  return (hash >>> 0).toString(16).padStart(8, "0")
}

// biome-ignore lint/suspicious/noExplicitAny: the migrator works on any database the caller has
type AnyDb = Kysely<any>

const LOCK_NAMESPACE = 0x7478626f // "txbo"

const lockAndPrepare = async (trx: AnyDb, schema: string) => {
  const ident = quoteIdent(schema)
  await sql`SELECT pg_advisory_xact_lock(${LOCK_NAMESPACE}, hashtext(${schema}))`.execute(trx)
  await sql.raw(`CREATE SCHEMA IF NOT EXISTS ${ident}`).execute(trx)
  await sql.raw(`SET LOCAL search_path TO ${ident}`).execute(trx)
  await sql
    .raw(
      `CREATE TABLE IF NOT EXISTS txbox_migrations (
        version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now())`,
    )
    .execute(trx)
  const rows = await sql<{
    version: number
    checksum: string
  }>`SELECT version, checksum FROM txbox_migrations`.execute(trx)
  return new Map(rows.rows.map((r) => [Number(r.version), r.checksum]))
}

const pendingOf = (all: ReadonlyArray<Migration>, applied: Map<number, string>): Migration[] => {
  const pending: Migration[] = []
  for (const m of all) {
    const sum = applied.get(m.version)
    if (sum === undefined) pending.push(m)
    else if (sum !== checksum(m.sql)) {
      throw new Error(`migration ${m.version}_${m.name} was changed after it was applied (checksum ${sum})`)
    }
  }
  return pending
}

const fail = (operation: string) => (cause: unknown) =>
  new StoreError({ reason: "migration", operation, cause })

/** Applies every pending migration; returns what it applied (empty when up to date). */
export const migrate = (
  db: AnyDb,
  options: { readonly schema?: string; readonly migrations?: ReadonlyArray<Migration> } = {},
): Effect.Effect<MigrateResult, StoreError | ConfigError> =>
  Effect.flatMap(schemaOf(options), (schema) =>
    Effect.tryPromise({
      try: async () => {
        const all = options.migrations ?? embedded
        return db.transaction().execute(async (trx) => {
          const pending = pendingOf(all, await lockAndPrepare(trx, schema))
          for (const m of pending) {
            for (const statement of splitStatements(m.sql)) {
              await sql.raw(statement).execute(trx)
            }
            await sql`INSERT INTO txbox_migrations (version, name, checksum) VALUES (${m.version}, ${m.name}, ${checksum(m.sql)})`.execute(
              trx,
            )
          }
          return { schema, applied: pending.map(({ version, name }) => ({ version, name })) }
        })
      },
      catch: fail("migrate"),
    }),
  ).pipe(Effect.withSpan("Migrator.migrate"))

/** The migrations `migrate` would apply, without applying them (for `txbox migrate --dry-run`). */
export const pending = (
  db: AnyDb,
  options: { readonly schema?: string; readonly migrations?: ReadonlyArray<Migration> } = {},
): Effect.Effect<ReadonlyArray<Migration>, StoreError | ConfigError> =>
  Effect.flatMap(schemaOf(options), (schema) =>
    Effect.tryPromise({
      try: async () => {
        const all = options.migrations ?? embedded
        // Rolled back on purpose: a dry run must not even create the schema.
        let found: Migration[] = []
        await db
          .transaction()
          .execute(async (trx) => {
            found = pendingOf(all, await lockAndPrepare(trx, schema))
            throw rollback
          })
          .catch((e) => {
            if (e !== rollback) throw e
          })
        return found
      },
      catch: fail("migrate --dry-run"),
    }),
  )

const rollback = Symbol("rollback")

const schemaOf = (options: { readonly schema?: string }) =>
  validateConfig(() => validateSchemaName(options.schema ?? "txbox"))
