// What every bench script shares: flags, the services (started the way the tests start them), a
// table printer, percentiles, and the JSON result file.
import { mkdirSync, writeFileSync } from "node:fs"
import { cpus, loadavg, totalmem } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { resolveServices, type Services } from "../../test/support/services.ts"

export const BENCH_DIR = join(dirname(fileURLToPath(import.meta.url)), "..")
/** Where result files go; the smoke test points it at a temp dir so real results survive `bun test`. */
export const RESULTS_DIR = process.env.TXBOX_BENCH_RESULTS_DIR ?? join(BENCH_DIR, "results")

export interface Args {
  readonly quick: boolean
  /** A numeric `--name value` / `--name=value` option, or the fallback. */
  number(name: string, fallback: number): number
  /** A string option, or the fallback. */
  string(name: string, fallback: string): string
  /** A comma-separated numeric list (`--batches 100,1000`), or the fallback. */
  list(name: string, fallback: ReadonlyArray<number>): ReadonlyArray<number>
  /** A comma-separated list of names out of `allowed` (`--sources polling,wal`), or the fallback. */
  choices<T extends string>(
    name: string,
    fallback: ReadonlyArray<T>,
    allowed: ReadonlyArray<T>,
  ): ReadonlyArray<T>
  /** Every option as given, for the result file. */
  readonly given: Readonly<Record<string, string | true>>
}

export const parseArgs = (argv: ReadonlyArray<string> = process.argv.slice(2)): Args => {
  const given: Record<string, string | true> = {}
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!
    if (!arg.startsWith("--")) throw new Error(`unexpected argument ${JSON.stringify(arg)}`)
    const eq = arg.indexOf("=")
    if (eq > 0) given[arg.slice(2, eq)] = arg.slice(eq + 1)
    else if (argv[i + 1] !== undefined && !argv[i + 1]!.startsWith("--")) given[arg.slice(2)] = argv[++i]!
    else given[arg.slice(2)] = true
  }
  const raw = (name: string): string | undefined => {
    const value = given[name]
    if (value === true) throw new Error(`--${name} needs a value`)
    return value
  }
  const number = (name: string, fallback: number): number => {
    const value = raw(name)
    if (value === undefined) return fallback
    const n = Number(value.replaceAll("_", ""))
    if (!Number.isFinite(n)) throw new Error(`--${name} must be a number, got ${JSON.stringify(value)}`)
    return n
  }
  return {
    quick: given.quick === true,
    number,
    string: (name, fallback) => raw(name) ?? fallback,
    list: (name, fallback) => {
      const value = raw(name)
      if (value === undefined) return fallback
      return value.split(",").map((part) => {
        const n = Number(part.replaceAll("_", ""))
        if (!Number.isFinite(n)) throw new Error(`--${name} must be a list of numbers, got ${value}`)
        return n
      })
    },
    choices: <T extends string>(name: string, fallback: ReadonlyArray<T>, allowed: ReadonlyArray<T>) => {
      const value = raw(name)
      if (value === undefined) return fallback
      return value
        .split(",")
        .map((part) => part.trim())
        .filter((part) => part !== "")
        .map((part) => {
          if (!(allowed as ReadonlyArray<string>).includes(part))
            throw new Error(`--${name}: ${part} (${allowed.join(", ")})`)
          return part as T
        })
    },
    given,
  }
}

export const log = (message: string): void => {
  console.error(`[bench ${new Date().toISOString().slice(11, 19)}] ${message}`)
}

/**
 * Runs `body` with PostgreSQL and RabbitMQ: from TXBOX_TEST_DATABASE_URL / TXBOX_TEST_AMQP_URL when
 * set (bench/all.ts and the test preload set them), else started from local binaries exactly as the
 * tests do, and stopped at the end, on error, and on Ctrl-C.
 */
export const withServices = async <A>(body: (services: Services) => Promise<A>): Promise<A> => {
  const started = performance.now()
  const services = await resolveServices()
  log(
    `PostgreSQL from ${services.source.database}, RabbitMQ from ${services.source.amqp} ` +
      `(${Math.round(performance.now() - started)} ms)`,
  )
  const onSignal = (signal: NodeJS.Signals) => {
    services.stopSync()
    process.exit(signal === "SIGINT" ? 130 : 143)
  }
  process.once("SIGINT", onSignal)
  process.once("SIGTERM", onSignal)
  try {
    return await body(services)
  } finally {
    process.off("SIGINT", onSignal)
    process.off("SIGTERM", onSignal)
    await services.stop()
  }
}

/** The bench's entry point: runs `body`, exits 1 with the error on failure (child processes included). */
export const main = (body: () => Promise<void>): void => {
  body().then(
    () => process.exit(0),
    (error: unknown) => {
      console.error(error instanceof Error ? (error.stack ?? error.message) : error)
      process.exit(1)
    },
  )
}

export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

/** Waits until `check` holds, polling every `everyMs`; throws after `timeoutMs`. */
export const until = async (
  what: string,
  check: () => boolean | Promise<boolean>,
  timeoutMs: number,
  everyMs = 20,
): Promise<void> => {
  const deadline = performance.now() + timeoutMs
  while (!(await check())) {
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await sleep(everyMs)
  }
}

// ---------------------------------------------------------------------------------------------
// Numbers

/** The q-th percentile (0..100) of `values` by nearest rank; NaN for none. */
export const percentile = (values: ReadonlyArray<number>, q: number): number => {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort((a, b) => a - b)
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((q / 100) * sorted.length) - 1))
  return sorted[rank]!
}

export const median = (values: ReadonlyArray<number>): number => {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort((a, b) => a - b)
  const mid = sorted.length >> 1
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

/** Rounds to `digits` decimals (JSON stays readable). */
export const round = (n: number, digits = 0): number => {
  const f = 10 ** digits
  return Math.round(n * f) / f
}

// ---------------------------------------------------------------------------------------------
// Output

export type Cell = string | number | undefined

const formatCell = (value: Cell): string => {
  if (value === undefined) return "–"
  if (typeof value === "string") return value
  if (!Number.isFinite(value)) return "–"
  if (Number.isInteger(value)) return value.toLocaleString("en-US")
  const digits = Math.abs(value) >= 100 ? 0 : Math.abs(value) >= 10 ? 1 : 2
  return value.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits })
}

/** Prints a plain-text table to stdout: strings left-aligned, numbers right-aligned. */
export const printTable = (
  title: string,
  header: ReadonlyArray<string>,
  rows: ReadonlyArray<ReadonlyArray<Cell>>,
) => {
  const text = rows.map((row) => row.map(formatCell))
  const widths = header.map((h, i) => Math.max(h.length, ...text.map((row) => row[i]?.length ?? 0)))
  const numeric = header.map((_, i) => rows.every((row) => typeof row[i] !== "string"))
  const line = (cells: ReadonlyArray<string>) =>
    cells
      .map((cell, i) => (numeric[i] ? cell.padStart(widths[i]!) : cell.padEnd(widths[i]!)))
      .join("  ")
      .trimEnd()
  console.log(`\n${title}`)
  console.log(line(header))
  console.log(widths.map((w) => "-".repeat(w)).join("  "))
  for (const row of text) console.log(line(row))
}

export interface ResultFile {
  /** Flat numbers that `bench/all.ts` and the smoke test read. */
  readonly summary: Readonly<Record<string, number>>
  readonly config: unknown
  readonly results: unknown
}

/**
 * Writes `bench/results/<name>.json` with the machine and run context around `result`.
 * `services` is undefined for a script that needs none (bench/builder.ts).
 */
export const writeResult = (
  name: string,
  args: Args,
  services: Services | undefined,
  result: ResultFile,
): string => {
  const path = join(RESULTS_DIR, `${name}.json`)
  mkdirSync(RESULTS_DIR, { recursive: true })
  const file = {
    name,
    quick: args.quick,
    args: args.given,
    finishedAt: new Date().toISOString(),
    machine: {
      cpus: cpus().length,
      cpuModel: cpus()[0]?.model,
      memoryMiB: Math.round(totalmem() / 2 ** 20),
      loadavg: loadavg().map((n) => round(n, 2)),
      runtime: typeof Bun === "undefined" ? `node ${process.version}` : `bun ${Bun.version}`,
    },
    services: services?.source ?? "none",
    ...result,
  }
  writeFileSync(path, `${JSON.stringify(file, null, 2)}\n`)
  log(`wrote ${path}`)
  return path
}
