/** `txbox migrate [--dry-run]`: applies migrations/*.sql to the schema, or shows what it would apply. */
import { Effect } from "effect"
import { Command, Flag } from "effect/cli"
import { migrate, pending } from "../storage/sql/migrator.ts"
import { connectionFlags, jsonFlag, withDatabase } from "./options.ts"
import { print, printJson } from "./output.ts"

const name = (m: { readonly version: number; readonly name: string }) =>
  `${String(m.version).padStart(4, "0")}_${m.name}`

export const command = Command.make(
  "migrate",
  {
    connection: connectionFlags,
    dryRun: Flag.Boolean("dry-run").pipe(
      Flag.withDescription("print the SQL of the pending migrations and apply nothing"),
      Flag.withDefault(false),
    ),
    json: jsonFlag,
  },
  ({ connection, dryRun, json }) =>
    withDatabase(connection, { requireTables: false }, (db) =>
      dryRun
        ? Effect.gen(function* () {
            const list = yield* pending(db.db, { schema: db.schema })
            if (json) {
              return yield* printJson({
                schema: db.schema,
                dry_run: true,
                pending: list.map((m) => ({ version: m.version, name: m.name, sql: m.sql })),
              })
            }
            if (list.length === 0) return yield* print(`schema ${db.schema} is up to date: nothing to apply`)
            // The files name no schema: migrate runs them with search_path set to it.
            yield* print(
              `-- ${list.length} pending migration${list.length === 1 ? "" : "s"} for schema ${db.schema} ` +
                `(applied with search_path = ${db.schema}; nothing was changed)`,
            )
            for (const m of list) yield* print(`\n-- ${name(m)}\n${m.sql.trimEnd()}`)
          })
        : Effect.gen(function* () {
            const result = yield* migrate(db.db, { schema: db.schema })
            // No day partitions: those come with retention (the relay's and the inbox's, or
            // `txbox partitions create`), which drops them again; kept forever, their number would
            // slow the planning of every claim. Rows go to the default partitions meanwhile.
            if (json) return yield* printJson({ schema: result.schema, applied: result.applied })
            if (result.applied.length === 0) {
              return yield* print(`schema ${result.schema} is up to date: nothing to apply`)
            }
            for (const m of result.applied) yield* print(`applied ${name(m)}`)
            yield* print(
              `schema ${result.schema}: ${result.applied.length} migration${result.applied.length === 1 ? "" : "s"} applied`,
            )
          }),
    ),
).pipe(
  Command.withDescription("Apply txbox's migrations to the schema (idempotent; safe from several processes)"),
  Command.withShortDescription("Create or upgrade txbox's tables"),
)
