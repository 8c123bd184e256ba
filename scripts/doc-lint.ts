/**
 * `bun scripts/doc-lint.ts`: `deno doc --lint` over every export of jsr.json, the check behind
 * JSR's documentation score (every public symbol documented, every type it shows public).
 *
 * One kind of diagnostic is set aside, and counted: `private-type-ref` to a type declared in
 * another package (Effect's `Effect`, Kysely's `Kysely`, …). Deno raises it for any type that is
 * not exported by our own entries, although exporting another package's types is not ours to do
 * (denoland/deno#27364; its fix skips jsr:/https: modules but not npm ones). A referenced type is
 * "another package's" when the line deno shows as its declaration appears in no file of `src/`.
 * Every other diagnostic fails the check.
 */
import { spawnSync } from "node:child_process"
import { readdirSync, readFileSync } from "node:fs"
import { join } from "node:path"

const root = join(import.meta.dirname, "..")
const jsr = JSON.parse(readFileSync(join(root, "jsr.json"), "utf8")) as { exports: Record<string, string> }
const entries = Object.values(jsr.exports)

const deno = join(root, "node_modules", ".bin", "deno")
const run = spawnSync(deno, ["doc", "--lint", "--no-lock", ...entries], {
  cwd: root,
  env: { ...process.env, NO_COLOR: "1" },
  encoding: "utf8",
  maxBuffer: 64 * 1024 * 1024,
})
if (run.error !== undefined) {
  console.error(`doc-lint: could not run ${deno}: ${run.error.message}`)
  process.exit(2)
}
const output = `${run.stdout}\n${run.stderr}`

const sourceLines = new Set<string>()
const collect = (dir: string): void => {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name)
    if (entry.isDirectory()) collect(path)
    else if (entry.name.endsWith(".ts"))
      for (const line of readFileSync(path, "utf8").split("\n")) sourceLines.add(line.trim())
  }
}
collect(join(root, "src"))

// A diagnostic starts at "error[kind]" and runs to the next one (or the summary line).
const blocks = output.split(/\n(?=error\[)/).filter((block) => block.startsWith("error["))
const failing: Array<string> = []
let external = 0
for (const block of blocks) {
  const kind = /^error\[([a-z-]+)\]/.exec(block)?.[1]
  if (kind === "private-type-ref") {
    const lines = block.split("\n")
    const marker = lines.findIndex((line) => line.includes("this is the referenced type"))
    const declaration = marker > 0 ? lines[marker - 1]?.replace(/^\s*\d*\s*\|\s?/, "").trim() : undefined
    if (declaration !== undefined && declaration !== "" && !sourceLines.has(declaration)) {
      external++
      continue
    }
  }
  failing.push(block.replace(/\n\s*info: to ensure documentation is complete[^\n]*/g, "").trimEnd())
}

if (run.status !== 0 && blocks.length === 0) {
  console.error(output)
  console.error("doc-lint: deno doc --lint failed without diagnostics (see above)")
  process.exit(1)
}
if (failing.length > 0) {
  console.error(failing.join("\n\n"))
  console.error(`\ndoc-lint: ${failing.length} documentation lint error(s) over ${entries.length} entries`)
  process.exit(1)
}
console.log(
  `doc-lint: deno doc --lint passed over ${entries.length} entries (${external} references to other packages' types set aside: denoland/deno#27364)`,
)
