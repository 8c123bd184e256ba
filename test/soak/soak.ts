/**
 * The soak: real producer, relay and consumer processes against real PostgreSQL and RabbitMQ,
 * faults injected at random while they run, then a verdict counted from the tables alone: every
 * consumer applied exactly once every event of its types it is owed, each key in commit order,
 * and nothing is dead or stuck.
 *
 * The producers key two event types (OrderPlaced, and OrderPaid for half the orders) by customer,
 * interleaved in each key's sequence. Three consumers (each its own queue): "main" (two processes
 * sharing its queue) handles both types; "paid-only" handles OrderPaid alone, so its keys' numbers
 * have gaps it must not wait on; "late" handles both and starts a third into the load, so it is
 * owed only what was enqueued from its binding on (docs/ordering.md).
 *
 *   bun test/soak/soak.ts --minutes N [--driver pg|postgres.js|default] [--runtime bun|node|deno]
 *     [--mode idempotent|store-then-process] [--seed N] [--rate TX_PER_S] [--drain-timeout S]
 *     [--lost-ack-fraction F] [--relay-workers N] [--rabbit-cluster] [--no-partition-churn] [--keep-logs]
 *
 * Also `runSoak(options)` for tests (test/integration/soak.test.ts). Servers: the ones handed in
 * (`services`), else TXBOX_TEST_DATABASE_URL / TXBOX_TEST_AMQP_URL when set (then the faults that
 * need to control a server are skipped: it is not ours to restart), else a private PostgreSQL 15 and
 * RabbitMQ started here from the local binaries and stopped at the end.
 *
 * `--rabbit-cluster` (`rabbitCluster` in `runSoak`): a three-node RabbitMQ cluster on loopback
 * (test/support/rabbitCluster.ts) instead of the single node. Every relay and consumer process gets
 * the three URLs (AMQP_URL, comma-separated, which the children pass as the transport's `urls`), and
 * so does the duplicate injector; the faults add `rabbitNodeKill`: one node, picked at random,
 * SIGKILLed and booted again 2–6 s later. `rabbitRestart` stops and starts one node's broker
 * (stop_app, start_app) and `closeConnections` closes the connections on every node. Every broker
 * fault runs in one lane, one after another, and starts with the three nodes running: never more
 * than one node is down (a quorum queue needs two of its three). The verdict is the same. Only with
 * servers started here: refused (exit 2) when TXBOX_TEST_AMQP_URL is set. Not part of `npm test`
 * (three more nodes to boot); run it by hand: `npm run soak -- --minutes 2 --rabbit-cluster`.
 *
 * Exits 0 when every count is right, 1 when one is wrong (or the run broke), 2 on a bad command line.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { randomBytes } from "node:crypto"
import {
  appendFileSync,
  createWriteStream,
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
} from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import { Effect } from "effect"
import { Kysely, PostgresDialect } from "kysely"
import pg from "pg"
import postgres from "postgres"
import { migrate } from "../../src/pg.ts"
import { dropPartitions, ensurePartitions } from "../../src/storage/sql/partitions.ts"
import { type LocalPostgres, startLocalPostgres } from "../support/postgres.ts"
import { isAlive, signal as sendSignal, startWatchdog, type Watchdog } from "../support/proc.ts"
import { type ClusterNode, type RabbitCluster, startRabbitCluster } from "../support/rabbitCluster.ts"
import { type Ctl, type LocalRabbit, startLocalRabbit } from "../support/rabbitmq.ts"
import { OrderPaid, OrderPlaced } from "./contract.ts"
import {
  type ConsumerCounts,
  connections,
  createBusinessTables,
  type Db,
  diagnostics,
  drainProgress,
  registerConsumers,
  type SoakConsumer,
  settled,
  suspectMessageIds,
  type TableCounts,
  tableCounts,
} from "./tables.ts"
import { Tap } from "./tap.ts"

const HERE = dirname(fileURLToPath(import.meta.url))
const ROOT = resolve(HERE, "../..")

export type Driver = "pg" | "postgres.js"
export type ChildRuntime = "bun" | "node" | "deno"
export type Mode = "idempotent" | "store-then-process"

/** The kinds of every run (each at least once when the servers are the soak's to control). */
export const FAULT_KINDS = [
  "relayKill",
  "consumerKill",
  "closeConnections",
  "rabbitRestart",
  "pgRestart",
  "lostAck",
  "duplicates",
] as const
/** The kinds a `rabbitCluster` run adds: a node SIGKILLed and booted again. */
export const CLUSTER_FAULT_KINDS = ["rabbitNodeKill"] as const
export type FaultKind = (typeof FAULT_KINDS)[number] | (typeof CLUSTER_FAULT_KINDS)[number]
const ALL_FAULT_KINDS: ReadonlyArray<FaultKind> = [...FAULT_KINDS, ...CLUSTER_FAULT_KINDS]

type Lane = "broker" | "processes"
/** Faults of one lane are injected one after another; the two lanes run side by side. */
const LANES: Record<FaultKind, Lane> = {
  closeConnections: "broker",
  rabbitRestart: "broker",
  // One lane for every broker fault: never more than one cluster node down at a time.
  rabbitNodeKill: "broker",
  // Needs the broker up to publish: in its lane it never lands while the broker is stopped.
  duplicates: "broker",
  relayKill: "processes",
  consumerKill: "processes",
  lostAck: "processes",
  pgRestart: "processes",
}

/** A planned fault; `victim`: the process it must hit (else one picked when it lands). */
interface Planned {
  readonly at: number
  readonly kind: FaultKind
  readonly lane: Lane
  readonly victim?: Slot
}

/** Servers the caller started and lets the soak restart (a test's private pair). */
export interface SoakServices {
  readonly postgres: LocalPostgres
  readonly rabbit: LocalRabbit
}

export interface SoakOptions {
  /** Length of the load phase (producers writing, faults injected); the drain comes after. */
  readonly minutes: number
  /** The store's driver; undefined: no driver option at all, the library's default. */
  readonly driver?: Driver | undefined
  /** @default "bun" */
  readonly runtime?: ChildRuntime
  /** @default "idempotent" (then MODE is not set: the library's default mode) */
  readonly mode?: Mode
  /** Seeds the fault schedule and the choices of victims. @default random */
  readonly seed?: number
  /** Transactions per second per producer (1–3 orders each). @default 25 */
  readonly rate?: number
  /** Workers per relay process; undefined: no option, the library's default (1). */
  readonly relayWorkers?: number | undefined
  /** How long the drain may take after the producers stop. @default 180 s */
  readonly drainTimeoutMs?: number
  /** Share of deliveries after whose commit a consumer SIGKILLs itself, on top of the armed ones. @default 0.0003 */
  readonly lostAckFraction?: number
  /** Keep the logs dir when the run passes too (it is always kept when it fails). */
  readonly keepLogs?: boolean
  readonly services?: SoakServices
  /**
   * A three-node RabbitMQ cluster started here (test/support/rabbitCluster.ts) instead of the
   * single node: relays, consumers and the duplicate injector get the three URLs, and the faults
   * add `rabbitNodeKill` (one node SIGKILLed, booted again a few seconds later). Only with servers
   * the soak starts itself: not with `services`, nor with TXBOX_TEST_AMQP_URL set. @default false
   */
  readonly rabbitCluster?: boolean
  /**
   * The relays' source: `"wal"` runs every relay with `source: "wal"` (WalLog on the soak's
   * PostgreSQL, started with wal_level = logical; one reads the slot, the other stands by, both
   * sweep). With `services`, theirs must run with wal_level = logical. @default "poll" (the library's default)
   */
  readonly relaySource?: "poll" | "wal"
  /**
   * Partitions made and dropped while the load runs (`churnPartitions`). Off: the tables stay as the
   * relays and inboxes keep them (day partitions), for a comparison. @default true
   */
  readonly partitionChurn?: boolean
  /** Aborting stops the run, kills every child and stops the servers it started. */
  readonly signal?: AbortSignal
  /** Progress lines while it runs. @default console.error */
  readonly log?: (line: string) => void
}

export interface Crash {
  readonly process: string
  readonly generation: number
  readonly exit: string
  readonly atSeconds: number
  readonly tail: string
}

export interface TimelineEntry {
  /** Seconds since the run started (setup included). */
  readonly t: number
  readonly kind: FaultKind | "crash" | "stall" | "note" | "phase"
  readonly detail: string
}

export interface SoakResult {
  readonly ok: boolean
  readonly failures: ReadonlyArray<string>
  readonly driver: string
  readonly runtime: ChildRuntime
  readonly mode: Mode
  /** RabbitMQ was a three-node cluster (`rabbitCluster`). */
  readonly rabbitCluster: boolean
  readonly minutes: number
  readonly seed: number
  readonly counts: TableCounts | undefined
  /** Outbox dead + inbox dead. */
  readonly dead: number
  /** Outbox pending + inbox pending after the drain. */
  readonly stuck: number
  /** Injected per kind; the kinds of the run's setup are `faultKinds`, the others stay 0. */
  readonly faults: Readonly<Record<FaultKind, number>>
  /** The kinds this run's setup has: FAULT_KINDS, and CLUSTER_FAULT_KINDS with `rabbitCluster`. */
  readonly faultKinds: ReadonlyArray<FaultKind>
  /** Kinds that could not be injected here (a server that is not ours). */
  readonly skippedFaults: ReadonlyArray<FaultKind>
  readonly duplicateMessages: number
  readonly crashes: ReadonlyArray<Crash>
  /** Producers whose transactions hung (no commit for the last 15 s of the load, or no exit on SIGTERM). */
  readonly stalls: ReadonlyArray<string>
  readonly producers: { transactions: number; committed: number; rolledBack: number; failed: number }
  readonly drained: boolean
  readonly drainSeconds: number
  readonly loadSeconds: number
  readonly timeline: ReadonlyArray<TimelineEntry>
  readonly notes: ReadonlyArray<string>
  readonly diagnostics: ReadonlyArray<string>
  readonly logDir: string
  readonly logsKept: boolean
}

type Role = "producer" | "relay" | "consumer"

interface ProducerStats {
  transactions: number
  committed: number
  rolledBack: number
  failed: number
}

interface Proc {
  readonly slot: Slot
  readonly gen: number
  readonly pid: number
  ready: boolean
  /** Killed or stopped by the orchestrator (a fault, the end of the load, the shutdown): not a crash. */
  expected: boolean
  /** The consumer's own "lost-ack: SIGKILL after the commit of …" line, when it wrote one. */
  lostAck: string | undefined
  readonly tail: string[]
  readonly exited: Promise<Exited>
  readonly readyPromise: Promise<void>
  /** A producer's `done` line: its loop ended, its last transaction finished (then it closes its store). */
  readonly finished: Promise<void>
}

interface Exited {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
}

interface Slot {
  readonly role: Role
  readonly name: string
  /** A consumer process's consumer (its queue, its types). */
  readonly consumer: SoakConsumer | undefined
  /** False until the slot's process is due: the late consumer's, until its time in the load. */
  enabled: boolean
  gen: number
  current: Proc | undefined
  restarting: Promise<void> | undefined
  readonly producerStats: Map<number, ProducerStats>
  /** A producer's last progress line that counted more commits (orchestrator clock, ms). */
  lastCommitSeenAt: number
}

class Aborted extends Error {
  constructor() {
    super("aborted")
  }
}

const sleep = (ms: number, signal?: AbortSignal): Promise<void> =>
  new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(new Aborted())
    const onAbort = () => {
      clearTimeout(timer)
      reject(new Aborted())
    }
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort)
      resolve()
    }, ms)
    signal?.addEventListener("abort", onAbort, { once: true })
  })

const TIMEOUT = Symbol("timeout")
const withTimeout = <T>(promise: Promise<T>, ms: number): Promise<T | typeof TIMEOUT> => {
  let timer: ReturnType<typeof setTimeout> | undefined
  const timeout = new Promise<typeof TIMEOUT>((resolve) => {
    timer = setTimeout(() => resolve(TIMEOUT), ms)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

/** mulberry32: a small seeded PRNG, so a seed reproduces the fault schedule and the victims. */
const prng = (seed: number): (() => number) => {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

const message = (error: unknown): string => (error instanceof Error ? error.message : String(error))
const describeExit = (e: Exited): string => (e.signal ? `signal ${e.signal}` : `exit code ${e.code}`)

// How long a (re)started process may take to print its ready line. Generous: a restart can land
// while the database or the broker is away, and the libraries back off before they come up.
const READY_TIMEOUT_MS = 60_000
// Producers, relays and consumers of each kind.
const PROCESSES = 2
// A producer without a commit for this long at the end of the load is stalled.
const STALL_SECONDS = 15
// Re-published per duplicates fault.
const DUPLICATES_PER_FAULT = 50
// When the late consumer starts, as a share of the load phase.
const LATE_CONSUMER_AT = 1 / 3
// The share of orders paid at once: an OrderPaid after their OrderPlaced, on the same key.
const PAID_FRACTION = 0.5

/** The consumers of a run (each its own queue), and how many processes each runs. */
const consumersOf = (runId: string): Array<SoakConsumer & { readonly processes: number }> => [
  // Two processes on one queue, competing: the original soak's consumer, now of both types.
  {
    consumer: `soak-${runId}`,
    role: "main",
    types: [OrderPlaced.type, OrderPaid.type],
    joinedLate: false,
    processes: PROCESSES,
  },
  // Bound to one of a key's two types: every other number of its keys never reaches it.
  {
    consumer: `soak-${runId}-paid`,
    role: "paid-only",
    types: [OrderPaid.type],
    joinedLate: false,
    processes: 1,
  },
  // Deployed a third into the load: the keys already have numbers it never received.
  {
    consumer: `soak-${runId}-late`,
    role: "late",
    types: [OrderPlaced.type, OrderPaid.type],
    joinedLate: true,
    processes: 1,
  },
]

interface Servers {
  readonly databaseUrl: string
  /** The broker's URL, or the cluster's three (node order). */
  readonly amqpUrls: ReadonlyArray<string>
  /** Set when the soak may restart the server (it started it, or the caller handed it in). */
  readonly postgres: LocalPostgres | undefined
  readonly rabbit: LocalRabbit | undefined
  /** The three-node cluster started here, with `rabbitCluster` (then `rabbit` is undefined). */
  readonly cluster: RabbitCluster | undefined
  readonly description: string
  /** Stops what this run started. */
  readonly stop: () => Promise<void>
  readonly stopSync: () => void
}

/** Why `rabbitCluster` cannot run with these servers, if it cannot. */
export const rabbitClusterRefusal = (options: Pick<SoakOptions, "services">): string | undefined => {
  if (options.services) return "a RabbitMQ cluster run starts its own servers: it takes no services handed in"
  if (process.env.TXBOX_TEST_AMQP_URL) {
    return (
      "--rabbit-cluster starts a three-node RabbitMQ cluster of its own, and TXBOX_TEST_AMQP_URL names a " +
      "broker to use instead: unset it (env -u TXBOX_TEST_AMQP_URL ...) for a cluster run"
    )
  }
  return undefined
}

async function resolveServers(options: SoakOptions): Promise<Servers> {
  if (options.rabbitCluster) {
    const refusal = rabbitClusterRefusal(options)
    if (refusal !== undefined) throw new Error(refusal)
  }
  if (options.services) {
    const { postgres: pg, rabbit } = options.services
    return {
      databaseUrl: pg.url,
      amqpUrls: [rabbit.url],
      postgres: pg,
      rabbit,
      cluster: undefined,
      description: "PostgreSQL and RabbitMQ handed in by the caller",
      stop: async () => {},
      stopSync: () => {},
    }
  }
  const envDb = process.env.TXBOX_TEST_DATABASE_URL
  const envAmqp = process.env.TXBOX_TEST_AMQP_URL
  const [pg, rabbit, cluster] = await Promise.allSettled([
    envDb && options.relaySource !== "wal"
      ? Promise.resolve(undefined)
      : startLocalPostgres({
          name: "soak",
          ...(options.relaySource === "wal" ? { settings: ["wal_level = logical"] } : {}),
        }),
    envAmqp || options.rabbitCluster ? Promise.resolve(undefined) : startLocalRabbit(),
    options.rabbitCluster ? startRabbitCluster() : Promise.resolve(undefined),
  ])
  if (pg.status === "rejected" || rabbit.status === "rejected" || cluster.status === "rejected") {
    if (pg.status === "fulfilled") await pg.value?.stop()
    if (rabbit.status === "fulfilled") await rabbit.value?.stop()
    if (cluster.status === "fulfilled") await cluster.value?.stop()
    throw [pg, rabbit, cluster].find((r): r is PromiseRejectedResult => r.status === "rejected")!.reason
  }
  const ownPg = pg.value
  const ownRabbit = rabbit.value
  const ownCluster = cluster.value
  return {
    databaseUrl: ownPg?.url ?? envDb!,
    amqpUrls: ownCluster?.urls ?? [ownRabbit?.url ?? envAmqp!],
    postgres: ownPg,
    rabbit: ownRabbit,
    cluster: ownCluster,
    description:
      `PostgreSQL ${ownPg ? `started here (${ownPg.dir})` : "from TXBOX_TEST_DATABASE_URL"}, ` +
      (ownCluster
        ? `RabbitMQ three-node cluster started here (AMQP ports ${ownCluster.nodes.map((n) => n.port).join(", ")}; ${ownCluster.dir})`
        : `RabbitMQ ${ownRabbit ? `started here (node ${ownRabbit.node})` : "from TXBOX_TEST_AMQP_URL"}`),
    stop: async () => {
      await Promise.all([ownPg?.stop(), ownRabbit?.stop(), ownCluster?.stop()])
    },
    stopSync: () => {
      ownPg?.stopSync()
      ownRabbit?.stopSync()
      ownCluster?.stopSync()
    },
  }
}

/**
 * The harness's own connections (setup, partition churn, drain), on node-postgres. They live
 * through the PostgreSQL restarts the soak injects: postgres.js under Bun let a reset socket's
 * ECONNRESET escape as an uncaught error, which failed the running test and left its processes
 * running into the next one (the full suite, 2026-11-29). Here an idle or checked-out client whose
 * backend the restart ends emits 'error', heard below: the statement in flight fails with it.
 */
const postgresDb = (url: string, max: number): Db => {
  const pool = new pg.Pool({ connectionString: url, max })
  pool.on("error", () => {})
  pool.on("connect", (client) => client.on("error", () => {}))
  return new Kysely({ dialect: new PostgresDialect({ pool }) })
}

interface Resolved {
  readonly minutes: number
  readonly driver: Driver | undefined
  readonly runtime: ChildRuntime
  readonly mode: Mode
  readonly seed: number
  readonly rate: number
  readonly relayWorkers: number | undefined
  readonly relaySource: "poll" | "wal"
  readonly drainTimeoutMs: number
  readonly lostAckFraction: number
}

/**
 * Stops a broker (`rabbitmqctl stop_app`: listeners closed, every connection closed, connections
 * refused, while the Erlang VM stays up for rabbitmqctl; a quorum queue's data stays on disk) and
 * starts it again `downMs` later. Resolves with what was done; throws when the stop failed.
 *
 * Whatever stop_app did, start_app follows: on a loaded 2-core machine stop_app took over 60 s,
 * and one that timed out on our side still finished in the broker, which then stayed down, held
 * the drain back and failed the run for the harness's sake. start_app on a running broker does
 * nothing.
 */
export async function restartBroker(
  ctl: Ctl,
  what: string,
  downMs: number,
  signal?: AbortSignal,
  note: (text: string) => void = () => {},
): Promise<string> {
  const began = Date.now()
  let stopFailure: unknown
  try {
    await ctl(["stop_app"], 180_000)
  } catch (error) {
    stopFailure = error
  }
  const stoppedAfter = Date.now() - began
  if (stopFailure === undefined) {
    note(`${what} stopped (stop_app); starting it again in ${downMs} ms`)
    await sleep(downMs, signal)
  }
  for (let attempt = 1; ; attempt++) {
    try {
      await ctl(["start_app"], 120_000)
      break
    } catch (error) {
      if (attempt >= 3) throw new Error(`${what} did not start again: ${message(error)}`)
      await sleep(2000, signal)
    }
  }
  if (stopFailure !== undefined) {
    throw new Error(
      `${what}: stop_app failed after ${stoppedAfter} ms (started again): ${message(stopFailure)}`,
    )
  }
  return `${what} stop_app (done after ${stoppedAfter} ms), down ${downMs} ms, start_app`
}

/** One run: its children, its faults, its record. */
class Run {
  readonly slots: Slot[] = []
  readonly faults = Object.fromEntries(ALL_FAULT_KINDS.map((k) => [k, 0])) as Record<FaultKind, number>
  readonly crashes: Crash[] = []
  readonly notes: string[] = []
  readonly stalls: string[] = []
  readonly timeline: TimelineEntry[] = []
  readonly procs = new Set<Proc>()
  readonly pending = new Set<Promise<void>>()
  readonly random: () => number
  readonly bin: string
  readonly binArgs: ReadonlyArray<string>
  readonly env: NodeJS.ProcessEnv
  duplicateMessages = 0
  readonly startedAt = Date.now()
  loadStartedAt = Date.now()
  loadRunning = false
  shuttingDown = false
  tap: Tap | undefined
  readonly cfg: Resolved
  readonly servers: Servers
  readonly logDir: string
  readonly exchange: string
  /** The main consumer's name, which every consumer's name (and queue) of the run begins with. */
  readonly consumer: string
  readonly consumers: ReadonlyArray<SoakConsumer & { readonly processes: number }>
  readonly say: (line: string) => void
  readonly signal: AbortSignal | undefined

  constructor(init: {
    readonly cfg: Resolved
    readonly servers: Servers
    readonly logDir: string
    readonly dbUrl: string
    readonly exchange: string
    readonly consumers: ReadonlyArray<SoakConsumer & { readonly processes: number }>
    readonly say: (line: string) => void
    readonly signal: AbortSignal | undefined
  }) {
    const { cfg, servers, dbUrl, exchange } = init
    this.cfg = cfg
    this.servers = servers
    this.logDir = init.logDir
    this.exchange = exchange
    this.consumers = init.consumers
    this.consumer = init.consumers[0]!.consumer
    this.say = init.say
    this.signal = init.signal
    this.random = prng(cfg.seed)
    // Bun children run on this Bun; Node children on the Node 22 of devDependencies, which runs
    // the .ts sources directly (type stripping; the sources use erasable syntax only).
    // Deno children on the Deno of devDependencies, with the project's node_modules.
    this.bin =
      cfg.runtime === "node"
        ? join(ROOT, "node_modules/.bin/node")
        : cfg.runtime === "deno"
          ? join(ROOT, "node_modules/.bin/deno")
          : process.versions.bun
            ? process.execPath
            : join(ROOT, "node_modules/.bin/bun")
    this.binArgs = cfg.runtime === "deno" ? ["run", "--allow-all", "--quiet"] : []
    const env: NodeJS.ProcessEnv = { ...process.env }
    // The children read only what the soak sets: a stray DRIVER or MODE in the caller's environment
    // must not change the configuration under test.
    for (const name of [
      "DRIVER",
      "MODE",
      "LOST_ACK_FRACTION",
      "RATE",
      "ROLLBACK_FRACTION",
      "PRODUCER",
      "RELAY_WORKERS",
      "RELAY_SOURCE",
      "PAID_FRACTION",
      "CONSUMER",
      "TYPES",
    ]) {
      delete env[name]
    }
    this.env = {
      ...env,
      DB_URL: dbUrl,
      // One URL, or the cluster's, comma-separated: the children pass them as `urls` (child.ts).
      AMQP_URL: servers.amqpUrls.join(","),
      EXCHANGE: exchange,
      ...(cfg.driver === undefined ? {} : { DRIVER: cfg.driver }),
      ...(cfg.relayWorkers === undefined ? {} : { RELAY_WORKERS: String(cfg.relayWorkers) }),
      ...(cfg.relaySource === "wal" ? { RELAY_SOURCE: "wal" } : {}),
    }
    const slot = (role: Role, name: string, consumer?: SoakConsumer): Slot => ({
      role,
      name,
      consumer,
      enabled: !consumer?.joinedLate,
      gen: 0,
      current: undefined,
      restarting: undefined,
      producerStats: new Map(),
      lastCommitSeenAt: Date.now(),
    })
    // consumer-1 and consumer-2 are the main consumer's, as before; the others are named by role.
    for (const c of this.consumers) {
      for (let i = 1; i <= c.processes; i++)
        this.slots.push(slot("consumer", c.role === "main" ? `consumer-${i}` : `consumer-${c.role}`, c))
    }
    for (const role of ["relay", "producer"] as const) {
      for (let i = 1; i <= PROCESSES; i++) this.slots.push(slot(role, `${role}-${i}`))
    }
  }

  /** The late consumer's process slot. */
  get lateSlot(): Slot {
    return this.slots.find((s) => s.consumer?.joinedLate)!
  }

  /** Seconds since the run started (the timeline's clock). */
  get seconds(): number {
    return Math.round((Date.now() - this.startedAt) / 100) / 10
  }

  /** `began`: when what is recorded started (a restart that took seconds is placed at its start). */
  record(kind: TimelineEntry["kind"], detail: string, began?: number): void {
    const t = began === undefined ? this.seconds : Math.round((began - this.startedAt) / 100) / 10
    const entry = { t, kind, detail }
    this.timeline.push(entry)
    appendFileSync(
      join(this.logDir, "soak.log"),
      `${new Date().toISOString()} +${entry.t}s ${kind}: ${detail}\n`,
    )
    this.say(`[soak +${entry.t}s] ${kind}: ${detail.split("\n")[0]}`)
  }

  fault(kind: FaultKind, detail: string, began?: number): void {
    this.faults[kind]++
    this.record(kind, detail, began)
  }

  note(detail: string): void {
    this.notes.push(detail)
    this.record("note", detail)
  }

  private envFor(slot: Slot): NodeJS.ProcessEnv {
    if (slot.role === "consumer") {
      return {
        ...this.env,
        CONSUMER: slot.consumer!.consumer,
        TYPES: slot.consumer!.types.join(","),
        LOST_ACK_FRACTION: String(this.cfg.lostAckFraction),
        // Idempotent is the library's default mode: then MODE stays unset and no option is passed.
        ...(this.cfg.mode === "idempotent" ? {} : { MODE: this.cfg.mode }),
      }
    }
    if (slot.role === "producer") {
      return {
        ...this.env,
        RATE: String(this.cfg.rate),
        ROLLBACK_FRACTION: "0.1",
        PAID_FRACTION: String(PAID_FRACTION),
        PRODUCER: slot.name,
      }
    }
    return this.env
  }

  private spawn(slot: Slot): Proc {
    const gen = ++slot.gen
    const script = join(HERE, `${slot.role}.ts`)
    const logPath = join(this.logDir, `${slot.name}.log`)
    appendFileSync(
      logPath,
      `===== ${new Date().toISOString()} ${slot.name} generation ${gen}: ${this.bin} ${script}\n`,
    )
    // detached: a Ctrl-C on the terminal reaches the orchestrator alone, which then stops every
    // child itself; the watchdog SIGKILLs the child if the orchestrator dies without doing so.
    const child: ChildProcess = spawn(this.bin, [...this.binArgs, script], {
      cwd: ROOT,
      env: this.envFor(slot),
      stdio: ["ignore", "pipe", "pipe"],
      detached: true,
    })
    const pid = child.pid ?? -1
    const watchdog: Watchdog | undefined =
      pid > 0 ? startWatchdog('kill -KILL "$1" 2>/dev/null', [String(pid)]) : undefined
    const log = createWriteStream(logPath, { flags: "a" })
    let markReady: () => void = () => {}
    let failReady: (e: Error) => void = () => {}
    const readyPromise = new Promise<void>((resolve, reject) => {
      markReady = resolve
      failReady = reject
    })
    readyPromise.catch(() => {})
    let settle: (e: Exited) => void = () => {}
    const exited = new Promise<Exited>((resolve) => {
      settle = resolve
    })
    let markFinished: () => void = () => {}
    const finished = new Promise<void>((resolve) => {
      markFinished = resolve
    })
    const proc: Proc = {
      slot,
      gen,
      pid,
      ready: false,
      expected: false,
      lostAck: undefined,
      tail: [],
      exited,
      readyPromise,
      finished,
    }
    this.procs.add(proc)
    slot.current = proc
    slot.lastCommitSeenAt = Date.now()

    const onLine = (stream: "out" | "err", line: string) => {
      proc.tail.push(line)
      if (proc.tail.length > 80) proc.tail.shift()
      if (stream === "out") {
        if (line === `${slot.role} started`) {
          proc.ready = true
          markReady()
        } else if (line.startsWith("progress ") || line.startsWith("done ")) {
          if (line.startsWith("done ")) markFinished()
          try {
            const stats = JSON.parse(line.slice(line.indexOf(" ") + 1)) as ProducerStats
            if (stats.committed > (slot.producerStats.get(gen)?.committed ?? 0))
              slot.lastCommitSeenAt = Date.now()
            slot.producerStats.set(gen, stats)
          } catch {}
        }
      } else if (line.includes("lost-ack: SIGKILL")) {
        proc.lostAck = line.slice(line.indexOf("lost-ack:"))
      }
    }
    const reader = (stream: "out" | "err") => {
      let buffer = ""
      return (chunk: Buffer) => {
        log.write(chunk)
        buffer += chunk.toString()
        for (let i = buffer.indexOf("\n"); i >= 0; i = buffer.indexOf("\n")) {
          onLine(stream, buffer.slice(0, i))
          buffer = buffer.slice(i + 1)
        }
      }
    }
    child.stdout?.on("data", reader("out"))
    child.stderr?.on("data", reader("err"))
    let done = false
    const finish = (e: Exited) => {
      if (done) return
      done = true
      watchdog?.cancel()
      log.end(`===== ${new Date().toISOString()} ${slot.name} generation ${gen} ended: ${describeExit(e)}\n`)
      failReady(new Error(`${slot.name} ended before it was ready: ${describeExit(e)}`))
      settle(e)
      this.onExit(proc, e)
    }
    // "close", not "exit": the last lines (a lost-ack line, a crash's stack) are read by then.
    child.on("close", (code, sig) => finish({ code, signal: sig }))
    child.on("error", (error) => {
      log.write(`spawn error: ${message(error)}\n`)
      finish({ code: -1, signal: null })
    })
    return proc
  }

  private onExit(proc: Proc, e: Exited): void {
    const { slot } = proc
    if (slot.current === proc) slot.current = undefined
    if (proc.expected) return
    if (this.shuttingDown) {
      this.note(`${slot.name} gen ${proc.gen} ended by itself during the shutdown: ${describeExit(e)}`)
      return
    }
    if (proc.lostAck !== undefined && e.signal === "SIGKILL") {
      this.fault("lostAck", `${slot.name} gen ${proc.gen}: ${proc.lostAck}`)
      // One that committed before its ready line is started again by the ensureRunning loop that
      // started it: restarting it here too ran two processes in the slot, one of them untracked.
      if (proc.ready) this.restartLater(slot, 500)
      return
    }
    const tail = proc.tail.slice(-40).join("\n")
    this.crashes.push({
      process: slot.name,
      generation: proc.gen,
      exit: describeExit(e),
      atSeconds: this.seconds,
      tail,
    })
    this.record(
      "crash",
      `${slot.name} gen ${proc.gen} (pid ${proc.pid}) ended by itself: ${describeExit(e)}` +
        (proc.ready ? "; restarting it, as a supervisor would" : " before it was ready") +
        `\n${tail}`,
    )
    // One that never got ready is retried by the ensureRunning loop that started it.
    if (proc.ready) this.restartLater(slot, 1000)
  }

  private restartLater(slot: Slot, delayMs: number): void {
    const restart: Promise<void> = (async () => {
      await sleep(delayMs)
      await this.ensureRunning(slot)
    })()
      .catch((error) => this.note(`restarting ${slot.name} failed: ${message(error)}`))
      .finally(() => {
        this.pending.delete(restart)
        if (slot.restarting === restart) slot.restarting = undefined
      })
    slot.restarting = restart
    this.pending.add(restart)
  }

  private wanted(slot: Slot): boolean {
    return !this.shuttingDown && slot.enabled && (slot.role !== "producer" || this.loadRunning)
  }

  /** Starts the slot's process and waits for its ready line, starting it again until it gets there. */
  async ensureRunning(slot: Slot): Promise<void> {
    while (this.wanted(slot)) {
      const proc = this.spawn(slot)
      const outcome = await withTimeout(
        proc.readyPromise.then(
          () => "ready" as const,
          () => "ended" as const,
        ),
        READY_TIMEOUT_MS,
      )
      if (outcome === "ready") return
      if (outcome === TIMEOUT) {
        proc.expected = true
        sendSignal(proc.pid, "SIGKILL")
        await proc.exited
        this.note(
          `${slot.name} gen ${proc.gen} printed no ready line within ${READY_TIMEOUT_MS / 1000} s: killed, starting it again\n` +
            proc.tail.slice(-20).join("\n"),
        )
      }
      await sleep(1000, this.signal)
    }
  }

  private async awaitRunning(slot: Slot): Promise<Slot | undefined> {
    const deadline = Date.now() + 30_000
    while (Date.now() < deadline) {
      if (slot.current?.ready && !slot.current.expected) return slot
      await sleep(250, this.signal)
    }
    return undefined
  }

  private async pickRunning(role: Role): Promise<Slot | undefined> {
    const deadline = Date.now() + 30_000
    while (Date.now() < deadline) {
      const running = this.slots.filter((s) => s.role === role && s.current?.ready && !s.current.expected)
      if (running.length > 0) return running[Math.floor(this.random() * running.length)]
      await sleep(250, this.signal)
    }
    return undefined
  }

  private async awaitRestart(slot: Slot): Promise<void> {
    for (let i = 0; i < 20 && slot.restarting === undefined && slot.current === undefined; i++)
      await sleep(50)
    if (slot.restarting) await withTimeout(slot.restarting, 90_000)
  }

  /** `victim`'s process once it runs (the planned kill of the late consumer), else one picked at random. */
  private async kill(kind: FaultKind, role: Role, victim?: Slot): Promise<void> {
    const slot = victim ? await this.awaitRunning(victim) : await this.pickRunning(role)
    const proc = slot?.current
    if (!slot || !proc) return this.note(`${kind}: no running ${victim?.name ?? role} for 30 s, not injected`)
    const began = Date.now()
    proc.expected = true
    sendSignal(proc.pid, "SIGKILL")
    await proc.exited
    const downMs = Math.round(500 + this.random() * 2500)
    this.fault(
      kind,
      `${slot.name} gen ${proc.gen} (pid ${proc.pid}) SIGKILLed; restarting in ${downMs} ms`,
      began,
    )
    await sleep(downMs, this.signal)
    await this.ensureRunning(slot)
  }

  private async lostAck(): Promise<void> {
    const slot = await this.pickRunning("consumer")
    const proc = slot?.current
    if (!slot || !proc) return this.note("lostAck: no running consumer for 30 s, not injected")
    // The consumer SIGKILLs itself right after its next commit, before the ack; onExit counts it.
    sendSignal(proc.pid, "SIGUSR2")
    this.record("note", `lost ack armed on ${slot.name} gen ${proc.gen}`)
    // Up to a minute: the broker may be away meanwhile (the other lane's faults), and then no
    // delivery comes.
    if ((await withTimeout(proc.exited, 60_000)) === TIMEOUT) {
      return this.note(`lostAck: ${slot.name} committed nothing within 60 s of being armed (it stays armed)`)
    }
    await this.awaitRestart(slot)
  }

  /** `what`: the broker, or the cluster node, whose `ctl` it is. */
  private async rabbitRestart(ctl: Ctl, what: string): Promise<void> {
    const began = Date.now()
    const downMs = Math.round(2000 + this.random() * 4000)
    const done = await restartBroker(ctl, what, downMs, this.signal, (note) => this.record("note", note))
    this.fault("rabbitRestart", `${done} (up at +${this.seconds}s)`, began)
  }

  /**
   * Every node of the cluster running before a node fault: one left down by a fault that failed
   * is booted again first, so that at most one node is ever down (a quorum needs two of three).
   */
  private async allNodesRunning(cluster: RabbitCluster): Promise<void> {
    for (const node of cluster.nodes) {
      if (!node.isRunning()) {
        this.note(`node ${node.index} (${node.node}) found down before a node fault: booting it again`)
        await node.restart()
      }
    }
    await cluster.awaitRunning(cluster.nodes.length, 60_000)
  }

  /**
   * Held while a cluster node is down (a kill or a restart, until it runs again) and while the late
   * consumer declares its queue: the two never overlap. RabbitMQ before 3.12 starts the member of a
   * quorum queue on a node that was down when the queue was declared with the wrong settings
   * (rabbitmq-server#10007, fixed by #10034): in a run that declared the late consumer's queue during
   * a node kill, that consumer never received ~50 messages (docs/production.md says to deploy new
   * consumers with every node up).
   */
  private nodesSettled: Promise<void> = Promise.resolve()

  /** Runs `work` once no node fault and no late consumer's first start is under way, holding them off meanwhile. */
  private withNodesSettled<A>(work: () => Promise<A>): Promise<A> {
    const run = this.nodesSettled.then(work)
    this.nodesSettled = run.then(
      () => undefined,
      () => undefined,
    )
    return run
  }

  private pickNode(cluster: RabbitCluster): ClusterNode {
    return cluster.nodes[Math.floor(this.random() * cluster.nodes.length)]!
  }

  /** One cluster node SIGKILLed (a crash: no goodbye to clients or peers), booted again 2–6 s later. */
  private rabbitNodeKill(cluster: RabbitCluster): Promise<void> {
    return this.withNodesSettled(() => this.rabbitNodeKillNow(cluster))
  }

  private async rabbitNodeKillNow(cluster: RabbitCluster): Promise<void> {
    await this.allNodesRunning(cluster)
    const node = this.pickNode(cluster)
    const pid = node.pid()
    const began = Date.now()
    await node.kill()
    const downMs = Math.round(2000 + this.random() * 4000)
    this.record(
      "note",
      `RabbitMQ node ${node.index} (port ${node.port}, pid ${pid}) SIGKILLed; booting it again in ${downMs} ms`,
    )
    await sleep(downMs, this.signal)
    const booting = Date.now()
    await node.restart()
    this.fault(
      "rabbitNodeKill",
      `RabbitMQ node ${node.index} (port ${node.port}, pid ${pid}) SIGKILLed, down ${downMs} ms, booted again ` +
        `in ${Date.now() - booting} ms (three running at +${this.seconds}s)`,
      began,
    )
  }

  async inject(kind: FaultKind, victim?: Slot): Promise<void> {
    const { postgres: pg, rabbit, cluster } = this.servers
    switch (kind) {
      case "relayKill":
        return this.kill(kind, "relay")
      case "consumerKill":
        return this.kill(kind, "consumer", victim)
      case "lostAck":
        return this.lostAck()
      case "closeConnections": {
        const began = Date.now()
        if (cluster) {
          // Asked of one node, it closes the vhost's connections on every node (connection tracking is cluster-wide).
          await this.allNodesRunning(cluster)
          await this.pickNode(cluster).ctl(["close_all_connections", "-p", "/", "txbox soak: injected fault"])
        } else await rabbit!.closeAllConnections("txbox soak: injected fault")
        return this.fault(kind, `rabbitmqctl close_all_connections (${Date.now() - began} ms)`, began)
      }
      case "rabbitRestart":
        if (cluster) {
          // One node's broker stopped and started (stop_app, start_app), the others serve meanwhile.
          return this.withNodesSettled(async () => {
            await this.allNodesRunning(cluster)
            const node = this.pickNode(cluster)
            await this.rabbitRestart(node.ctl, `RabbitMQ node ${node.index} (port ${node.port})`)
            await cluster.awaitRunning(cluster.nodes.length, 60_000)
          })
        }
        return this.rabbitRestart((args, timeoutMs) => rabbit!.ctl(args, timeoutMs), "RabbitMQ")
      case "rabbitNodeKill":
        return this.rabbitNodeKill(cluster!)
      case "pgRestart": {
        const began = Date.now()
        await pg!.restart()
        return this.fault(kind, `pg_ctl restart -m fast (${Date.now() - began} ms)`, began)
      }
      case "duplicates": {
        const ids = await this.tap!.republish(DUPLICATES_PER_FAULT)
        if (ids.length === 0) return this.note("duplicates: no message captured yet, nothing re-published")
        this.duplicateMessages += ids.length
        return this.fault(
          kind,
          `${ids.length} delivered messages re-published with their messageId (e.g. ${ids[0]})`,
        )
      }
    }
  }

  /** The kinds of this run's setup: the cluster's node kill only with a cluster. */
  get kinds(): ReadonlyArray<FaultKind> {
    return this.servers.cluster ? ALL_FAULT_KINDS : FAULT_KINDS
  }

  /** Kinds this run can inject: server faults need a server the soak may restart. */
  enabledKinds(): FaultKind[] {
    const ownBroker = this.servers.rabbit !== undefined || this.servers.cluster !== undefined
    return this.kinds.filter((kind) => {
      if (kind === "pgRestart") return this.servers.postgres !== undefined
      if (kind === "closeConnections" || kind === "rabbitRestart") return ownBroker
      return true
    })
  }

  /**
   * Every enabled kind at least once, about once a minute each in a long run (six each in five
   * minutes), at random times between 10 % and 70 % of the load phase. Two lanes run side by side,
   * each one fault after another: the broker's (rabbitmqctl takes seconds per call, more under
   * load) and the rest. So faults of different lanes can overlap, as they do in production.
   * Consumer faults pick among the consumer processes running then, the late one included once
   * started; one more consumerKill is aimed at the late consumer, a few seconds after it starts
   * (`lateAt`) and before 70 % of the load, so that every run restarts it on its binding.
   */
  schedule(loadMs: number, lateAt: number): Planned[] {
    const perKind = Math.max(1, Math.round((loadMs / 60_000) * 1.2))
    const events: Planned[] = this.enabledKinds().flatMap((kind) =>
      Array.from({ length: perKind }, () => ({
        kind,
        lane: LANES[kind],
        at: Math.round(loadMs * (0.1 + 0.6 * this.random())),
      })),
    )
    const earliest = lateAt + 3000
    events.push({
      kind: "consumerKill",
      lane: LANES.consumerKill,
      at: Math.round(earliest + Math.max(0, loadMs * 0.7 - earliest) * this.random()),
      victim: this.lateSlot,
    })
    return events.sort((a, b) => a.at - b.at)
  }

  /** Starts the late consumer `lateAt` into the load: from its binding on, it is owed every event of its types. */
  async startLate(lateAt: number): Promise<void> {
    const wait = this.loadStartedAt + lateAt - Date.now()
    if (wait > 0) await sleep(wait, this.signal)
    const slot = this.lateSlot
    this.record(
      "phase",
      `starting the late consumer ${slot.consumer!.consumer} (${slot.consumer!.types.join(", ")}): ` +
        "owed what is enqueued from its binding on",
    )
    slot.enabled = true
    const cluster = this.servers.cluster
    if (cluster === undefined) return this.ensureRunning(slot)
    await this.withNodesSettled(async () => {
      await this.allNodesRunning(cluster)
      await this.ensureRunning(slot)
    })
  }

  async injectAll(plan: ReadonlyArray<Planned>): Promise<void> {
    const lane = async (name: Lane) => {
      for (const { at, kind, victim } of plan.filter((p) => p.lane === name)) {
        const wait = this.loadStartedAt + at - Date.now()
        if (wait > 0) await sleep(wait, this.signal)
        try {
          await this.inject(kind, victim)
        } catch (error) {
          if (error instanceof Aborted) throw error
          this.note(`${kind} could not be injected: ${message(error)}`)
        }
      }
    }
    await Promise.all([lane("broker"), lane("processes")])
  }

  /**
   * Stops the producers (SIGTERM: each finishes its transaction and exits). A producer that
   * committed nothing for the last 15 s of the load, or that cannot finish its transaction, is
   * stalled: its store (the library's pool) hangs, and the run proved less than it should have.
   */
  async stopProducers(): Promise<void> {
    this.loadRunning = false
    await Promise.all(
      this.slots
        .filter((s) => s.role === "producer")
        .map(async (slot) => {
          const proc = slot.current
          const idle = Math.round((Date.now() - slot.lastCommitSeenAt) / 1000)
          if (idle >= STALL_SECONDS) {
            const last = JSON.stringify(slot.producerStats.get(slot.gen) ?? {})
            this.stall(
              `${slot.name} committed nothing in the last ${idle} s of the load (last progress: ${last})`,
            )
          }
          if (!proc) return
          proc.expected = true
          sendSignal(proc.pid, "SIGTERM")
          const started = Date.now()
          // The transaction is what must finish (its `done` line); closing the store after it may take
          // the store's own shutdown bound (postgres.js: up to 10 s for a connection still held).
          if ((await withTimeout(Promise.race([proc.finished, proc.exited]), 10_000)) === TIMEOUT) {
            this.stall(`${slot.name} did not finish its transaction within 10 s of SIGTERM (killed)`)
            sendSignal(proc.pid, "SIGKILL")
            await proc.exited
            return
          }
          if ((await withTimeout(proc.exited, 15_000)) === TIMEOUT) {
            this.note(`${slot.name} finished its transaction but had not exited 15 s later: SIGKILL`)
            sendSignal(proc.pid, "SIGKILL")
            await proc.exited
          } else if (Date.now() - started > 5_000) {
            this.note(
              `${slot.name} exited ${Math.round((Date.now() - started) / 100) / 10} s after SIGTERM (closing its store)`,
            )
          }
        }),
    )
  }

  stall(detail: string): void {
    this.stalls.push(detail)
    this.record("stall", detail)
  }

  /** SIGTERM, then SIGKILL after 10 s: a graceful stop that hangs is noted, not a verdict. */
  async stopAll(): Promise<void> {
    this.shuttingDown = true
    await Promise.all(
      this.slots.map(async (slot) => {
        const proc = slot.current
        if (!proc) return
        proc.expected = true
        sendSignal(proc.pid, "SIGTERM")
        const exited = await withTimeout(proc.exited, 10_000)
        if (exited === TIMEOUT) {
          this.note(`${slot.name} gen ${proc.gen} did not stop within 10 s of SIGTERM: SIGKILL`)
          sendSignal(proc.pid, "SIGKILL")
          await proc.exited
        } else if (exited.code !== 0) {
          this.note(`${slot.name} gen ${proc.gen} stopped on SIGTERM with ${describeExit(exited)}`)
        }
      }),
    )
  }

  killAllSync(): void {
    this.shuttingDown = true
    for (const proc of this.procs) {
      proc.expected = true
      if (isAlive(proc.pid)) sendSignal(proc.pid, "SIGKILL")
    }
  }

  producerTotals(): SoakResult["producers"] {
    const total = { transactions: 0, committed: 0, rolledBack: 0, failed: 0 }
    for (const slot of this.slots) {
      for (const s of slot.producerStats.values()) {
        total.transactions += s.transactions
        total.committed += s.committed
        total.rolledBack += s.rolledBack
        total.failed += s.failed
      }
    }
    return total
  }
}

/** Frequent log lines that look like trouble, per log file, for the report of a failed run. */
function logHighlights(logDir: string): string[] {
  const out: string[] = []
  const interesting = /error|exception|fail|timed? ?out|refused|reset|uncaught|warn|closed|lost|hang|stuck/i
  for (const file of readdirSafe(logDir).filter((f) => f.endsWith(".log") && f !== "soak.log")) {
    const counts = new Map<string, { n: number; example: string }>()
    for (const line of readFileSync(join(logDir, file), "utf8").split("\n")) {
      // Not the soak's own lines: banners, producer counters, the lost acks it asked for.
      if (!interesting.test(line) || /^(=====|progress |done )/.test(line) || line.includes("lost-ack"))
        continue
      const key = line
        .replace(/\d{4}-\d\d-\d\dT[\d:.]+Z?/g, "<time>")
        .replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/gi, "<uuid>")
        .replace(/\d+/g, "<n>")
        .slice(0, 200)
      const seen = counts.get(key)
      if (seen) seen.n++
      else counts.set(key, { n: 1, example: line.length > 300 ? `${line.slice(0, 300)}…` : line })
    }
    const top = [...counts.values()].sort((a, b) => b.n - a.n).slice(0, 8)
    if (top.length > 0) {
      out.push(`${file}:`)
      for (const { n, example } of top) out.push(`  ${String(n).padStart(5)} × ${example}`)
    }
  }
  return out
}

/** The last `n` lines of each process's log, cut to a readable width. */
function logTails(logDir: string, n: number): string[] {
  return readdirSafe(logDir)
    .filter((f) => f.endsWith(".log") && f !== "soak.log")
    .flatMap((file) => {
      const lines = readFileSync(join(logDir, file), "utf8")
        .split("\n")
        .filter((l) => l.trim() !== "")
      return [`${file}:`, ...lines.slice(-n).map((l) => `  | ${l.length > 240 ? `${l.slice(0, 240)}…` : l}`)]
    })
}

/** Every log line (any process, any generation) that names one of `ids`: where each message went. */
function traceMessages(logDir: string, what: string, ids: ReadonlyArray<string>): string[] {
  if (ids.length === 0) return []
  const files = readdirSafe(logDir).filter((f) => f.endsWith(".log"))
  const texts = files.map((f) => ({ f, lines: readFileSync(join(logDir, f), "utf8").split("\n") }))
  const out = [`${what} messages traced through the logs (a "handle" line is a handler run):`]
  for (const id of ids) {
    const hits = texts.flatMap(({ f, lines }) =>
      lines.filter((l) => l.includes(id)).map((l) => `    ${f}: ${l}`),
    )
    out.push(
      `  ${id}: ${hits.length === 0 ? "in no log line: no handler ever ran it (lost before a handler, e.g. on the broker, or only failed before it)" : `${hits.length} lines`}`,
    )
    out.push(...hits.slice(0, 12))
  }
  return out
}

function readdirSafe(path: string): string[] {
  try {
    return readdirSync(path).sort()
  } catch {
    return []
  }
}

export const driverLabel = (driver: Driver | undefined): string => driver ?? "default (no driver option)"

/** Runs one soak and returns its verdict; never throws for a failed count (that is `ok: false`). */
/**
 * Partitions in the soak (issue #26): the outbox and the inbox in partitions of PARTITION_MS, made
 * ahead and dropped while the load runs, as `txbox partitions drop` would: an outbox partition once
 * it ended OUTBOX_KEEP_MS ago with no pending row (its dead rows archived), an inbox one once it and
 * its last processed row are INBOX_WINDOW_MS old (the dedupe window: a redelivery older than that
 * would be applied again, and the verdict would count it). The verdict reads the tables through
 * views that outlive the dropped rows (tables.ts).
 */
const PARTITION_MS = 60_000
const PARTITIONS_AHEAD_MS = 120_000
const OUTBOX_KEEP_MS = 30_000
const INBOX_WINDOW_MS = 120_000
const CHURN_EVERY_MS = 10_000
/** Made before any process starts, past the load and a typical drain: attaching one later waits on the claims' locks. */
const PARTITIONS_AT_START_MS = 360_000

/** Makes partitions ahead and drops old ones every CHURN_EVERY_MS until `stop` resolves; returns what it dropped. */
const churnPartitions = async (
  dbUrl: string,
  stop: Promise<void>,
  note: (line: string) => void,
): Promise<{ outbox: number; inbox: number; archived: number; failures: number }> => {
  const dropped = { outbox: 0, inbox: 0, archived: 0, failures: 0 }
  let stopped = false
  void stop.then(() => {
    stopped = true
  })
  while (!stopped) {
    // A pool of its own per pass, given up on when it hangs: a connection cut by a fault (a
    // PostgreSQL restart) mid-transaction can leave a pool's only connection reserved for good.
    const db = postgresDb(dbUrl, 2)
    const tables = { db, schema: "txbox" }
    try {
      const decisions = await Effect.runPromise(
        Effect.andThen(
          ensurePartitions(tables, { aheadMs: PARTITIONS_AHEAD_MS, everyMs: PARTITION_MS }),
          dropPartitions(tables, { olderThanMs: OUTBOX_KEEP_MS, dedupeWindowMs: INBOX_WINDOW_MS }),
        ).pipe(Effect.timeout("30 seconds")),
      )
      for (const d of decisions.filter((x) => x.dropped)) {
        dropped[d.table]++
        dropped.archived += d.archived
      }
    } catch (error) {
      // A PostgreSQL restart (a fault), a lock not granted in time, a pass cut off: the next tries again.
      dropped.failures++
      if (dropped.failures <= 3)
        note(`partitions: ${error instanceof Error ? error.message.split("\n")[0] : String(error)}`)
    }
    void Promise.race([db.destroy(), sleep(5000)]).catch(() => {})
    await Promise.race([sleep(CHURN_EVERY_MS), stop])
  }
  return dropped
}

export async function runSoak(options: SoakOptions): Promise<SoakResult> {
  const say = options.log ?? ((line: string) => console.error(line))
  const cfg: Resolved = {
    minutes: options.minutes,
    driver: options.driver,
    runtime: options.runtime ?? "bun",
    mode: options.mode ?? "idempotent",
    seed: options.seed ?? randomBytes(4).readUInt32LE(0),
    rate: options.rate ?? 25,
    relayWorkers: options.relayWorkers,
    relaySource: options.relaySource ?? "poll",
    drainTimeoutMs: options.drainTimeoutMs ?? 180_000,
    lostAckFraction: options.lostAckFraction ?? 0.0003,
  }
  if (!(cfg.minutes > 0)) throw new Error(`minutes must be positive, got ${cfg.minutes}`)
  if (cfg.runtime !== "bun" && !existsSync(join(ROOT, `node_modules/.bin/${cfg.runtime}`))) {
    throw new Error(
      `node_modules/.bin/${cfg.runtime} not found: run npm install (Node 22 and Deno are devDependencies)`,
    )
  }
  const loadMs = Math.round(cfg.minutes * 60_000)
  const logDir = mkdtempSync(join(tmpdir(), "txbox-soak-logs-"))
  say(
    `[soak] driver ${driverLabel(cfg.driver)}, runtime ${cfg.runtime}, mode ${cfg.mode}, ` +
      `${options.rabbitCluster ? "RabbitMQ three-node cluster, " : ""}` +
      `${cfg.relayWorkers === undefined ? "" : `relay workers ${cfg.relayWorkers}, `}` +
      `${cfg.relaySource === "wal" ? "relays reading the WAL, " : ""}` +
      `load ${loadMs / 1000} s, seed ${cfg.seed}; logs in ${logDir}`,
  )

  const runId = `${Date.now().toString(36)}${randomBytes(3).toString("hex")}`
  const dbName = `soak_${runId}`
  const failures: string[] = []
  const diag: string[] = []
  let servers: Servers | undefined
  let run: Run | undefined
  let db: Db | undefined
  let counts: TableCounts | undefined
  let drained = false
  let drainSeconds = 0
  let loadSeconds = 0
  let aborted = false
  const onAbort = () => run?.killAllSync()
  options.signal?.addEventListener("abort", onAbort, { once: true })

  try {
    servers = await resolveServers(options)
    say(`[soak] ${servers.description}`)
    const serverUrl = new URL(servers.databaseUrl)
    const admin = postgres(servers.databaseUrl, { max: 1, onnotice: () => {} })
    try {
      await admin.unsafe(`CREATE DATABASE "${dbName}"`)
    } finally {
      await admin.end({ timeout: 5 })
    }
    serverUrl.pathname = `/${dbName}`
    const dbUrl = serverUrl.toString()
    const consumers = consumersOf(runId)
    const setup = postgresDb(dbUrl, 2)
    try {
      await Effect.runPromise(migrate(setup))
      await createBusinessTables(setup)
      // What each consumer is owed is counted from this table: written before any of them starts.
      await registerConsumers(setup, consumers)
      // The run's partitions, before any process writes: no row of the run in the default partition.
      if (options.partitionChurn !== false)
        await Effect.runPromise(
          ensurePartitions(
            { db: setup, schema: "txbox" },
            { aheadMs: loadMs + PARTITIONS_AT_START_MS, everyMs: PARTITION_MS, includeCurrent: true },
          ),
        )
    } finally {
      await setup.destroy()
    }

    // Names per run, so that runs sharing a broker never see each other's messages.
    run = new Run({
      cfg,
      servers,
      logDir,
      dbUrl,
      exchange: `txbox.soak-${runId}`,
      consumers,
      say,
      signal: options.signal,
    })
    const r = run
    r.record(
      "phase",
      `database ${dbName}, exchange ${r.exchange}, consumers ` +
        consumers.map((c) => `${c.consumer} (${c.role}: ${c.types.join(", ")})`).join(", "),
    )
    let endChurn = () => {}
    const churnEnds = new Promise<void>((resolve) => {
      endChurn = resolve
    })
    const churn =
      options.partitionChurn === false
        ? Promise.resolve({ outbox: 0, inbox: 0, archived: 0, failures: 0 })
        : churnPartitions(dbUrl, churnEnds, (line) => r.note(line))
    // Consumers first: their queue must be bound before the relays publish (mandatory publishes
    // to no queue would be returned, retried and finally dead). Not the late one: its time comes.
    await Promise.all(
      r.slots.filter((s) => s.role === "consumer" && s.enabled).map((s) => r.ensureRunning(s)),
    )
    await Promise.all(r.slots.filter((s) => s.role === "relay").map((s) => r.ensureRunning(s)))
    r.tap = new Tap(servers.amqpUrls, r.exchange, r.random)
    await r.tap.start()
    r.loadRunning = true
    r.loadStartedAt = Date.now()
    await Promise.all(r.slots.filter((s) => s.role === "producer").map((s) => r.ensureRunning(s)))
    const lateAt = Math.round(loadMs * LATE_CONSUMER_AT)
    const plan = r.schedule(loadMs, lateAt)
    r.record(
      "phase",
      `load: ${loadMs / 1000} s; late consumer at ${lateAt / 1000} s; faults planned (s into the load): ` +
        plan.map((p) => `${p.kind}${p.victim ? `(${p.victim.name})` : ""}@${p.at / 1000}`).join(", "),
    )
    const skipped = r.kinds.filter((k) => !r.enabledKinds().includes(k))
    if (skipped.length > 0) r.note(`not injected (the server is not ours to control): ${skipped.join(", ")}`)

    // The load lasts its length, or until the last planned fault is done (or the late consumer
    // is up) if that is later.
    await Promise.all([sleep(loadMs, options.signal), r.injectAll(plan), r.startLate(lateAt)])
    loadSeconds = Math.round((Date.now() - r.loadStartedAt) / 100) / 10
    r.record("phase", "stopping the producers")
    await r.stopProducers()
    // A process being restarted (a fault near the end) must be up before the drain is timed.
    await withTimeout(Promise.allSettled([...r.pending]), 90_000)

    // A fresh client: the faults are over, and the verdict must not depend on a connection that
    // lived through them.
    db = postgresDb(dbUrl, 2)
    const drainStarted = Date.now()
    r.record("phase", "drain: waiting until every owed event has its effect and no row is pending")
    let lastReport = 0
    // Past the bound, a drain still going down gets more time (up to DRAIN_STRETCH× the bound): a load that the
    // faults stretched owes more, and a slow drain is not a stuck one. One that stalls for the last
    // DRAIN_STALL_MS past the bound fails.
    let lastWaiting = Number.POSITIVE_INFINITY
    let lastFallAt = Date.now()
    for (;;) {
      const progress = await drainProgress(db)
      if (settled(progress)) {
        drained = true
        break
      }
      if (progress.waiting < lastWaiting) {
        lastWaiting = progress.waiting
        lastFallAt = Date.now()
      }
      const elapsed = Date.now() - drainStarted
      if (
        elapsed > cfg.drainTimeoutMs &&
        (Date.now() - lastFallAt > DRAIN_STALL_MS || elapsed > DRAIN_STRETCH * cfg.drainTimeoutMs)
      )
        break
      if (Date.now() - lastReport >= 10_000) {
        lastReport = Date.now()
        r.record(
          "phase",
          `drain: ${progress.waiting} of ${progress.deliveries} owed events without effect, outbox pending ` +
            `${progress.outboxPending}, inbox pending ${progress.inboxPending}`,
        )
      }
      await sleep(500, options.signal)
    }
    drainSeconds = Math.round((Date.now() - drainStarted) / 100) / 10
    r.record("phase", drained ? `drained in ${drainSeconds} s` : `NOT drained after ${drainSeconds} s`)
    // A late duplicate (a redelivery still in flight) must have the time to show up as one.
    await sleep(3000, options.signal)
    endChurn()
    // A pass still running ends within its 30 s timeout; the verdict does not wait for more.
    const churned = (await Promise.race([churn, sleep(40_000).then(() => undefined)])) ?? {
      outbox: 0,
      inbox: 0,
      archived: 0,
      failures: -1,
    }
    r.record(
      "phase",
      `partitions: dropped ${churned.outbox} outbox and ${churned.inbox} inbox partitions during the run ` +
        `(${churned.archived} dead rows archived; ${churned.failures} passes failed and were tried again)`,
    )
    counts = await tableCounts(db)

    const conns = await connections(db, dbName)
    diag.push("connections on the run's database at the end (application, state, count):")
    diag.push(...conns.map((l) => `  ${l}`))

    const dead = counts.outboxDead + counts.inboxDead
    const stuck = counts.outboxPending + counts.inboxPending
    if (counts.orders === 0) failures.push("no order was committed: the run proved nothing")
    const perConsumer = (f: (c: ConsumerCounts) => number) =>
      counts!.consumers
        .filter((c) => f(c) > 0)
        .map((c) => `${c.role} ${f(c)}`)
        .join(", ")
    if (counts.lost > 0)
      failures.push(`${counts.lost} owed events lost (no effect): ${perConsumer((c) => c.lost)}`)
    if (counts.duplicated > 0) {
      failures.push(
        `${counts.duplicated} events applied more than once (${counts.extraEffects} extra effects): ` +
          perConsumer((c) => c.duplicated),
      )
    }
    for (const c of counts.consumers) {
      if (c.effects === 0)
        failures.push(`consumer ${c.role} applied nothing: the run proved nothing about it`)
      if (c.boundAt === null) failures.push(`consumer ${c.role} has no binding recorded (inbox_bindings)`)
      if (c.joinedLate && c.optional === 0)
        failures.push(`consumer ${c.role} was bound before any order was written: it did not join late`)
    }
    if (counts.mixedKeys === 0)
      failures.push("no partition key carried both event types: the subset consumer proved nothing")
    if (dead > 0) failures.push(`${dead} dead rows (outbox ${counts.outboxDead}, inbox ${counts.inboxDead})`)
    if (stuck > 0)
      failures.push(
        `${stuck} stuck rows (outbox pending ${counts.outboxPending}, inbox pending ${counts.inboxPending})`,
      )
    if (counts.rolledBackOrders + counts.rolledBackEvents > 0) {
      failures.push(
        `rows of rolled-back transactions are visible: ${counts.rolledBackOrders} orders, ${counts.rolledBackEvents} events`,
      )
    }
    if (counts.keysOutOfOrder > 0) {
      failures.push(
        `${counts.keysOutOfOrder} partition keys handled out of commit order: ${perConsumer((c) => c.keysOutOfOrder)}`,
      )
    }
    if (counts.orphanEvents + counts.orphanEffects + counts.ordersWithoutEvent > 0) {
      failures.push(
        `orphans: ${counts.orphanEvents} events without order, ${counts.orphanEffects} effects without order, ` +
          `${counts.ordersWithoutEvent} orders without event`,
      )
    }
    if (!drained)
      failures.push(
        `the drain did not finish within ${cfg.drainTimeoutMs / 1000} s (nor, while still going down, within ${DRAIN_STRETCH}× that)`,
      )
    if (r.crashes.length > 0) {
      failures.push(
        `${r.crashes.length} processes ended by themselves: ${r.crashes.map((c) => `${c.process} (${c.exit})`).join(", ")}`,
      )
    }
    if (r.stalls.length > 0) failures.push(`stalled producers: ${r.stalls.join("; ")}`)
    const producers = r.producerTotals()
    if (producers.rolledBack === 0)
      failures.push("no transaction rolled back: the rollback check proved nothing")
    for (const kind of r.enabledKinds()) {
      if (r.faults[kind] === 0) failures.push(`fault ${kind} was never injected`)
    }
    if (failures.length > 0) {
      diag.unshift(...(await diagnostics(db, counts)))
      const suspects = await suspectMessageIds(db)
      diag.push(
        ...traceMessages(logDir, "LOST", suspects.lost),
        ...traceMessages(logDir, "DUPLICATED", suspects.duplicated),
      )
      // Where an undelivered message may sit: ready or unacked on a queue, or in a retry queue.
      const rabbitCtl = servers.rabbit
        ? (args: readonly string[]) => servers!.rabbit!.ctl(args)
        : servers.cluster?.nodes.find((n) => n.isRunning())?.ctl
      if (rabbitCtl) {
        // With a cluster, where each queue's replicas are and which of them run.
        const columns = servers.cluster ? ["leader", "members", "online"] : []
        const queues = await rabbitCtl([
          "-q",
          "list_queues",
          "-p",
          "/",
          "name",
          "type",
          "messages_ready",
          "messages_unacknowledged",
          "consumers",
          ...columns,
        ]).catch((error) => `list_queues failed: ${message(error)}`)
        diag.push(
          `RabbitMQ queues at the end (name, type, ready, unacked, consumers${columns.map((c) => `, ${c}`).join("")}):`,
        )
        // This run's queues only (the consumer's queue and its retry queues): a broker may serve several runs.
        const ours = queues
          .split("\n")
          .filter((l) => l.includes(r.consumer) || l.startsWith("list_queues failed"))
        diag.push(...ours.map((l) => `  ${l}`))
      }
    }
  } catch (error) {
    if (error instanceof Aborted || options.signal?.aborted) {
      aborted = true
      failures.push("aborted (SIGINT/SIGTERM)")
    } else {
      failures.push(
        `the soak itself failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`,
      )
    }
  } finally {
    options.signal?.removeEventListener("abort", onAbort)
    if (run) {
      if (aborted) run.killAllSync()
      else await run.stopAll().catch(() => run?.killAllSync())
      run.killAllSync()
      await run.tap?.close()
    }
    await db?.destroy().catch(() => {})
    if (servers) {
      // A server started here goes with its data. On a server that outlives the run, the run's
      // database goes when the run passed and stays for inspection when it failed.
      const serverStops = servers.postgres !== undefined && options.services === undefined
      if (!serverStops && failures.length === 0) {
        const admin = postgres(servers.databaseUrl, { max: 1, onnotice: () => {} })
        // A WAL relay's slot keeps its database from being dropped (and its WAL from going).
        await admin
          .unsafe(
            `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = '${dbName}' AND NOT active`,
          )
          .catch(() => {})
        await admin
          .unsafe(`DROP DATABASE IF EXISTS "${dbName}" WITH (FORCE)`)
          .catch(() => {})
          .finally(() => admin.end({ timeout: 5 }))
      } else if (!serverStops) {
        diag.push(`the run's database is kept for inspection: ${dbName} on ${servers.databaseUrl}`)
      }
      await servers.stop().catch(() => servers?.stopSync())
    }
  }

  const ok = failures.length === 0
  if (!ok) {
    diag.push(
      ...(run?.crashes ?? []).flatMap((c) => [
        `CRASH ${c.process} gen ${c.generation} at +${c.atSeconds}s (${c.exit}), last lines:`,
        ...c.tail.split("\n").map((l) => `  | ${l}`),
      ]),
    )
    const highlights = logHighlights(logDir)
    if (highlights.length > 0)
      diag.push("frequent log lines that look like trouble (count × first example):", ...highlights)
    diag.push("the last lines of each process's log (a process that stopped making progress shows where):")
    // Last: what CI keeps of a long report is its end.
    diag.push(...logTails(logDir, 4))
  }
  const logsKept = !ok || options.keepLogs === true
  const result: SoakResult = {
    ok,
    failures,
    driver: driverLabel(cfg.driver),
    runtime: cfg.runtime,
    mode: cfg.mode,
    rabbitCluster: options.rabbitCluster === true,
    minutes: cfg.minutes,
    seed: cfg.seed,
    counts,
    dead: counts ? counts.outboxDead + counts.inboxDead : 0,
    stuck: counts ? counts.outboxPending + counts.inboxPending : 0,
    faults:
      run?.faults ?? (Object.fromEntries(ALL_FAULT_KINDS.map((k) => [k, 0])) as Record<FaultKind, number>),
    faultKinds: run?.kinds ?? (options.rabbitCluster ? ALL_FAULT_KINDS : FAULT_KINDS),
    skippedFaults: run ? run.kinds.filter((k) => !run?.enabledKinds().includes(k)) : [],
    duplicateMessages: run?.duplicateMessages ?? 0,
    crashes: run?.crashes ?? [],
    stalls: run?.stalls ?? [],
    producers: run?.producerTotals() ?? { transactions: 0, committed: 0, rolledBack: 0, failed: 0 },
    drained,
    drainSeconds,
    loadSeconds,
    timeline: run?.timeline ?? [],
    notes: run?.notes ?? [],
    diagnostics: diag,
    logDir,
    logsKept,
  }
  try {
    appendFileSync(join(logDir, "summary.txt"), `${formatReport(result)}\n`)
  } catch {}
  if (!logsKept) rmSync(logDir, { recursive: true, force: true })
  return result
}

/** The human summary: figures, verdict, timeline, and on failure everything needed to diagnose. */
/**
 * How far past its bound a drain that is still going down may run. CI's machine ran the soaks 2–3×
 * slower than a quiet 2-core box (the per-key run: 443 s against 140 s), and a slow drain is not a
 * stuck one; a drain that stops falling for DRAIN_STALL_MS fails at its bound.
 */
export const DRAIN_STRETCH = 5

/**
 * How long a drain past its bound may go without falling before it fails. Longer than an inbox
 * lease (30 s by default) and a restart (6–20 s for a consumer on the loaded box): the lost acks
 * go on during the drain, and the rows a killed consumer had claimed (a claim takes up to 1,000,
 * the heads of all its keys among them) wait for their lease to end while everything behind them
 * waits too. 20 s, shorter than that, could fail a run that was not stuck.
 */
export const DRAIN_STALL_MS = 60_000

export function formatReport(r: SoakResult): string {
  const c = r.counts
  const lines: string[] = []
  lines.push(
    `txbox soak: driver ${r.driver}, runtime ${r.runtime}, mode ${r.mode}, ` +
      `${r.rabbitCluster ? "RabbitMQ three-node cluster, " : ""}load ${r.loadSeconds} s (${r.minutes} min), seed ${r.seed}`,
  )
  if (c) {
    lines.push(
      `events ${c.events} (committed orders ${c.orders}, sent ${c.sent}, effects ${c.effects}); producers: ` +
        `${r.producers.transactions} transactions, ${r.producers.rolledBack} orders rolled back on purpose, ` +
        `${r.producers.failed} transactions failed under faults`,
    )
  }
  const faults = r.faultKinds.map((k) =>
    r.skippedFaults.includes(k)
      ? `${k} skipped`
      : `${k} ${r.faults[k]}${k === "duplicates" ? ` (${r.duplicateMessages} messages)` : ""}`,
  )
  lines.push(`faults injected: ${faults.join(", ")}`)
  if (c) {
    lines.push(
      `lost ${c.lost}, duplicated ${c.duplicated}, dead ${r.dead} (outbox ${c.outboxDead}, inbox ${c.inboxDead}), ` +
        `stuck ${r.stuck} (outbox ${c.outboxPending}, inbox ${c.inboxPending}), rolled-back visible ` +
        `${c.rolledBackOrders + c.rolledBackEvents}, orphans ${c.orphanEvents + c.orphanEffects + c.ordersWithoutEvent}, ` +
        `keys out of order ${c.keysOutOfOrder}`,
    )
    lines.push(`per consumer (events of its types; keys with both types: ${c.mixedKeys}):`)
    for (const k of c.consumers) lines.push(`  ${consumerLine(k)}`)
  }
  lines.push(
    `drain ${r.drainSeconds} s${r.drained ? "" : " (NOT drained)"}; crashes ${r.crashes.length}; ` +
      `stalled producers ${r.stalls.length}`,
  )
  lines.push(r.ok ? "verdict: PASS" : `verdict: FAIL\n${r.failures.map((f) => `  - ${f}`).join("\n")}`)
  lines.push(`logs: ${r.logDir}${r.logsKept ? "" : " (removed: the run passed)"}`)
  if (r.timeline.length > 0) {
    lines.push("timeline:")
    for (const e of [...r.timeline].sort((a, b) => a.t - b.t))
      lines.push(`  +${e.t}s ${e.kind}: ${e.detail.split("\n")[0]}`)
  }
  if (r.diagnostics.length > 0) lines.push("diagnostics:", ...r.diagnostics)
  return lines.join("\n")
}

/** One consumer's figures for the report. */
function consumerLine(c: ConsumerCounts): string {
  const types = c.types.map((t) => t.replace(/^soak\./, "")).join("+")
  return (
    `${c.role} (${c.consumer}, ${types}${c.joinedLate ? `, joined late, bound ${c.boundAt ?? "never"}` : ""}): ` +
    `owed ${c.required}` +
    (c.joinedLate
      ? `, before its binding ${c.optional} (applied ${c.optionalApplied}, ran late ${c.ranLate})`
      : "") +
    `, effects ${c.effects}, lost ${c.lost}, duplicated ${c.duplicated}, keys out of order ${c.keysOutOfOrder}, ` +
    `inbox pending ${c.inboxPending}, dead ${c.inboxDead}`
  )
}

/** The one-line machine-readable verdict the command line prints last. */
export function resultJson(r: SoakResult): string {
  return JSON.stringify({
    ok: r.ok,
    driver: r.driver,
    runtime: r.runtime,
    mode: r.mode,
    rabbitCluster: r.rabbitCluster,
    minutes: r.minutes,
    seed: r.seed,
    events: r.counts?.events ?? 0,
    orders: r.counts?.orders ?? 0,
    faults: Object.fromEntries(r.faultKinds.map((k) => [k, r.faults[k]])),
    skippedFaults: r.skippedFaults,
    duplicateMessages: r.duplicateMessages,
    lost: r.counts?.lost ?? null,
    duplicated: r.counts?.duplicated ?? null,
    keysOutOfOrder: r.counts?.keysOutOfOrder ?? null,
    consumers:
      r.counts?.consumers.map((c) => ({
        role: c.role,
        types: c.types,
        joinedLate: c.joinedLate,
        required: c.required,
        optional: c.optional,
        optionalApplied: c.optionalApplied,
        ranLate: c.ranLate,
        lost: c.lost,
        duplicated: c.duplicated,
        keysOutOfOrder: c.keysOutOfOrder,
      })) ?? null,
    dead: r.dead,
    stuck: r.stuck,
    rolledBackVisible: r.counts ? r.counts.rolledBackOrders + r.counts.rolledBackEvents : null,
    crashes: r.crashes.length,
    stalls: r.stalls.length,
    drained: r.drained,
    drainSeconds: r.drainSeconds,
    failures: r.failures,
    logDir: r.logsKept ? r.logDir : null,
  })
}

const USAGE =
  "usage: bun test/soak/soak.ts --minutes N [--driver pg|postgres.js|default] [--runtime bun|node|deno]\n" +
  "         [--mode idempotent|store-then-process] [--seed N] [--rate TX_PER_S] [--drain-timeout SECONDS]\n" +
  "         [--lost-ack-fraction F] [--relay-workers N] [--rabbit-cluster] [--relay-source poll|wal]\n" +
  "         [--no-partition-churn] [--keep-logs]\n" +
  '  --relay-source wal  every relay reads the WAL (source: "wal"; PostgreSQL started here with\n' +
  "                      wal_level = logical): one reads the slot, the other stands by, both sweep\n" +
  "  --no-partition-churn  leave the partitions to the relays and inboxes (no 60 s partitions made and dropped)\n" +
  "  --rabbit-cluster  a three-node RabbitMQ cluster instead of one node: every relay and consumer gets\n" +
  "                    the three URLs, and a fault kind rabbitNodeKill SIGKILLs one node and boots it again\n" +
  "                    2-6 s later (one node down at most; rabbitRestart stops and starts one node).\n" +
  "                    Starts its own servers: refused (exit 2) with TXBOX_TEST_AMQP_URL set."

export function parseArgs(argv: ReadonlyArray<string>): SoakOptions {
  let minutes = 1
  let driver: Driver | undefined
  let runtime: ChildRuntime = "bun"
  let mode: Mode = "idempotent"
  let seed: number | undefined
  let rate: number | undefined
  let drainTimeoutMs: number | undefined
  let lostAckFraction: number | undefined
  let relayWorkers: number | undefined
  let relaySource: "poll" | "wal" = "poll"
  let keepLogs = false
  let rabbitCluster = false
  let partitionChurn = true
  const number = (flag: string, value: string | undefined): number => {
    const n = Number(value)
    if (value === undefined || !Number.isFinite(n) || n < 0)
      throw new Error(`${flag} needs a number, got ${value}`)
    return n
  }
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i]!
    const [name, inline] = flag.includes("=")
      ? [flag.slice(0, flag.indexOf("=")), flag.slice(flag.indexOf("=") + 1)]
      : [flag, undefined]
    const value = () => inline ?? argv[++i]
    switch (name) {
      case "--minutes":
        minutes = number(name, value())
        break
      case "--driver": {
        const v = value()
        if (v === "default") driver = undefined
        else if (v === "pg" || v === "postgres.js") driver = v
        else throw new Error(`--driver must be pg, postgres.js or default, got ${v}`)
        break
      }
      case "--runtime": {
        const v = value()
        if (v !== "bun" && v !== "node" && v !== "deno")
          throw new Error(`--runtime must be bun, node or deno, got ${v}`)
        runtime = v
        break
      }
      case "--mode": {
        const v = value()
        if (v !== "idempotent" && v !== "store-then-process") {
          throw new Error(`--mode must be idempotent or store-then-process, got ${v}`)
        }
        mode = v
        break
      }
      case "--seed":
        seed = number(name, value())
        break
      case "--rate":
        rate = number(name, value())
        break
      case "--drain-timeout":
        drainTimeoutMs = number(name, value()) * 1000
        break
      case "--lost-ack-fraction":
        lostAckFraction = number(name, value())
        break
      case "--relay-workers":
        relayWorkers = number(name, value())
        break
      case "--keep-logs":
        keepLogs = true
        break
      case "--relay-source": {
        const v = value()
        if (v !== "poll" && v !== "wal") throw new Error(`--relay-source must be poll or wal, got ${v}`)
        relaySource = v
        break
      }
      case "--rabbit-cluster":
        rabbitCluster = true
        break
      case "--no-partition-churn":
        partitionChurn = false
        break
      default:
        throw new Error(`unknown argument ${flag}`)
    }
  }
  if (!(minutes > 0)) throw new Error("--minutes must be positive")
  return {
    minutes,
    driver,
    runtime,
    mode,
    keepLogs,
    ...(rabbitCluster ? { rabbitCluster } : {}),
    ...(partitionChurn ? {} : { partitionChurn }),
    ...(seed === undefined ? {} : { seed }),
    ...(rate === undefined ? {} : { rate }),
    ...(drainTimeoutMs === undefined ? {} : { drainTimeoutMs }),
    ...(lostAckFraction === undefined ? {} : { lostAckFraction }),
    ...(relayWorkers === undefined ? {} : { relayWorkers }),
    ...(relaySource === "wal" ? { relaySource } : {}),
  }
}

async function main(): Promise<number> {
  const argv = process.argv.slice(2)
  if (argv.includes("--help") || argv.includes("-h")) {
    console.log(USAGE)
    return 0
  }
  let options: SoakOptions
  try {
    options = parseArgs(argv)
  } catch (error) {
    console.error(`${message(error)}\n${USAGE}`)
    return 2
  }
  const refusal = options.rabbitCluster ? rabbitClusterRefusal(options) : undefined
  if (refusal !== undefined) {
    console.error(`[soak] ${refusal}`)
    return 2
  }
  const controller = new AbortController()
  let signals = 0
  for (const sig of ["SIGINT", "SIGTERM"] as const) {
    process.on(sig, () => {
      signals++
      // The first signal stops the run and cleans up (children, servers); a second one exits now,
      // leaving the watchdogs to kill what is left.
      if (signals > 1) process.exit(sig === "SIGINT" ? 130 : 143)
      console.error(`[soak] ${sig}: stopping every process and the servers started here`)
      controller.abort()
    })
  }
  const result = await runSoak({ ...options, signal: controller.signal })
  console.log(formatReport(result))
  console.log(resultJson(result))
  if (controller.signal.aborted) return 130
  return result.ok ? 0 : 1
}

if (import.meta.main) process.exit(await main())
