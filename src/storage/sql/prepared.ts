/**
 * Statements compiled once per store and run many times (see `prepare`).
 */
import { type CompiledQuery, createQueryId, type Kysely } from "kysely"
import type { TxboxDatabase } from "../../ports/tables.ts"
import { markOwnText } from "./inline.ts"

/**
 * A statement compiled once and run many times. Kysely builds and compiles a
 * statement on every call, at many times the cost of the same text as a `sql`
 * template (bench/builder.ts; bench/README.md, "Design measurements: query builder").
 * The text depends on the schema only, so `compile` runs once with a distinct
 * placeholder per parameter; each call then binds its parameters to that text
 * in the placeholders' positions. Should the text hold a value that is not a
 * parameter (nothing here does), every call compiles afresh: slower, never wrong.
 */
export const prepare = <P extends Readonly<Record<string, unknown>>, R>(
  db: Kysely<TxboxDatabase>,
  compile: (db: Kysely<TxboxDatabase>, params: P) => CompiledQuery<R>,
  placeholders: NoInfer<P>,
): ((params: P) => CompiledQuery<R>) => {
  const template = compile(db, placeholders)
  const keys: ReadonlyArray<keyof P> = Object.keys(placeholders)
  const values: ReadonlyArray<unknown> = keys.map((key) => placeholders[key])
  const slots = template.parameters.map((value) => keys[values.indexOf(value)])
  const reusable = new Set(values).size === values.length && slots.every((key) => key !== undefined)
  if (!reusable) return (params) => compile(db, params)
  markOwnText(template.sql)
  return (params) => ({
    query: template.query,
    // A fresh id per run: plugins key per-query state on it.
    queryId: createQueryId(),
    sql: template.sql,
    parameters: slots.map((key) => params[key!]),
  })
}
