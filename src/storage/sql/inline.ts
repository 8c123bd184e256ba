/**
 * A statement's text with its parameters written in as literals, for the
 * simple query protocol, which carries no parameters but takes several
 * statements in one round trip (the relay's held claims, `Outbox.transaction`'s
 * commit). Only what txbox's own statements bind: safe integers, text, NULL and
 * timestamps. Text goes as an escape string (`E'…'`, backslashes and quotes
 * doubled), read the same whatever `standard_conforming_strings` says.
 */
import type { CompiledQuery } from "kysely"

/**
 * Texts txbox compiled itself (`prepared.ts`), whose parameters `inlined` can write in: a driver
 * may then send one with other statements in a single round trip (node-postgres's BEGIN,
 * `storage/drivers/pg/beginRides.ts`). Bounded like the templates: a handful per store.
 */
const ownTexts = new Set<string>()

/** Marks `sql` as one of txbox's own texts (see `ownTexts`). */
export const markOwnText = (sql: string): void => {
  if (ownTexts.size < 1000) ownTexts.add(sql)
}

/** Whether `sql` is one of txbox's own texts, its parameters writable in with `inlinedText`. */
export const isOwnText = (sql: string): boolean => ownTexts.has(sql)

/** `sql` with `parameters` written in; throws for a value `inlined` cannot write (see there). */
export const inlinedText = (sql: string, parameters: ReadonlyArray<unknown>): string => {
  const { parts, slots } = templateOf(sql)
  let text = parts[0]!
  for (let i = 0; i < slots.length; i++) text += literalOf(parameters[slots[i]!], slots[i]!) + parts[i + 1]!
  return text
}

export const inlined = (statement: CompiledQuery): string => inlinedText(statement.sql, statement.parameters)

/** A statement's text split at its `$n` placeholders: the text between them, and each one's index. */
interface Template {
  readonly parts: ReadonlyArray<string>
  readonly slots: ReadonlyArray<number>
}

/** Split once per text (a relay runs the same few texts every cycle: scanning them was 2 % of its CPU). */
const templates = new Map<string, Template>()

const templateOf = (sql: string): Template => {
  let template = templates.get(sql)
  if (template === undefined) {
    const parts: string[] = []
    const slots: number[] = []
    let last = 0
    for (const match of sql.matchAll(/\$(\d+)/g)) {
      parts.push(sql.slice(last, match.index))
      slots.push(Number(match[1]) - 1)
      last = match.index + match[0].length
    }
    parts.push(sql.slice(last))
    template = { parts, slots }
    // Bounded: the texts are txbox's own, a handful per schema.
    if (templates.size < 1000) templates.set(sql, template)
  }
  return template
}

/** `value` as a literal; throws for what a literal cannot carry (a NUL byte) or txbox never binds. */
const literalOf = (value: unknown, index: number): string => {
  if (value === null) return "NULL"
  if (typeof value === "number" && Number.isSafeInteger(value)) return String(value)
  if (typeof value === "string") {
    if (value.includes("\0")) throw new Error("a NUL byte cannot be written into a statement")
    return `E'${value.replaceAll("\\", "\\\\").replaceAll("'", "''")}'`
  }
  if (value instanceof Date && Number.isFinite(value.getTime())) return `'${value.toISOString()}'`
  throw new Error(`cannot write parameter $${index + 1} (${typeof value}) into a statement`)
}
