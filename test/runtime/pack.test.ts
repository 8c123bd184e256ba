// The package as users get it. `npm pack`, then one fresh project per runtime, each installing the
// tarball the way a user of that runtime would, with only the peers and the driver its path uses,
// and running that path end to end on real PostgreSQL and RabbitMQ:
// - Node 22 (npm install; dist/): Kysely 0.29, pg, amqplib. `npm ls kysely effect` shows one copy
//   of each; the app's Kysely 0.29 `trx` type-checks against `Outbox.enqueue` and `migrate`.
// - Bun (bun add; the TypeScript sources through the "bun" condition): Kysely 0.28, postgres.js.
// - Deno from npm (`deno add npm:txbox`, from a local registry that serves the tarball and passes
//   everything else to npm's), imported by name: dist/ and its .d.ts.
// - Deno from JSR: no JSR registry is reachable here, so the files `deno publish` would upload
//   (jsr.json's `publish.include`) are copied into the project and imported by the published name
//   through an import map built from jsr.json's exports, bare specifiers mapped to `npm:` as
//   `deno publish` rewrites them.
// - PGlite (Node, Kysely 0.29's own PGlite dialect, the memory broker, no server driver).
// - A Cloudflare Worker in workerd (Miniflare): `Outbox.enqueue` on postgres.js over Workers TCP
//   sockets, bundled as wrangler would; the relay and the inbox in Node publish and apply it.
// A missing driver is a ConfigError naming the package to install. Each project's installed size is
// printed. Run with `npm run test:pack` (services from scripts/with-services.ts).
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { createHash } from "node:crypto"
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { builtinModules } from "node:module"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"

const root = join(import.meta.dirname, "..", "..")
const readJson = (path: string) => JSON.parse(readFileSync(path, "utf8"))
const pkg = readJson(join(root, "package.json"))
const jsr = readJson(join(root, "jsr.json"))

// Node 22, Deno and tsc from the devDependencies: Effect 4 needs Node ≥ 22.19, and a machine's own
// Node may be older (CI's is 20).
const bin = (name: string) => join(root, "node_modules", ".bin", name)
const node22 = bin("node")
const deno = bin("deno")
const tsc = bin("tsc")

type Conditions = { types: string; bun: string; default: string }
/** `"."` → `"txbox"`, `"./pg"` → `"txbox/pg"`. */
const specifier = (subpath: string) => (subpath === "." ? pkg.name : `${pkg.name}/${subpath.slice(2)}`)
const entries = Object.entries(pkg.exports as Record<string, Conditions | string>).filter(
  (entry): entry is [string, Conditions] => typeof entry[1] !== "string",
)
const subpaths = entries.map(([subpath]) => subpath)
const specifiers = subpaths.map(specifier)

const services = () => {
  const database = process.env.TXBOX_TEST_DATABASE_URL
  const amqp = process.env.TXBOX_TEST_AMQP_URL
  if (!database || !amqp) {
    throw new Error("TXBOX_TEST_DATABASE_URL / TXBOX_TEST_AMQP_URL are not set: run `npm run test:pack`")
  }
  return { TXBOX_TEST_DATABASE_URL: database, TXBOX_TEST_AMQP_URL: amqp }
}

const run = async (
  command: readonly string[],
  cwd: string,
  env: Record<string, string | undefined> = {},
): Promise<string> => {
  const child = Bun.spawn([...command], {
    cwd,
    stdout: "pipe",
    stderr: "pipe",
    env: { ...process.env, ...env },
  })
  const [stdout, stderr, code] = await Promise.all([
    new Response(child.stdout).text(),
    new Response(child.stderr).text(),
    child.exited,
  ])
  if (code !== 0) {
    const output = `${stdout}\n${stderr}`.trim().split("\n").slice(-40).join("\n")
    throw new Error(`${command.join(" ")} (in ${cwd}): exit ${code}\n${output}`)
  }
  return stdout
}

/** Like `run`, for a command expected to fail: its exit code and output. */
const runFailing = async (command: readonly string[], cwd: string) => {
  const child = Bun.spawn([...command], { cwd, stdout: "pipe", stderr: "pipe" })
  const [stdout, stderr, code] = await Promise.all([
    new Response(child.stdout).text(),
    new Response(child.stderr).text(),
    child.exited,
  ])
  return { code, output: `${stdout}${stderr}` }
}

const readdirMigrations = () =>
  [...new Bun.Glob("*.sql").scanSync(join(root, "migrations"))].filter((f) => /^\d{4}_/.test(f))

/** Kilobytes under `dir`, as `du -sk` counts them. */
const sizeKb = async (dir: string) => Number((await run(["du", "-sk", dir], root)).split(/\s/)[0])

let work: string
let tarball: string
let tarballFiles: Set<string>
const sizes: Record<string, string> = {}

/** A fresh directory for one project, with the shared smoke scenario beside its entry file. */
const freshProject = (name: string, files: Record<string, string>) => {
  const dir = join(work, name)
  mkdirSync(dir, { recursive: true })
  cpSync(join(import.meta.dirname, "smoke.mjs"), join(dir, "smoke.mjs"))
  for (const [file, text] of Object.entries(files)) writeFileSync(join(dir, file), text)
  return dir
}

/** `npm install` of the packed tarball and `packages` into `dir`, as a user of that project would. */
const npmInstall = (dir: string, packages: ReadonlyArray<string>) =>
  // --prefer-offline: most packages are in npm's cache from installing this repo.
  run(["npm", "install", "--no-audit", "--no-fund", "--prefer-offline", tarball, ...packages], dir)

const recordSize = async (name: string, dir: string, installed: string) => {
  const kb = await sizeKb(join(dir, installed))
  sizes[name] = `${(kb / 1024).toFixed(1)} MB`
  console.log(`[pack] ${name}: ${installed} is ${sizes[name]}`)
}

beforeAll(async () => {
  if (!existsSync(node22)) throw new Error(`${node22} is missing: run \`npm ci\` (the "node" devDependency)`)
  work = mkdtempSync(join(tmpdir(), "txbox-pack-"))
  // Built here rather than by `prepack`: with --ignore-scripts, `npm pack --json` prints only JSON.
  await run(["npm", "run", "build"], root)
  const packed = JSON.parse(
    await run(["npm", "pack", "--json", "--ignore-scripts", "--pack-destination", work], root),
  )
  tarball = join(work, packed[0].filename)
  tarballFiles = new Set(packed[0].files.map((file: { path: string }) => file.path))
})

afterAll(() => {
  if (Object.keys(sizes).length > 0) console.log(`[pack] installed sizes: ${JSON.stringify(sizes)}`)
  if (work) rmSync(work, { recursive: true, force: true })
})

describe("package.json and jsr.json", () => {
  test("export the same subpaths, from the same source files", () => {
    const jsrExports = jsr.exports as Record<string, string>
    expect(Object.keys(jsrExports).sort()).toEqual([...subpaths].sort())
    for (const [subpath, conditions] of entries) {
      const source = jsrExports[subpath]!
      expect({ subpath, bun: conditions.bun }).toEqual({ subpath, bun: source })
      // No "deno" condition: Deno refuses to type-strip .ts inside node_modules, so it gets dist/.
      expect({ subpath, conditions: Object.keys(conditions) }).toEqual({
        subpath,
        conditions: ["types", "bun", "default"],
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

  test("have the same name, version and license; the license file and the repository are there", () => {
    expect(jsr.name.split("/").at(-1)).toBe(pkg.name)
    expect(jsr.version).toBe(pkg.version)
    expect(jsr.license).toBe(pkg.license)
    expect(readFileSync(join(root, "LICENSE"), "utf8")).toStartWith(`${pkg.license} License`)
    expect(jsr.publish.include).toContain("LICENSE")
    expect(pkg.repository.url).toMatch(/^git\+https:\/\//)
    expect(pkg.homepage).toMatch(/^https:\/\//)
  })

  test("export every public entry: one per driver and the driver-free ones", () => {
    expect([...subpaths].sort()).toEqual(
      [".", "./pg", "./postgres-js", "./pglite", "./kysely", "./amqp", "./promise", "./testing"].sort(),
    )
  })

  test("effect and kysely are peers (Kysely 0.28 and 0.29); drivers optional peers; nothing is a dependency", () => {
    expect(pkg.dependencies).toBeUndefined()
    expect(pkg.peerDependencies.effect).toBe("^4.1.0")
    expect(pkg.peerDependencies.kysely).toBe("^0.28.18 || ^0.29.0")
    const drivers = ["pg", "postgres", "@electric-sql/pglite", "amqplib"]
    for (const driver of drivers) {
      expect({ driver, optional: pkg.peerDependenciesMeta[driver]?.optional }).toEqual({
        driver,
        optional: true,
      })
    }
    expect(Object.keys(pkg.peerDependencies).sort()).toEqual([...drivers, "effect", "kysely"].sort())
  })
})

describe("the tarball", () => {
  test("holds every export's .js, .d.ts and source, the migrations, the bin and the license", () => {
    const wanted = entries.flatMap(([, c]) => [c.types, c.default, c.bun].map((path) => path.slice(2)))
    wanted.push(pkg.bin.txbox.replace(/^\.\//, ""), "package.json", "README.md", "LICENSE")
    for (const file of readdirMigrations()) wanted.push(`migrations/${file}`)
    // The README links its docs pages: they ship with it, or the links break on npm.
    for (const file of new Bun.Glob("*.md").scanSync(join(root, "docs"))) wanted.push(`docs/${file}`)
    expect(wanted.filter((file) => !tarballFiles.has(file))).toEqual([])
  })

  test("has a .d.ts beside every .js in dist/, and no tests", () => {
    const js = [...tarballFiles].filter((f) => f.startsWith("dist/") && f.endsWith(".js"))
    expect(js.length).toBeGreaterThan(entries.length)
    expect(js.filter((f) => !tarballFiles.has(f.replace(/\.js$/, ".d.ts")))).toEqual([])
    expect([...tarballFiles].filter((f) => f.startsWith("test/") || f.includes(".test."))).toEqual([])
  })
})

// ---------------------------------------------------------------------------------------------
// Node: npm install, Kysely 0.29, node-postgres and amqplib.

const nodeMain = `
import { test } from "node:test"
import pg from "pg"
import * as txbox from "txbox"
import * as amqp from "txbox/amqp"
import { KyselyStore, migrate } from "txbox/kysely"
import { PgStore } from "txbox/pg"
import * as promise from "txbox/promise"
import { pgApp, smokeEffect, smokePromise } from "./smoke.mjs"

const modules = { txbox, amqp, promise, migrate }
test("txbox/pg: enqueue → relay → inbox (Effect API)", () =>
  smokeEffect(modules, pgApp(pg), ({ url }) => PgStore.layer({ url, poolSize: 2 })))
test("txbox/pg: enqueue → relay → inbox (Promise facade)", () =>
  smokePromise(modules, pgApp(pg), ({ url }) => PgStore.layer({ url, poolSize: 2 })))
test("txbox/kysely over the app's own Kysely: enqueue → relay → inbox", () =>
  smokeEffect(modules, pgApp(pg), ({ db }) => KyselyStore.layer({ db })))
`

/** Imports every subpath and reports where each resolved and what it exports. */
const importAllScript = `
const out = {}
for (const s of ${JSON.stringify(specifiers)}) {
  const m = await import(s)
  out[s] = { resolved: import.meta.resolve(s), exports: Object.keys(m).sort() }
}
console.log(JSON.stringify(out))
`

/** Builds a store layer whose driver is not installed and prints its error, as `tag: message`. */
const missingDriverScript = (entry: string, build: string) => `
import { Effect, Layer } from "effect"
import * as m from "${entry}"
const exit = await Effect.runPromiseExit(Effect.scoped(Layer.build(${build})))
const error = exit._tag === "Failure" ? exit.cause.reasons.find((r) => r._tag === "Fail")?.error : undefined
console.log(error ? \`\${error._tag}: \${error.message}\` : \`no typed failure: \${String(exit.cause ?? exit._tag)}\`)
`

// The app's own Kysely 0.29 transaction, handed to txbox: with a second Kysely nested under txbox
// these would not type-check (Kysely's classes carry private fields).
const consumerCheck = `
import { Effect } from "effect"
import { Kysely, PostgresDialect, type Transaction } from "kysely"
import pg from "pg"
import * as v from "valibot"
${specifiers.map((s, i) => `import * as m${i} from "${s}"`).join("\n")}
export const all = [${specifiers.map((_, i) => `m${i}`).join(", ")}]
const { defineEvent, Outbox, StoreError } = m0
const { migrate, PgStore } = m${specifiers.indexOf(`${pkg.name}/pg`)}
const { KyselyStore } = m${specifiers.indexOf(`${pkg.name}/kysely`)}
interface DB { orders: { id: string; total: number } }
const db = new Kysely<DB>({ dialect: new PostgresDialect({ pool: new pg.Pool() }) })
const Placed = defineEvent({ type: "t", version: 1, schema: v.object({ n: v.number() }) })
export const placed = (trx: Transaction<DB>) => Outbox.enqueue(trx, Placed, { n: 1 })
export const migrated = migrate(db)
export const store = KyselyStore.layer({ db })
export const inTx = db.transaction().execute((trx) => Effect.runPromise(Outbox.enqueue(trx, Placed, { n: 2 })))
// @ts-expect-error the payload is typed by the contract's schema
Outbox.enqueue(undefined as never, Placed, { n: "not a number" })
const error = new StoreError({ reason: "query", operation: "probe" })
// @ts-expect-error reason is a union of literals
export const reason: "nope" = error.reason
// @ts-expect-error poolSize is a number
PgStore.layer({ url: "", poolSize: "10" })
`

describe("Node 22: npm install txbox effect kysely@0.29 pg amqplib", () => {
  let dir: string
  beforeAll(async () => {
    dir = freshProject("node", {
      "package.json": JSON.stringify({ name: "node-app", private: true, type: "module" }),
      "main.test.mjs": nodeMain,
      "import-all.mjs": importAllScript,
      "missing-postgres.mjs": missingDriverScript(
        "txbox/postgres-js",
        "m.PostgresJsStore.layer({ url: 'postgres://db/app' })",
      ),
      "missing-pglite.mjs": missingDriverScript("txbox/pglite", "m.PgliteStore.layer()"),
      "check.ts": consumerCheck,
      "tsconfig.json": JSON.stringify({
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
    })
    await npmInstall(dir, ["effect", "kysely@^0.29", "pg", "@types/pg", "amqplib", "valibot"])
    await recordSize(
      "node (txbox, effect, kysely 0.29, pg, @types/pg, amqplib, valibot)",
      dir,
      "node_modules",
    )
  })

  test("npm ls kysely effect: one copy of each, Kysely 0.29", async () => {
    const tree = await run(["npm", "ls", "kysely", "effect", "--all", "--parseable", "--long"], dir)
    console.log(
      `[pack] npm ls kysely effect (node project):\n${await run(["npm", "ls", "kysely", "effect", "--all"], dir)}`,
    )
    const copies = tree
      .split("\n")
      .filter((line) => /node_modules\/(kysely|effect):/.test(line))
      .map((line) => line.split(":")[1])
    expect(copies.filter((c) => c!.startsWith("kysely@")).length).toBe(1)
    expect(copies.filter((c) => c!.startsWith("effect@")).length).toBe(1)
    expect(copies.find((c) => c!.startsWith("kysely@"))).toMatch(/^kysely@0\.29\./)
    // Only the drivers asked for: no postgres.js, no PGlite.
    for (const absent of ["postgres", "@electric-sql/pglite", "kysely-postgres-js", "valibot-not-here"]) {
      expect({ absent, installed: existsSync(join(dir, "node_modules", absent)) }).toEqual({
        absent,
        installed: false,
      })
    }
  })

  test("every subpath imports from dist/, the drivers not installed included (they load lazily)", async () => {
    const version = (await run([node22, "--version"], dir)).trim()
    expect(version).toMatch(/^v22\./)
    const onNode = JSON.parse(await run([node22, "import-all.mjs"], dir))
    for (const [subpath, conditions] of entries) {
      const s = specifier(subpath)
      expect(onNode[s].resolved).toEndWith(`/node_modules/${pkg.name}/${conditions.default.slice(2)}`)
      expect(onNode[s].exports.length).toBeGreaterThan(0)
    }
  })

  test("enqueue → relay → inbox end to end: txbox/pg, and txbox/kysely over the app's Kysely", async () => {
    const output = await run([node22, "--test", "main.test.mjs"], dir, services())
    expect(output).toMatch(/# pass 3/)
  })

  test("a driver that is not installed: a ConfigError that says what to install", async () => {
    expect((await run([node22, "missing-postgres.mjs"], dir)).trim()).toBe(
      'ConfigError: txbox/postgres-js needs the "postgres" package, which is not installed: npm i postgres (bun add postgres, deno add npm:postgres)',
    )
    expect((await run([node22, "missing-pglite.mjs"], dir)).trim()).toContain(
      'txbox/pglite needs the "@electric-sql/pglite" package, which is not installed: npm i @electric-sql/pglite',
    )
  })

  test("the .d.ts give the app's TypeScript the real types, against the app's own Kysely 0.29", async () => {
    await run([tsc, "-p", "."], dir)
  })

  test("the txbox bin runs under Node 22, and says which Node it needs on an older one", async () => {
    const txboxBin = join(dir, "node_modules", ".bin", "txbox")
    expect((await run([node22, txboxBin, "--version"], dir)).trim()).toEndWith(pkg.version)
    // The machine's own Node, when it is older (CI's is 20): a clear line instead of a load error.
    const machine = Bun.which("node", {
      PATH: (process.env.PATH ?? "")
        .split(":")
        .filter((p) => !p.includes("node_modules"))
        .join(":"),
    })
    if (machine === null) return
    const version = (await run([machine, "--version"], dir)).trim().slice(1)
    const [major = 0, minor = 0] = version.split(".").map(Number)
    const old = major < 22 || (major === 22 && minor < 19)
    const result = await runFailing([machine, txboxBin, "--version"], dir)
    if (old) {
      expect(result.code).toBe(2)
      expect(result.output).toContain(`txbox: needs Node.js 22.19 or newer; this is Node.js ${version}`)
    } else {
      expect(result.output.trim()).toEndWith(pkg.version)
    }
  })
})

// ---------------------------------------------------------------------------------------------
// Bun: bun add, Kysely 0.28, postgres.js and amqplib; the sources through the "bun" condition.

const bunMain = `
import { test, expect } from "bun:test"
import postgres from "postgres"
import * as txbox from "txbox"
import * as amqp from "txbox/amqp"
import { migrate } from "txbox/kysely"
import { PostgresJsDialect, PostgresJsStore } from "txbox/postgres-js"
import * as promise from "txbox/promise"
import { postgresJsApp, smokeEffect, smokePromise } from "./smoke.mjs"

const modules = { txbox, amqp, promise, migrate }
const app = postgresJsApp(postgres, PostgresJsDialect)
test("runs the TypeScript sources", () => {
  expect(import.meta.resolve("txbox")).toEndWith("/node_modules/txbox/src/index.ts")
})
test("txbox/postgres-js: enqueue → relay → inbox (Effect API)", () =>
  smokeEffect(modules, app, ({ url }) => PostgresJsStore.layer({ url, poolSize: 2 })), 60_000)
test("txbox/postgres-js: enqueue → relay → inbox (Promise facade)", () =>
  smokePromise(modules, app, ({ url }) => PostgresJsStore.layer({ url, poolSize: 2 })), 60_000)
`

describe("Bun: bun add txbox effect kysely@0.28 postgres amqplib", () => {
  let dir: string
  beforeAll(async () => {
    dir = freshProject("bun", {
      "package.json": JSON.stringify({ name: "bun-app", private: true, type: "module" }),
      "app.test.ts": bunMain,
      "import-all.mjs": importAllScript,
      "missing-pg.mjs": missingDriverScript("txbox/pg", "m.PgStore.layer({ url: 'postgres://db/app' })"),
    })
    await run(
      [process.execPath, "add", tarball, "effect", "kysely@~0.28.18", "postgres", "amqplib", "valibot"],
      dir,
    )
    await recordSize("bun (txbox, effect, kysely 0.28, postgres, amqplib, valibot)", dir, "node_modules")
  })

  test("Kysely 0.28, no pg and no PGlite installed", () => {
    expect(readJson(join(dir, "node_modules", "kysely", "package.json")).version).toMatch(/^0\.28\./)
    expect(existsSync(join(dir, "node_modules", "pg"))).toBe(false)
    expect(existsSync(join(dir, "node_modules", "@electric-sql", "pglite"))).toBe(false)
  })

  test("every subpath imports from src/", async () => {
    const onBun = JSON.parse(await run([process.execPath, "import-all.mjs"], dir))
    for (const [subpath, conditions] of entries) {
      expect(onBun[specifier(subpath)].resolved).toEndWith(
        `/node_modules/${pkg.name}/${conditions.bun.slice(2)}`,
      )
    }
  })

  test("enqueue → relay → inbox end to end on postgres.js", async () => {
    await run([process.execPath, "test", "app.test.ts"], dir, services())
  })

  test("without pg, txbox/pg's layer fails with a ConfigError that says npm i pg", async () => {
    expect((await run([process.execPath, "missing-pg.mjs"], dir)).trim()).toBe(
      'ConfigError: txbox/pg needs the "pg" package, which is not installed: npm i pg (bun add pg, deno add npm:pg)',
    )
  })
})

// ---------------------------------------------------------------------------------------------
// Deno, from npm: `deno add npm:txbox` against a local registry that serves the tarball.

/**
 * A registry for `deno add npm:txbox`: serves this package's packument and tarball, and passes every
 * other request on to the registry npm is configured with (the same one `npm install` used).
 */
const localRegistry = async () => {
  const upstream = (await run(["npm", "config", "get", "registry"], root)).trim().replace(/\/$/, "")
  const bytes = readFileSync(tarball)
  const integrity = `sha512-${createHash("sha512").update(bytes).digest("base64")}`
  const shasum = createHash("sha1").update(bytes).digest("hex")
  const file = `${pkg.name}-${pkg.version}.tgz`
  let base = ""
  const server: Bun.Server<undefined> = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    fetch: async (request): Promise<Response> => {
      const url = new URL(request.url)
      if (url.pathname === `/${pkg.name}`) {
        const version = {
          ...pkg,
          _id: `${pkg.name}@${pkg.version}`,
          dist: { tarball: `${base}${pkg.name}/-/${file}`, integrity, shasum },
        }
        return Response.json({
          name: pkg.name,
          "dist-tags": { latest: pkg.version },
          versions: { [pkg.version]: version },
        })
      }
      if (url.pathname === `/${pkg.name}/-/${file}`) return new Response(bytes)
      const answer = await fetch(`${upstream}${url.pathname}`, {
        headers: { accept: request.headers.get("accept") ?? "*/*" },
      })
      return new Response(answer.body, {
        status: answer.status,
        headers: { "content-type": answer.headers.get("content-type") ?? "application/json" },
      })
    },
  })
  base = server.url.href
  return server
}

const denoMain = (imports: string, store: string, smoke: "smokeEffect" | "smokePromise") => `
${imports}
import { ${smoke} } from "./smoke.mjs"

const modules = { txbox, amqp, promise, migrate }
Deno.test("resolves txbox by name", () => {
  const resolved = import.meta.resolve("${imports.includes("@txbox/txbox") ? "@txbox/txbox" : "txbox"}")
  console.log("txbox resolved to " + resolved)
})
Deno.test("enqueue → relay → inbox end to end", () => ${smoke}(modules, app, ${store}))
`

const denoTest = (dir: string, env: Record<string, string>) =>
  run([deno, "test", "--allow-all", "--no-check", "main.test.ts"], dir, { ...services(), ...env })

describe("Deno from npm: deno add npm:txbox npm:effect npm:kysely@0.29 npm:pg npm:amqplib", () => {
  let dir: string
  let registry: Awaited<ReturnType<typeof localRegistry>>
  const env: Record<string, string> = {}
  beforeAll(async () => {
    registry = await localRegistry()
    dir = freshProject("deno-npm", {
      "deno.json": JSON.stringify({ nodeModulesDir: "auto" }),
      "main.test.ts": denoMain(
        [
          `import pg from "pg"`,
          `import * as txbox from "txbox"`,
          `import * as amqp from "txbox/amqp"`,
          `import { migrate } from "txbox/kysely"`,
          `import { PgStore } from "txbox/pg"`,
          `import * as promise from "txbox/promise"`,
          `import { pgApp } from "./smoke.mjs"`,
          `const app = pgApp(pg)`,
        ].join("\n"),
        "({ url }: { url: string }) => PgStore.layer({ url, poolSize: 2 })",
        "smokeEffect",
      ),
    })
    // A DENO_DIR of its own: its npm cache is keyed by registry, and this registry's txbox changes per build.
    Object.assign(env, { NPM_CONFIG_REGISTRY: registry.url.href, DENO_DIR: join(work, "deno-dir-npm") })
    await run(
      [deno, "add", "npm:txbox", "npm:effect", "npm:kysely@^0.29", "npm:pg", "npm:amqplib", "npm:valibot"],
      dir,
      env,
    )
    await run([deno, "install"], dir, env)
    await recordSize("deno-npm (txbox, effect, kysely 0.29, pg, amqplib, valibot)", dir, "node_modules")
  })
  afterAll(() => registry?.stop(true))

  test("deno.json imports txbox from npm by name", () => {
    const imports = readJson(join(dir, "deno.json")).imports
    expect(imports.txbox).toBe(`npm:txbox@^${pkg.version}`)
    expect(imports.kysely).toMatch(/^npm:kysely@\^0\.29/)
  })

  test("enqueue → relay → inbox end to end, on dist/ (Deno type-strips nothing in node_modules)", async () => {
    const output = await denoTest(dir, env)
    expect(output).toContain(`/node_modules/.deno/txbox@${pkg.version}/node_modules/txbox/dist/index.js`)
  })

  test("the .d.ts type-check the app under deno check", async () => {
    await run([deno, "check", "main.test.ts"], dir, env)
  })
})

// ---------------------------------------------------------------------------------------------
// Deno, from JSR: the published files, imported by the published name through an import map.

describe("Deno from JSR (import map over jsr.json): @txbox/txbox, postgres.js, Kysely 0.29", () => {
  let dir: string
  beforeAll(async () => {
    dir = freshProject("deno-jsr", {
      "main.test.ts": denoMain(
        [
          `import postgres from "postgres"`,
          `import * as txbox from "@txbox/txbox"`,
          `import * as amqp from "@txbox/txbox/amqp"`,
          `import { migrate } from "@txbox/txbox/kysely"`,
          `import { PostgresJsDialect, PostgresJsStore } from "@txbox/txbox/postgres-js"`,
          `import * as promise from "@txbox/txbox/promise"`,
          `import { postgresJsApp } from "./smoke.mjs"`,
          `const app = postgresJsApp(postgres, PostgresJsDialect)`,
        ].join("\n"),
        "({ url }: { url: string }) => PostgresJsStore.layer({ url, poolSize: 2 })",
        "smokePromise",
      ),
    })
    // What `deno publish` uploads: jsr.json's publish.include, nothing else (no package.json).
    const published = join(dir, "jsr_package")
    for (const pattern of jsr.publish.include as string[]) {
      for (const file of new Bun.Glob(pattern).scanSync(root)) {
        mkdirSync(dirname(join(published, file)), { recursive: true })
        cpSync(join(root, file), join(published, file))
      }
    }
    // The published name → the published files, per jsr.json's exports; the sources' bare npm
    // specifiers → `npm:` with the peer ranges (the app's choice of Kysely: 0.29).
    const imports: Record<string, string> = {}
    for (const [subpath, source] of Object.entries(jsr.exports as Record<string, string>)) {
      imports[subpath === "." ? jsr.name : `${jsr.name}/${subpath.slice(2)}`] =
        `./jsr_package/${source.slice(2)}`
    }
    const peers: Record<string, string> = { ...pkg.peerDependencies, kysely: "^0.29.0", valibot: "^1" }
    for (const [name, range] of Object.entries(peers)) {
      imports[name] = `npm:${name}@${range}`
      imports[`${name}/`] = `npm:/${name}@${range}/`
    }
    writeFileSync(join(dir, "deno.json"), JSON.stringify({ nodeModulesDir: "auto", imports }, null, 2))
  })
  // Measured after the runs: Deno installs an import map's npm packages as the code reaches them.
  afterAll(async () => {
    await recordSize("deno-jsr (txbox sources + what the runs pulled)", dir, ".")
  })

  test("enqueue → relay → inbox end to end on postgres.js, type-checked by Deno", async () => {
    await run([deno, "check", "main.test.ts"], dir)
    const output = await denoTest(dir, {})
    expect(output).toContain("jsr_package/src/index.ts")
  })

  test("every jsr.json export loads by its published name", async () => {
    const script = join(dir, "import-all.ts")
    writeFileSync(
      script,
      `for (const s of ${JSON.stringify(Object.keys(jsr.exports).map((k) => (k === "." ? jsr.name : `${jsr.name}/${k.slice(2)}`)))}) await import(s)\nconsole.log("ok")`,
    )
    expect((await run([deno, "run", "--allow-all", "import-all.ts"], dir)).trim()).toBe("ok")
  })
})

// ---------------------------------------------------------------------------------------------
// PGlite: Node, Kysely 0.29 (its own PGlite dialect), the memory broker; no pg, postgres, amqplib.

const pgliteMain = `
import { test } from "node:test"
import assert from "node:assert/strict"
import { Effect, Layer } from "effect"
import { sql } from "kysely"
import * as v from "valibot"
import { Database, defineEvent, Inbox, Outbox, Relay } from "txbox"
import { MemoryTransport } from "txbox/testing"
import { migrate, PgliteStore } from "txbox/pglite"

const Placed = defineEvent({ type: "pglite.placed", version: 1, schema: v.object({ n: v.number() }) })

test("the store runs on Kysely 0.29's own PGlite dialect", () => {
  assert.equal(PgliteStore.dialect, "builtin")
})

test("enqueue → relay → inbox on PGlite, and a statement from elsewhere waits for an open transaction", async () => {
  const program = Effect.gen(function* () {
    const { db } = yield* Database
    yield* migrate(db)
    yield* Effect.promise(() => sql\`CREATE TABLE seen (n int PRIMARY KEY)\`.execute(db))
    // The guarantee the dialect must keep: without it this INSERT would join the transaction and
    // vanish with its rollback.
    const trx = yield* Effect.promise(() => db.startTransaction().execute())
    yield* Effect.promise(() => sql\`INSERT INTO seen VALUES (1)\`.execute(trx))
    const outside = sql\`INSERT INTO seen VALUES (2)\`.execute(db)
    yield* Effect.sleep("50 millis")
    yield* Effect.promise(() => trx.rollback().execute())
    yield* Effect.promise(() => outside)
    const rows = yield* Effect.promise(() => sql\`SELECT n FROM seen\`.execute(db))
    assert.deepEqual(rows.rows, [{ n: 2 }])

    yield* Inbox.make({
      consumer: "pglite",
      handlers: [Inbox.handler(Placed, ({ payload, trx }) => Effect.promise(() => sql\`INSERT INTO seen VALUES (\${payload.n})\`.execute(trx)))],
    })
    yield* Relay.make({ pollInterval: "100 millis" })
    yield* Effect.promise(() => db.transaction().execute((trx) => Effect.runPromise(Outbox.enqueue(trx, Placed, { n: 3 }))))
    for (let i = 0; i < 200; i++) {
      const found = yield* Effect.promise(() => sql\`SELECT n FROM seen WHERE n = 3\`.execute(db))
      if (found.rows.length === 1) return "delivered"
      yield* Effect.sleep("50 millis")
    }
    return "not delivered"
  })
  const layer = Layer.mergeAll(PgliteStore.layer(), MemoryTransport.layer())
  assert.equal(await Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(layer))), "delivered")
})

test("txbox/amqp without amqplib: it imports, and building the transport is a ConfigError naming amqplib", async () => {
  const { AmqpTransport } = await import("txbox/amqp")
  const exit = await Effect.runPromiseExit(
    Effect.scoped(Layer.build(AmqpTransport.layer({ url: "amqp://127.0.0.1:1" }))),
  )
  const error = exit._tag === "Failure" ? exit.cause.reasons.find((r) => r._tag === "Fail")?.error : undefined
  assert.equal(
    error ? \`\${error._tag}: \${error.message}\` : String(exit),
    'ConfigError: txbox/amqp needs the "amqplib" package, which is not installed: npm i amqplib (bun add amqplib, deno add npm:amqplib)',
  )
})
`

describe("PGlite: npm install txbox effect kysely@0.29 @electric-sql/pglite", () => {
  let dir: string
  beforeAll(async () => {
    dir = freshProject("pglite", {
      "package.json": JSON.stringify({ name: "pglite-app", private: true, type: "module" }),
      "main.test.mjs": pgliteMain,
    })
    await npmInstall(dir, ["effect", "kysely@^0.29", "@electric-sql/pglite", "valibot"])
    await recordSize(
      "pglite (txbox, effect, kysely 0.29, @electric-sql/pglite, valibot)",
      dir,
      "node_modules",
    )
  })

  test("enqueue → relay → inbox on Kysely 0.29's PGlite dialect, with the session guarantee", async () => {
    const output = await run([node22, "--test", "main.test.mjs"], dir)
    expect(output).toMatch(/# pass 3/)
  })
})

// ---------------------------------------------------------------------------------------------
// The edge: a Cloudflare Worker in workerd (Miniflare), postgres.js over the Workers TCP socket API.

// The worker as an app would write it: the order and its event in one transaction of its own
// Kysely, on txbox's PostgresJsDialect over postgres.js (whose "workerd" build connects with
// `cloudflare:sockets`). No txbox store, no Node driver: `Outbox.enqueue` needs only the transaction.
const edgeWorker = `
import { Effect } from "effect"
import { Kysely } from "kysely"
import postgres from "postgres"
import { defineEvent, Outbox } from "txbox"
import { PostgresJsDialect } from "txbox/postgres-js"
import * as v from "valibot"

const OrderPlaced = defineEvent({
  type: "smoke.order-placed",
  version: 1,
  schema: v.object({ orderId: v.pipe(v.string(), v.uuid()), total: v.number() }),
})

export default {
  async fetch(request, env) {
    const { orderId, total, fail } = await request.json()
    const db = new Kysely({
      dialect: new PostgresJsDialect({ postgres: postgres(env.DATABASE_URL, { max: 1, onnotice: () => {} }) }),
    })
    try {
      const written = await db.transaction().execute(async (trx) => {
        await trx.insertInto("orders").values({ id: orderId, total }).execute()
        const row = await Effect.runPromise(Outbox.enqueue(trx, OrderPlaced, { orderId, total }, { partitionKey: orderId }))
        if (fail) throw new Error("the request failed after enqueue")
        return row
      })
      return Response.json({ id: written.id, runtime: navigator.userAgent })
    } catch (error) {
      return Response.json({ error: String(error) }, { status: 500 })
    } finally {
      await db.destroy()
    }
  },
}
`

// The host: the relay and the inbox (txbox/postgres-js in Node 22); the write goes through the worker.
const edgeMain = `
import { test } from "node:test"
import assert from "node:assert/strict"
import { randomUUID } from "node:crypto"
import { Miniflare } from "miniflare"
import postgres from "postgres"
import { sql } from "kysely"
import * as txbox from "txbox"
import * as amqp from "txbox/amqp"
import { migrate } from "txbox/kysely"
import { PostgresJsDialect, PostgresJsStore } from "txbox/postgres-js"
import { postgresJsApp, smokeEffect } from "./smoke.mjs"

const inWorker = async ({ url, db, orderId }) => {
  const worker = new Miniflare({
    modules: true,
    scriptPath: "worker.bundle.js",
    compatibilityDate: "2025-09-01",
    compatibilityFlags: ["nodejs_compat"],
    bindings: { DATABASE_URL: url },
  })
  try {
    const post = async (body) => {
      const response = await worker.dispatchFetch("http://worker/orders", { method: "POST", body: JSON.stringify(body) })
      return { status: response.status, body: await response.json() }
    }
    // A request that fails after enqueue: its transaction, the outbox row with it, is rolled back.
    const failed = await post({ orderId: randomUUID(), total: 1, fail: true })
    assert.deepEqual(failed, { status: 500, body: { error: "Error: the request failed after enqueue" } })
    const counts = await sql\`SELECT (SELECT count(*) FROM orders)::int AS orders, (SELECT count(*) FROM txbox.outbox)::int AS outbox\`.execute(db)
    assert.deepEqual(counts.rows, [{ orders: 0, outbox: 0 }])
    const written = await post({ orderId, total: 42.5 })
    assert.equal(written.status, 200, JSON.stringify(written.body))
    assert.equal(written.body.runtime, "Cloudflare-Workers")
    return written.body
  } finally {
    await worker.dispose()
  }
}

test("Outbox.enqueue in a Cloudflare Worker (workerd); the relay publishes it, the inbox applies it", () =>
  smokeEffect(
    { txbox, amqp, migrate },
    postgresJsApp(postgres, PostgresJsDialect),
    ({ url }) => PostgresJsStore.layer({ url, poolSize: 2 }),
    inWorker,
  ))
`

describe("Cloudflare Worker: npm install txbox effect kysely postgres valibot (+ miniflare, amqplib for the host)", () => {
  let dir: string
  beforeAll(async () => {
    dir = freshProject("edge", {
      "package.json": JSON.stringify({ name: "edge-app", private: true, type: "module" }),
      "worker.mjs": edgeWorker,
      "main.test.mjs": edgeMain,
    })
    await npmInstall(dir, ["effect", "kysely@^0.29", "postgres", "valibot", "amqplib", "miniflare@^4"])
    // Bundled as wrangler would: one ES module, postgres.js's "workerd" build, the runtime's own
    // modules (node:*, cloudflare:*) left to workerd.
    await run(
      [
        process.execPath,
        "build",
        "worker.mjs",
        "--outfile",
        "worker.bundle.js",
        "--target",
        "browser",
        "--conditions",
        "workerd",
        "--format",
        "esm",
        "--external",
        "cloudflare:*",
        "--external",
        "node:*",
      ],
      dir,
    )
    await recordSize(
      "edge (txbox, effect, kysely 0.29, postgres, valibot; miniflare, amqplib)",
      dir,
      "node_modules",
    )
    // Workers limit a script's compressed size (3 MB on the free plan): report it gzipped too.
    const gzipped = Bun.gzipSync(readFileSync(join(dir, "worker.bundle.js"))).length
    await recordSize(
      "edge worker bundle (txbox, effect, kysely, postgres.js, valibot)",
      dir,
      "worker.bundle.js",
    )
    sizes["edge worker bundle, gzipped"] = `${(gzipped / 1024).toFixed(0)} KB`
    console.log(`[pack] edge worker bundle gzipped: ${sizes["edge worker bundle, gzipped"]}`)
  })

  test("the worker bundle connects through cloudflare:sockets, not node:net", () => {
    const bundled = readFileSync(join(dir, "worker.bundle.js"), "utf8")
    expect(bundled).toContain('import("cloudflare:sockets")')
    const runtimeImports = [...bundled.matchAll(/from\s*"((?:node|cloudflare):[^"]+)"/g)].map((m) => m[1])
    expect(runtimeImports.filter((name) => name === "node:net" || name === "node:tls")).toEqual([])
  })

  test("enqueue in workerd → relay → inbox end to end; a failed request leaves no outbox row", async () => {
    const output = await run([node22, "--test", "main.test.mjs"], dir, services())
    expect(output).toMatch(/# pass 1/)
  })
})

// ---------------------------------------------------------------------------------------------
// Bundles: what each entry pulls in.

// Everything a bundle of the root entry must not contain: it is what runs `Outbox.enqueue` in any
// runtime Kysely runs in, drivers and Node APIs belong to the subpaths.
const nodeBuiltins = new Set(builtinModules)
const DRIVER = /^(postgres|pg|pg-[a-z-]+|amqplib|kysely-postgres-js|@electric-sql\/[a-z-]+)(\/|$)/
const isBanned = (path: string) =>
  path.startsWith("node:") || nodeBuiltins.has(path.split("/")[0]!) || DRIVER.test(path)

/**
 * Bundles `entry` for the browser. `pulled`: every driver or Node module resolved on the way;
 * `direct`: the packages txbox's own files import (what a driver imports itself is its business).
 */
const bundle = async (entry: string) => {
  const pulled: string[] = []
  const direct: string[] = []
  const ownFiles = join(root, "src")
  const result = await Bun.build({
    entrypoints: [join(root, "src", entry)],
    target: "browser",
    throw: false,
    plugins: [
      {
        name: "record-banned-imports",
        setup(build) {
          build.onResolve({ filter: /.*/ }, (args) => {
            const name = args.path
              .split("/")
              .slice(0, args.path.startsWith("@") ? 2 : 1)
              .join("/")
            if (isBanned(args.path)) pulled.push(name)
            if (args.importer.startsWith(ownFiles) && !args.path.startsWith(".")) direct.push(name)
            return undefined
          })
        },
      },
    ],
  })
  const sorted = (names: string[]) => [...new Set(names)].sort()
  return { pulled: sorted(pulled), direct: sorted(direct), result }
}

describe("the entries", () => {
  test("the root entry bundles for the browser without a Node module or a driver", async () => {
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

  test("txbox/kysely (the store over the app's Kysely, and migrate) pulls no driver", async () => {
    expect((await bundle("kysely.ts")).pulled).toEqual([])
  })

  test("each driver entry imports its own driver and no other", async () => {
    const drivers = async (entry: string) => (await bundle(entry)).direct.filter((name) => DRIVER.test(name))
    expect(await drivers("pg.ts")).toEqual(["pg"])
    expect(await drivers("postgres-js.ts")).toEqual(["postgres"])
    expect(await drivers("pglite.ts")).toEqual(["@electric-sql/pglite"])
    expect(await drivers("amqp.ts")).toEqual(["amqplib"])
    expect(await drivers("kysely.ts")).toEqual([])
  })
})
