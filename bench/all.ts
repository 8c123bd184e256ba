// Every bench in sequence, each in a process of its own (no JIT state or heap carried from one to
// the next), on one pair of services started here; `--quick` passes through. Ends with a combined
// summary from the result files, written to bench/results/all.json.
//
//   bun bench/all.ts [--quick] [--only relay,latency]
import { spawn } from "node:child_process"
import { readFileSync } from "node:fs"
import { join } from "node:path"
import {
  BENCH_DIR,
  log,
  main,
  parseArgs,
  printTable,
  RESULTS_DIR,
  round,
  withServices,
  writeResult,
} from "./support/harness.ts"

const SCRIPTS = [
  "relay",
  "latency",
  "inbox",
  "enqueue",
  "memory",
  "scaleout",
  "ordered",
  "blocked",
  "e2e",
  "cost",
  "builder",
] as const

const args = parseArgs()
const only = args.string("only", SCRIPTS.join(",")).split(",")
for (const name of only) {
  if (!(SCRIPTS as ReadonlyArray<string>).includes(name)) throw new Error(`--only: unknown bench ${name}`)
}
const scripts = SCRIPTS.filter((name) => only.includes(name))

const run = (name: string, env: NodeJS.ProcessEnv): Promise<number> =>
  new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      [join(BENCH_DIR, `${name}.ts`), ...(args.quick ? ["--quick"] : [])],
      {
        env,
        stdio: "inherit",
      },
    )
    child.once("error", reject)
    child.once("exit", (code, signal) => resolve(code ?? (signal ? 128 : 1)))
  })

type Summary = Readonly<Record<string, number>>
const summaryOf = (name: string): Summary =>
  (JSON.parse(readFileSync(join(RESULTS_DIR, `${name}.json`), "utf8")) as { summary: Summary }).summary

main(() =>
  withServices(async (services) => {
    // The children find the services here (resolveServices reads these), instead of starting their own.
    const env = {
      ...process.env,
      TXBOX_TEST_DATABASE_URL: services.databaseUrl,
      TXBOX_TEST_AMQP_URL: services.amqpUrl,
    }
    const durations: Record<string, number> = {}
    const failed: string[] = []
    for (const name of scripts) {
      log(`── bench/${name}.ts${args.quick ? " --quick" : ""}`)
      const started = performance.now()
      const code = await run(name, env)
      durations[name] = round((performance.now() - started) / 1000, 1)
      if (code !== 0) failed.push(`${name} (exit ${code})`)
    }

    const summary: Record<string, number> = {}
    const rows: Array<[string, string, number | undefined]> = []
    for (const name of scripts) {
      if (failed.some((f) => f.startsWith(`${name} `))) continue
      for (const [key, value] of Object.entries(summaryOf(name))) {
        summary[`${name}.${key}`] = value
        rows.push([name, key, value])
      }
      summary[`${name}.seconds`] = durations[name]!
    }
    printTable(
      "All benches: summary (details in bench/results/<name>.json)",
      ["bench", "figure", "value"],
      rows,
    )
    printTable(
      "Wall time, seconds",
      ["bench", "seconds"],
      scripts.map((name) => [name, durations[name]]),
    )
    writeResult("all", args, services, {
      summary,
      config: { scripts, quick: args.quick },
      results: { durations },
    })
    if (failed.length > 0) throw new Error(`failed: ${failed.join(", ")}`)
  }),
)
