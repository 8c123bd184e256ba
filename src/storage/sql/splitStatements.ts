/**
 * Splits a migration file into statements. Drivers differ on multi-statement
 * text (postgres.js and PGlite run parameterless queries through the extended
 * protocol, which takes one statement), so the migrator sends one at a time.
 * Understands '…' strings, "…" identifiers, $tag$…$tag$ bodies and comments.
 */
export const splitStatements = (sql: string): string[] => {
  const statements: string[] = []
  let start = 0
  let i = 0
  const push = (end: number) => {
    const text = sql.slice(start, end).trim()
    if (stripComments(text).trim().length > 0) statements.push(text)
  }
  while (i < sql.length) {
    const ch = sql[i]!
    const next = sql[i + 1]
    if (ch === "-" && next === "-") {
      const nl = sql.indexOf("\n", i)
      i = nl === -1 ? sql.length : nl + 1
    } else if (ch === "/" && next === "*") {
      const end = sql.indexOf("*/", i + 2)
      i = end === -1 ? sql.length : end + 2
    } else if (ch === "'" || ch === '"') {
      let j = i + 1
      while (j < sql.length) {
        if (sql[j] === ch) {
          if (sql[j + 1] === ch) j += 2
          else break
        } else j++
      }
      i = j + 1
    } else if (ch === "$") {
      const tag = /^\$[A-Za-z_]*\$/.exec(sql.slice(i))
      if (tag) {
        const end = sql.indexOf(tag[0], i + tag[0].length)
        i = end === -1 ? sql.length : end + tag[0].length
      } else i++
    } else if (ch === ";") {
      push(i)
      start = i + 1
      i++
    } else i++
  }
  push(sql.length)
  return statements
}

const stripComments = (text: string): string => text.replace(/--[^\n]*/g, "").replace(/\/\*[\s\S]*?\*\//g, "")
