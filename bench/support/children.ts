// The parent's side of the bench's child processes (support/relayProcess.ts and
// support/inboxProcess.ts): spawn with an environment, read their JSON lines, send them commands
// on stdin, stop them.
import { type ChildProcess, spawn } from "node:child_process"
import { openSync, writeSync } from "node:fs"
import { join } from "node:path"
import { BENCH_DIR, until } from "./harness.ts"

export interface Child<L extends { readonly event: string }> {
  readonly pid: number
  /** Every JSON line so far, in order. */
  readonly lines: ReadonlyArray<L>
  readonly latest: () => L | undefined
  /** Resolves at the first line (the child is connected and ready). */
  readonly ready: Promise<void>
  /** Sends a command line ("go", "report", "stop"). */
  send(command: string): void
  /** Waits until some line satisfies `check` (the latest first). */
  waitFor(what: string, check: (line: L) => boolean, timeoutMs: number): Promise<L>
  /** Graceful stop (SIGTERM, SIGKILL after 30 s); resolves with the exit code. */
  stop(): Promise<number | null>
}

const running = new Set<ChildProcess>()
// A bench that dies must not leave its children behind.
process.once("exit", () => {
  for (const child of running) child.kill("SIGKILL")
})

export const spawnChild = <L extends { readonly event: string }>(
  script: string,
  env: Record<string, string>,
): Child<L> => {
  // BENCH_CPU_PROF=<dir>: each child writes a CPU profile (markdown) there on exit (a diagnosis knob).
  const profile = process.env.BENCH_CPU_PROF
  // BENCH_CPU_PROF_TREE=1 with it: a .cpuprofile (the whole call tree) instead of the markdown summary.
  const tree = process.env.BENCH_CPU_PROF_TREE === "1"
  const flags = profile
    ? [
        tree ? "--cpu-prof" : "--cpu-prof-md",
        `--cpu-prof-dir=${profile}`,
        `--cpu-prof-name=${script}-${Date.now()}.${tree ? "cpuprofile" : "md"}`,
      ]
    : []
  const node = process.env.BENCH_NODE_PROF
  // BENCH_JIT_REPORT=<dir>: each child's JavaScriptCore compilations (what, which tier, how long) go
  // to a log there, one per child: a function compiled again and again is CPU the profile does not show.
  const jitReport = process.env.BENCH_JIT_REPORT
  const child = spawn(
    node ? join(BENCH_DIR, "..", "node_modules", ".bin", "node") : process.execPath,
    [...(node ? ["--cpu-prof", `--cpu-prof-dir=${node}`] : flags), join(BENCH_DIR, "support", script)],
    {
      env: { ...process.env, ...env, ...(jitReport ? { BUN_JSC_reportCompileTimes: "1" } : {}) },
      stdio: ["pipe", "pipe", jitReport ? "pipe" : "inherit"],
    },
  )
  // Each line stamped with the seconds since the child started: what is still compiled in the
  // measured window, not at start-up, is the cost a long-running process keeps paying.
  if (jitReport) {
    const log = openSync(join(jitReport, `${script}-${Date.now()}.log`), "w")
    const spawnedAt = performance.now()
    let partial = ""
    child.stderr!.setEncoding("utf8")
    child.stderr!.on("data", (chunk: string) => {
      const text = partial + chunk
      const end = text.lastIndexOf("\n") + 1
      partial = text.slice(end)
      const at = ((performance.now() - spawnedAt) / 1000).toFixed(1)
      const stamped = text
        .slice(0, end)
        .split("\n")
        .slice(0, -1)
        .map((line) => `${at} ${line}\n`)
      writeSync(log, stamped.join(""))
    })
  }
  running.add(child)
  const lines: L[] = []
  let exited: number | null | undefined
  const exit = new Promise<number | null>((resolve) => {
    child.once("exit", (code) => {
      running.delete(child)
      exited = code
      resolve(code)
    })
  })
  let buffered = ""
  child.stdout!.setEncoding("utf8")
  child.stdout!.on("data", (chunk: string) => {
    buffered += chunk
    let nl = buffered.indexOf("\n")
    while (nl >= 0) {
      const text = buffered.slice(0, nl).trim()
      buffered = buffered.slice(nl + 1)
      if (text.startsWith("{")) lines.push(JSON.parse(text) as L)
      nl = buffered.indexOf("\n")
    }
  })
  const alive = () => {
    if (exited !== undefined) throw new Error(`${script} (pid ${child.pid}) exited with ${exited}`)
  }
  const waitFor = async (what: string, check: (line: L) => boolean, timeoutMs: number): Promise<L> => {
    let found: L | undefined
    let seen = 0
    await until(
      what,
      () => {
        for (; seen < lines.length; seen++) {
          if (check(lines[seen]!)) found = lines[seen]
        }
        if (found) return true
        alive()
        return false
      },
      timeoutMs,
      10,
    )
    return found!
  }
  return {
    pid: child.pid!,
    lines,
    latest: () => lines.at(-1),
    ready: waitFor(`${script} to start`, () => true, 60_000).then(() => {}),
    send: (command) => {
      child.stdin!.write(`${command}\n`)
    },
    waitFor,
    stop: async () => {
      if (exited === undefined) child.kill("SIGTERM")
      const timer = setTimeout(() => child.kill("SIGKILL"), 30_000)
      const code = await exit
      clearTimeout(timer)
      return code
    },
  }
}

/** What support/producerProcess.ts prints: ready once connected, done after each run. */
export interface ProducerLine {
  readonly event: "ready" | "done"
  readonly run?: number
  readonly transactions?: number
  readonly errors?: number
  readonly firstError?: string
  /** Transaction times, BEGIN to COMMIT acknowledged, ms. */
  readonly p50?: number
  readonly p99?: number
  /** The run's own duration, first BEGIN to last COMMIT. */
  readonly seconds?: number
}

export interface RelayStatsLine {
  readonly event: "ready" | "stats" | "stopped"
  /** Seconds since the relay's workers started. */
  readonly t: number
  readonly published: number
  readonly retried: number
  readonly dead: number
  readonly batches: number
  /** Every claim, rows or none (txbox's relay only). */
  readonly claims?: number
  readonly rss: number
  readonly heapUsed: number
  readonly cpuSeconds: number
}

export interface RelayChildConfig {
  readonly dbUrl: string
  readonly amqpUrl: string
  readonly exchange: string
  readonly batchSize: number
  readonly workers: number
  readonly listen?: boolean
  readonly pollMs?: number
  readonly statsMs?: number
  /** "wal": the relay reads the outbox's log (its database needs wal_level = logical). @default "polling" */
  readonly source?: "polling" | "wal"
  /** The WAL relay's `batchEvery` in ms; unset: the library's default. */
  readonly batchEveryMs?: number
}

/** A relay process (support/relayProcess.ts); `send("go")` starts its workers. */
export const spawnRelay = (config: RelayChildConfig): Child<RelayStatsLine> =>
  spawnChild<RelayStatsLine>("relayProcess.ts", {
    DB_URL: config.dbUrl,
    AMQP_URL: config.amqpUrl,
    EXCHANGE: config.exchange,
    BATCH: String(config.batchSize),
    WORKERS: String(config.workers),
    LISTEN: String(config.listen ?? true),
    POLL_MS: String(config.pollMs ?? 1000),
    STATS_MS: String(config.statsMs ?? 1000),
    SOURCE: config.source ?? "polling",
    // The WAL relay's only (e2e.ts's --batch-every is a WAL knob): a polling relay keeps its default.
    BATCH_EVERY:
      config.batchEveryMs === undefined || config.source !== "wal" ? "" : String(config.batchEveryMs),
  })

/**
 * The environment of a txbox inbox process (support/inboxProcess.ts) at the library's defaults, as
 * the whole-pipeline benches run it (cost.ts, retention.ts): every knob empty, LISTEN direct.
 */
export const defaultInboxEnv = (c: {
  readonly dbUrl: string
  readonly listenUrl: string
  readonly amqpUrl: string
  readonly exchange: string
  readonly consumer: string
  readonly statsMs: number
}): Record<string, string> => ({
  DB_URL: c.dbUrl,
  LISTEN_URL: c.listenUrl,
  AMQP_URL: c.amqpUrl,
  EXCHANGE: c.exchange,
  CONSUMER: c.consumer,
  RECORD: "1",
  STATS_MS: String(c.statsMs),
  // Empty = the library's default (the bench's own environment must not set them).
  MODE: "",
  PREFETCH: "",
  TRANSACTIONS: "",
  QUEUE_TYPE: "",
  BATCH: "",
  POLL_MS: "",
  CONCURRENCY: "",
})

/** The environment of a txbox relay process (support/relayProcess.ts) at the library's defaults. */
export const defaultRelayEnv = (c: {
  readonly dbUrl: string
  readonly listenUrl: string
  readonly amqpUrl: string
  readonly exchange: string
}): Record<string, string> => ({
  DB_URL: c.dbUrl,
  LISTEN_URL: c.listenUrl,
  AMQP_URL: c.amqpUrl,
  EXCHANGE: c.exchange,
  STATS_MS: "1000",
  HEAP: "0",
  BATCH: "",
  WORKERS: "",
  POLL_MS: "",
  LISTEN: "",
})
