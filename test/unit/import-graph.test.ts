/**
 * The layering of src/, read from the import lines themselves: the domain
 * (src/*.ts) and the core talk to storage and transport through src/ports
 * only, the core holds no SQL, contracts/ stands below the domain, and no
 * module imports itself back through others. Type-only imports count: they
 * are dependencies all the same.
 */
import { describe, expect, test } from "bun:test"
import { readdirSync, readFileSync } from "node:fs"
import { dirname, join, posix, relative } from "node:path"

const ROOT = join(import.meta.dir, "../..")
const SRC = join(ROOT, "src")

/** Entry points (package exports and the layers they assemble): they may import any layer. */
const ENTRIES = new Set([
  "src/index.ts",
  "src/pg.ts",
  "src/amqp.ts",
  "src/amqpTransport.ts",
  "src/testing.ts",
  "src/kysely.ts",
  "src/pglite.ts",
  "src/postgres-js.ts",
  "src/drivers.ts",
  "src/layerConfig.ts",
  // The producer's API: core/enqueue.ts given the SQL writer (the WriteOutbox port).
  "src/Outbox.ts",
])

/** The error vocabulary every layer speaks, ports included: not a domain module to the rules below. */
const SHARED = new Set(["src/Errors.ts"])

const listTs = (dir: string): string[] =>
  readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name)
    if (entry.isDirectory()) return listTs(path)
    return entry.name.endsWith(".ts") ? [path] : []
  })

const files = listTs(SRC).map((path) => relative(ROOT, path).split("\\").join("/"))
const sources = new Map(files.map((file) => [file, readFileSync(join(ROOT, file), "utf8")]))

// `import … from "x"`, `export … from "x"` (over several lines too), `import "x"` and `import("x")`.
const IMPORT_PATTERNS = [
  /^\s*(?:import|export)\s[^"'`;=()]*?\bfrom\s*["']([^"']+)["']/gm,
  /^\s*import\s*["']([^"']+)["']/gm,
  /\bimport\(\s*["']([^"']+)["']\s*\)/g,
]

/** The src files a file imports (relative specifiers only; packages are not src). */
const importsOf = (file: string): string[] => {
  const text = sources.get(file)!
  const found = new Set<string>()
  for (const pattern of IMPORT_PATTERNS) {
    for (const match of text.matchAll(pattern)) {
      const specifier = match[1]!
      if (!specifier.startsWith(".")) continue
      const target = posix.normalize(posix.join(dirname(file), specifier))
      if (!sources.has(target)) throw new Error(`${file} imports ${specifier}, not a src file`)
      found.add(target)
    }
  }
  return [...found]
}

const graph = new Map(files.map((file) => [file, importsOf(file)]))

const isDomain = (file: string) => /^src\/[^/]+\.ts$/.test(file) && !ENTRIES.has(file) && !SHARED.has(file)
const isImplementation = (file: string) => /^src\/(storage|transport)\//.test(file)

const edges = (from: (file: string) => boolean, to: (file: string) => boolean): string[] =>
  [...graph].flatMap(([file, targets]) =>
    from(file) ? targets.filter(to).map((target) => `${file} -> ${target}`) : [],
  )

/** The text of every string and template literal, comments left out. */
const stringLiterals = (text: string): string[] => {
  const literals: string[] = []
  const pattern =
    /\/\*[\s\S]*?\*\/|\/\/[^\n]*|"((?:[^"\\\n]|\\.)*)"|'((?:[^'\\\n]|\\.)*)'|`((?:[^`\\]|\\.)*)`/g
  for (const match of text.matchAll(pattern)) {
    const literal = match[1] ?? match[2] ?? match[3]
    if (literal !== undefined) literals.push(literal)
  }
  return literals
}

const SQL = /\b(INSERT\s+INTO|SELECT\s[\s\S]*\sFROM|UPDATE\s+\S+\s+SET|DELETE\s+FROM|ON\s+CONFLICT)\b/i
// A five-character SQLSTATE: class digits (or HV/XX/P0/F0) and three more, e.g. 40001, 57P01, 3D000.
const SQLSTATE = /^(?:[0-9][0-9A-Z]|HV|XX|P0|F0)[0-9A-Z]{3}$/

describe("import graph", () => {
  test("reads the imports of src", () => {
    expect(graph.get("src/index.ts")).toContain("src/Outbox.ts")
    expect(graph.get("src/amqp.ts")).toContain("src/transport/amqp/topology.ts")
  })

  test("the domain and the core reach storage and transport through the ports only", () => {
    expect(edges((file) => isDomain(file) || file.startsWith("src/core/"), isImplementation)).toEqual([])
  })

  test("the core holds no SQL text and no SQLSTATE", () => {
    const found = files
      .filter((file) => file.startsWith("src/core/"))
      .flatMap((file) =>
        stringLiterals(sources.get(file)!)
          .filter((literal) => SQL.test(literal) || SQLSTATE.test(literal))
          .map((literal) => `${file}: ${JSON.stringify(literal.slice(0, 60))}`),
      )
    expect(found).toEqual([])
  })

  test("contracts/ imports no domain module", () => {
    expect(edges((file) => file.startsWith("src/contracts/"), isDomain)).toEqual([])
  })

  test("no import cycle among src files", () => {
    const cycles: string[] = []
    const state = new Map<string, "open" | "done">()
    const stack: string[] = []
    const visit = (file: string) => {
      state.set(file, "open")
      stack.push(file)
      for (const target of graph.get(file)!) {
        const seen = state.get(target)
        if (seen === "open") cycles.push([...stack.slice(stack.indexOf(target)), target].join(" -> "))
        else if (seen === undefined) visit(target)
      }
      stack.pop()
      state.set(file, "done")
    }
    for (const file of [...files].sort()) if (!state.has(file)) visit(file)
    expect(cycles).toEqual([])
  })
})
