/**
 * A statement's text and parameters as the `CompiledQuery` a driver runs, made cheaply: Kysely's
 * `CompiledQuery.raw` builds and freezes a new syntax node and the parameters on every call (about
 * a tenth of a producer's client CPU in bench/cost.ts, and 2–3 % of a relay's, whose claim and mark
 * it built every batch). The node is made once per text; a `pg` client reads only `sql` and
 * `parameters`, Kysely's drivers the same (no plugins run on these statements).
 */
import { type CompiledQuery, createQueryId, RawNode } from "kysely"

const rawNodes = new Map<string, RawNode>()

export const rawStatement = <R = unknown>(
  text: string,
  parameters: ReadonlyArray<unknown>,
): CompiledQuery<R> => {
  let query = rawNodes.get(text)
  if (query === undefined) {
    query = RawNode.createWithSql(text)
    // Bounded: the texts are txbox's own, a handful per schema.
    if (rawNodes.size < 1000) rawNodes.set(text, query)
  }
  return { sql: text, parameters, query, queryId: createQueryId() }
}
