// Where the two cores go: CPU seconds of the bench's own process(es), of PostgreSQL (postmaster and
// every backend) and of RabbitMQ (the Erlang VM), read from /proc around a measurement. The servers
// are found by the port they listen on, so this works for servers the bench did not start too.
// Linux only; elsewhere every figure is undefined and the benches still run.
import { execFileSync } from "node:child_process"
import { readdirSync, readFileSync, readlinkSync } from "node:fs"

const TICKS = (() => {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100
  } catch {
    return 100
  }
})()

const readText = (path: string): string | undefined => {
  try {
    return readFileSync(path, "utf8")
  } catch {
    return undefined
  }
}

/** The PID of the process with a listening TCP socket on `port`, if it can be seen. */
export const pidListeningOn = (port: number): number | undefined => {
  const hexPort = port.toString(16).toUpperCase().padStart(4, "0")
  const inodes = new Set<string>()
  for (const file of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    for (const line of (readText(file) ?? "").split("\n").slice(1)) {
      const f = line.trim().split(/\s+/)
      // local_address is HEXIP:HEXPORT, st 0A is LISTEN, inode is the 10th field.
      if (f[1]?.endsWith(`:${hexPort}`) && f[3] === "0A" && f[9]) inodes.add(f[9])
    }
  }
  if (inodes.size === 0) return undefined
  for (const pid of pids()) {
    let fds: string[]
    try {
      fds = readdirSync(`/proc/${pid}/fd`)
    } catch {
      continue
    }
    for (const fd of fds) {
      try {
        const link = readlinkSync(`/proc/${pid}/fd/${fd}`)
        if (link.startsWith("socket:[") && inodes.has(link.slice(8, -1))) return pid
      } catch {}
    }
  }
  return undefined
}

const pids = (): number[] => {
  try {
    return readdirSync("/proc")
      .filter((name) => /^\d+$/.test(name))
      .map(Number)
  } catch {
    return []
  }
}

interface Stat {
  readonly ppid: number
  /** utime + stime + cutime + cstime, in seconds: a reaped child's time lives in its parent's c-fields. */
  readonly seconds: number
}

/** The fields of a `/proc/…/stat` line after the command name, which may hold spaces and parentheses. */
const statFields = (text: string): string[] => text.slice(text.lastIndexOf(")") + 2).split(" ")

const statOf = (pid: number): Stat | undefined => {
  const text = readText(`/proc/${pid}/stat`)
  if (text === undefined) return undefined
  const f = statFields(text)
  const n = (i: number) => Number(f[i] ?? 0)
  return { ppid: n(1), seconds: (n(11) + n(12) + n(13) + n(14)) / TICKS }
}

/** CPU seconds of `root` and all its live descendants (plus the reaped ones, via the c-fields). */
export const treeSeconds = (root: number): number | undefined => {
  const all = new Map<number, Stat>()
  for (const pid of pids()) {
    const s = statOf(pid)
    if (s) all.set(pid, s)
  }
  if (!all.has(root)) return undefined
  const children = new Map<number, number[]>()
  for (const [pid, s] of all) children.set(s.ppid, [...(children.get(s.ppid) ?? []), pid])
  let total = 0
  const stack = [root]
  while (stack.length > 0) {
    const pid = stack.pop()!
    total += all.get(pid)?.seconds ?? 0
    stack.push(...(children.get(pid) ?? []))
  }
  return total
}

/**
 * CPU seconds of each thread of `pid` named `name` (`/proc/<pid>/task/<tid>/comm`), by thread id:
 * JavaScriptCore's compiler threads are "JITWorker" under Bun. Empty when there are none or /proc
 * cannot tell. By thread, since such a thread may exit when idle and take its count with it.
 */
export const threadSeconds = (pid: number, name: string): Map<string, number> => {
  const byThread = new Map<string, number>()
  let tasks: string[]
  try {
    tasks = readdirSync(`/proc/${pid}/task`)
  } catch {
    return byThread
  }
  for (const tid of tasks) {
    if (readText(`/proc/${pid}/task/${tid}/comm`)?.trim() !== name) continue
    const text = readText(`/proc/${pid}/task/${tid}/stat`)
    if (text === undefined) continue
    const f = statFields(text)
    byThread.set(`${pid}/${tid}`, (Number(f[11] ?? 0) + Number(f[12] ?? 0)) / TICKS)
  }
  return byThread
}

/** What the threads of `after` used since `before` (a thread new since then: all of its time). */
export const threadsUsed = (before: Map<string, number>, after: Map<string, number>): number => {
  let used = 0
  for (const [thread, seconds] of after) used += seconds - (before.get(thread) ?? 0)
  return used
}

/** Busy and total CPU seconds of the whole machine (all cores), from /proc/stat. */
const machineSeconds = (): { busy: number; total: number } | undefined => {
  const line = readText("/proc/stat")?.split("\n")[0]
  if (!line?.startsWith("cpu ")) return undefined
  const v = line.trim().split(/\s+/).slice(1).map(Number)
  const total = v.slice(0, 8).reduce((a, b) => a + b, 0)
  const idle = (v[3] ?? 0) + (v[4] ?? 0)
  return { busy: (total - idle) / TICKS, total: total / TICKS }
}

export interface CpuTargets {
  readonly postgresPort?: number | undefined
  readonly rabbitPort?: number | undefined
}

export interface CpuSample {
  readonly at: number
  readonly self: number
  readonly children: ReadonlyArray<number | undefined>
  readonly postgres: number | undefined
  readonly rabbitmq: number | undefined
  readonly machine: { busy: number; total: number } | undefined
}

/** Average cores used by each party between two samples (1.0 = one core fully busy). */
export interface CpuUse {
  readonly seconds: number
  /** The bench process itself (the relay, when it runs in-process). */
  readonly bench: number
  /** Child processes the bench started (out-of-process relays), summed. */
  readonly children: number | undefined
  /** The same, per child, in the order given to `sample`. */
  readonly perChild: ReadonlyArray<number | undefined>
  readonly postgres: number | undefined
  readonly rabbitmq: number | undefined
  /** Everything else on the machine (other users' work counts here: a noisy neighbour shows). */
  readonly other: number | undefined
  /** All cores busy = the machine's core count. */
  readonly machineBusy: number | undefined
}

export const portOf = (url: string): number | undefined => {
  const port = Number(new URL(url).port)
  return Number.isInteger(port) && port > 0 ? port : undefined
}

export interface CpuMeter {
  sample(children?: ReadonlyArray<number>): CpuSample
  use(from: CpuSample, to: CpuSample): CpuUse
}

export const cpuMeter = (targets: CpuTargets): CpuMeter => {
  const pgPid = targets.postgresPort === undefined ? undefined : pidListeningOn(targets.postgresPort)
  const rabbitPid = targets.rabbitPort === undefined ? undefined : pidListeningOn(targets.rabbitPort)
  return {
    sample: (children = []) => {
      const usage = process.cpuUsage()
      return {
        at: performance.now(),
        self: (usage.user + usage.system) / 1e6,
        children: children.map((pid) => treeSeconds(pid)),
        postgres: pgPid === undefined ? undefined : treeSeconds(pgPid),
        rabbitmq: rabbitPid === undefined ? undefined : treeSeconds(rabbitPid),
        machine: machineSeconds(),
      }
    },
    use: (from, to) => {
      const seconds = (to.at - from.at) / 1000
      const per = (a: number | undefined, b: number | undefined) =>
        a === undefined || b === undefined ? undefined : (b - a) / seconds
      const perChild = to.children.map((t, i) => per(from.children[i], t))
      let children: number | undefined = 0
      for (const d of perChild)
        children = d === undefined || children === undefined ? undefined : children + d
      const bench = (to.self - from.self) / seconds
      const postgres = per(from.postgres, to.postgres)
      const rabbitmq = per(from.rabbitmq, to.rabbitmq)
      const machineBusy = per(from.machine?.busy, to.machine?.busy)
      const known = [bench, children, postgres, rabbitmq]
      const other =
        machineBusy === undefined || known.some((k) => k === undefined)
          ? undefined
          : Math.max(0, machineBusy - known.reduce<number>((a, b) => a + (b ?? 0), 0))
      return { seconds, bench, children, perChild, postgres, rabbitmq, other, machineBusy }
    },
  }
}

/** Several measurements as one: every figure weighted by its measurement's duration. */
export const combineCpu = (uses: ReadonlyArray<CpuUse>): CpuUse => {
  const seconds = uses.reduce((a, u) => a + u.seconds, 0)
  const avg = (pick: (u: CpuUse) => number | undefined): number | undefined => {
    let total = 0
    for (const u of uses) {
      const v = pick(u)
      if (v === undefined) return undefined
      total += v * u.seconds
    }
    return total / seconds
  }
  const width = Math.max(0, ...uses.map((u) => u.perChild.length))
  return {
    seconds,
    bench: avg((u) => u.bench) ?? 0,
    children: avg((u) => u.children),
    perChild: Array.from({ length: width }, (_, i) => avg((u) => u.perChild[i])),
    postgres: avg((u) => u.postgres),
    rabbitmq: avg((u) => u.rabbitmq),
    other: avg((u) => u.other),
    machineBusy: avg((u) => u.machineBusy),
  }
}
