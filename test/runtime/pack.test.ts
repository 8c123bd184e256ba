// The package as users get it: `npm pack`, the tarball installed into a fresh project, every subpath
// imported in Node 22 (dist/) and in Bun (the TypeScript sources), the .d.ts files type-checking a
// consumer, jsr.json in step with package.json, and a root entry that bundles for the browser.
// Run with `npm run test:pack` (its own bunfig: no servers needed, so no preload).
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { builtinModules } from "node:module"
import { tmpdir } from "node:os"
import { join } from "node:path"

const root = join(import.meta.dirname, "..", "..")
const readJson = (path: string) => JSON.parse(readFileSync(path, "utf8"))
const pkg = readJson(join(root, "package.json"))
const jsr = readJson(join(root, "jsr.json"))

// Node 22 from the `node` devDependency: Effect 4 needs Node ≥ 22.19, and a machine's own Node may
// be older (CI's is 20).
const node22 = join(root, "node_modules", ".bin", "node")
const tsc = join(root, "node_modules", ".bin", "tsc")

type Conditions = { types: string; bun: string; deno: string; default: string }
/** `"."` → `"txbox"`, `"./postgres"` → `"txbox/postgres"`. */
const specifier = (subpath: string) => (subpath === "." ? pkg.name : `${pkg.name}/${subpath.slice(2)}`)
const entries = Object.entries(pkg.exports as Record<string, Conditions | string>).filter(
  (entry): entry is [string, Conditions] => typeof entry[1] !== "string",
)
const subpaths = entries.map(([subpath]) => subpath)
const specifiers = subpaths.map(specifier)

const run = async (command: readonly string[], cwd: string): Promise<string> => {
  const child = Bun.spawn([...command], { cwd, stdout: "pipe", stderr: "pipe", env: process.env })
  const [stdout, stderr, code] = await Promise.all([
    new Response(child.stdout).text(),
    new Response(child.stderr).text(),
    child.exited,
  ])
  if (code !== 0) {
    const output = `${stdout}\n${stderr}`.trim().split("\n").slice(-30).join("\n")
    throw new Error(`${command.join(" ")} (in ${cwd}): exit ${code}\n${output}`)
  }
  return stdout
}

const readdirMigrations = () =>
  [...new Bun.Glob("*.sql").scanSync(join(root, "migrations"))].filter((f) => /^\d{4}_/.test(f))

let project: string
let tarballFiles: Set<string>

beforeAll(async () => {
  if (!existsSync(node22)) throw new Error(`${node22} is missing: run \`npm ci\` (the "node" devDependency)`)
  project = mkdtempSync(join(tmpdir(), "txbox-pack-"))
  // Built here rather than by `prepack`: with --ignore-scripts, `npm pack --json` prints only JSON.
  await run(["npm", "run", "build"], root)
  const packed = JSON.parse(
    await run(["npm", "pack", "--json", "--ignore-scripts", "--pack-destination", project], root),
  )
  tarballFiles = new Set(packed[0].files.map((file: { path: string }) => file.path))
  writeFileSync(
    join(project, "package.json"),
    JSON.stringify({ name: "txbox-pack-consumer", private: true, type: "module" }),
  )
  // --prefer-offline: the dependencies are in npm's cache from installing this repo.
  await run(
    ["npm", "install", "--no-audit", "--no-fund", "--prefer-offline", `./${packed[0].filename}`],
    project,
  )
})

afterAll(() => {
  if (project) rmSync(project, { recursive: true, force: true })
})

describe("package.json and jsr.json", () => {
  test("export the same subpaths, from the same source files", () => {
    const jsrExports = jsr.exports as Record<string, string>
    expect(Object.keys(jsrExports).sort()).toEqual([...subpaths].sort())
    for (const [subpath, conditions] of entries) {
      const source = jsrExports[subpath]!
      expect({ subpath, bun: conditions.bun, deno: conditions.deno }).toEqual({
        subpath,
        bun: source,
        deno: source,
      })
      // dist/ mirrors src/: the built file of an entry is its source's path with src → dist.
      const built = source.replace(/^\.\/src\//, "./dist/").replace(/\.ts$/, "")
      expect({ subpath, types: conditions.types, default: conditions.default }).toEqual({
        subpath,
        types: `${built}.d.ts`,
        default: `${built}.js`,
      })
    }
  })

  test("have the same name and version", () => {
    expect(jsr.name.split("/").at(-1)).toBe(pkg.name)
    expect(jsr.version).toBe(pkg.version)
    expect(jsr.license).toBe(pkg.license)
  })

  test("export every public entry, txbox/pglite included when its source exists", () => {
    const expected = [".", "./postgres", "./amqp", "./memory", "./promise"]
    if (existsSync(join(root, "src", "pglite.ts"))) expected.push("./pglite")
    expect([...subpaths].sort()).toEqual(expected.sort())
  })
})

describe("the tarball", () => {
  test("holds every export's .js, .d.ts and source, the migrations and the bin", () => {
    const wanted = entries.flatMap(([, c]) => [c.types, c.default, c.bun].map((path) => path.slice(2)))
    wanted.push(pkg.bin.txbox.replace(/^\.\//, ""), "package.json", "README.md")
    for (const file of readdirMigrations()) wanted.push(`migrations/${file}`)
    expect(wanted.filter((file) => !tarballFiles.has(file))).toEqual([])
  })

  test("has a .d.ts beside every .js in dist/, and no tests", () => {
    const js = [...tarballFiles].filter((f) => f.startsWith("dist/") && f.endsWith(".js"))
    expect(js.length).toBeGreaterThan(entries.length)
    expect(js.filter((f) => !tarballFiles.has(f.replace(/\.js$/, ".d.ts")))).toEqual([])
    expect([...tarballFiles].filter((f) => f.startsWith("test/") || f.includes(".test."))).toEqual([])
  })
})

/** Imports every subpath in the consumer project and reports where each resolved and what it exports. */
const importAll = async (runtime: string) => {
  const script = join(project, "import-all.mjs")
  writeFileSync(
    script,
    [
      `const out = {}`,
      `for (const s of ${JSON.stringify(specifiers)}) {`,
      `  const m = await import(s)`,
      `  out[s] = { resolved: import.meta.resolve(s), exports: Object.keys(m).sort() }`,
      `}`,
      `console.log(JSON.stringify(out))`,
    ].join("\n"),
  )
  return JSON.parse(await run([runtime, script], project)) as Record<
    string,
    { resolved: string; exports: string[] }
  >
}

describe("installed from the tarball", () => {
  test("every subpath imports in Node 22, from dist/, and Bun sees the same exports from src/", async () => {
    const version = (await run([node22, "--version"], project)).trim()
    expect(version).toMatch(/^v22\./)
    const [onNode, onBun] = await Promise.all([importAll(node22), importAll(process.execPath)])
    for (const [subpath, conditions] of entries) {
      const s = specifier(subpath)
      expect(onNode[s]!.resolved).toEndWith(`/node_modules/${pkg.name}/${conditions.default.slice(2)}`)
      expect(onBun[s]!.resolved).toEndWith(`/node_modules/${pkg.name}/${conditions.bun.slice(2)}`)
      expect(onNode[s]!.exports.length).toBeGreaterThan(0)
      expect({ s, exports: onBun[s]!.exports }).toEqual({ s, exports: onNode[s]!.exports })
    }
  })

  test("the .d.ts files give a consumer's TypeScript the real types", async () => {
    // Each @ts-expect-error is a probe: were an import unresolved (its types `any`), the line would
    // type-check and the directive itself would be the error.
    writeFileSync(
      join(project, "check.ts"),
      [
        `import * as v from "valibot"`,
        ...specifiers.map((s, i) => `import * as m${i} from "${s}"`),
        `export const all = [${specifiers.map((_, i) => `m${i}`).join(", ")}]`,
        `const Placed = m0.defineEvent({ type: "t", version: 1, schema: v.object({ n: v.number() }) })`,
        `// @ts-expect-error the payload is typed by the contract's schema`,
        `m0.Outbox.enqueue(undefined as never, Placed, { n: "not a number" })`,
        `const error = new m0.StoreError({ reason: "query", operation: "probe" })`,
        `// @ts-expect-error reason is a union of literals`,
        `export const reason: "nope" = error.reason`,
        `// @ts-expect-error the store's driver is one of two`,
        `${`m${specifiers.indexOf(`${pkg.name}/postgres`)}`}.PostgresStore.layer({ url: "", driver: "mysql" })`,
      ].join("\n"),
    )
    // A consumer's usual settings; skipLibCheck as most have it (amqplib's own types need @types/node).
    writeFileSync(
      join(project, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: {
          strict: true,
          target: "ES2022",
          module: "NodeNext",
          moduleResolution: "NodeNext",
          noEmit: true,
          skipLibCheck: true,
          types: [],
        },
        files: ["check.ts"],
      }),
    )
    await run([tsc, "-p", "."], project)
  })

  test("the txbox bin runs under Node 22", async () => {
    const bin = join(project, "node_modules", ".bin", "txbox")
    expect((await run([node22, bin, "--version"], project)).trim()).toEndWith(pkg.version)
  })
})

// Everything a bundle of the root entry must not contain: it is what runs `Outbox.enqueue` in any
// runtime Kysely runs in, drivers and Node APIs belong to the subpaths.
const nodeBuiltins = new Set(builtinModules)
const isBanned = (path: string) =>
  path.startsWith("node:") ||
  nodeBuiltins.has(path.split("/")[0]!) ||
  /^(postgres|pg|pg-[a-z-]+|amqplib|kysely-postgres-js|@electric-sql\/[a-z-]+)(\/|$)/.test(path)

/** Bundles `entry` for the browser, recording every banned specifier resolved on the way. */
const bundle = async (entry: string) => {
  const pulled: string[] = []
  const result = await Bun.build({
    entrypoints: [join(root, "src", entry)],
    target: "browser",
    throw: false,
    plugins: [
      {
        name: "record-banned-imports",
        setup(build) {
          build.onResolve({ filter: /.*/ }, (args) => {
            if (isBanned(args.path)) pulled.push(`${args.path} (from ${args.importer})`)
            return undefined
          })
        },
      },
    ],
  })
  return { pulled, result }
}

describe("the root entry", () => {
  test("bundles for the browser without a Node module or a driver", async () => {
    const { pulled, result } = await bundle("index.ts")
    expect(pulled).toEqual([])
    expect(result.logs.filter((log) => log.level === "error").map(String)).toEqual([])
    expect(result.success).toBe(true)
    const text = await result.outputs[0]!.text()
    const imports = [...text.matchAll(/\b(?:from|import|require)\s*\(?\s*["']([^"']+)["']/g)].map(
      (m) => m[1]!,
    )
    expect(imports.filter(isBanned)).toEqual([])
  })

  test("the same check catches the drivers in txbox/postgres", async () => {
    const { pulled } = await bundle("postgres.ts")
    const names = pulled.map((p) => p.split(" ")[0])
    expect(names).toContain("postgres")
    expect(names).toContain("pg")
  })
})
