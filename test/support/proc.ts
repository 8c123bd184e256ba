// Process, user and port helpers shared by the local PostgreSQL and RabbitMQ launchers.
// Only node: APIs, so the harness runs under Node as well as Bun.
import { execFile, spawn } from "node:child_process"
import { existsSync, readFileSync } from "node:fs"
import net from "node:net"

export const isRoot = (): boolean => process.getuid?.() === 0

export interface UserIds {
  readonly uid: number
  readonly gid: number
}

const idCache = new Map<string, UserIds>()

/** uid and primary gid of a system user, looked up with `id` (Node has no getpwnam). */
export async function userIds(user: string): Promise<UserIds> {
  const cached = idCache.get(user)
  if (cached) return cached
  try {
    const uid = Number((await run("id", ["-u", user])).trim())
    const gid = Number((await run("id", ["-g", user])).trim())
    const ids = { uid, gid }
    idCache.set(user, ids)
    return ids
  } catch (cause) {
    throw new Error(`system user "${user}" not found (its server refuses to run as root)`, { cause })
  }
}

/**
 * The command line that runs `command` as `user` when we are root (PostgreSQL refuses root, and
 * RabbitMQ's cookie must belong to the user that runs the CLI); unchanged otherwise.
 */
export function asUser(
  ids: UserIds | undefined,
  command: string,
  args: readonly string[],
): [string, string[]] {
  if (ids === undefined || !isRoot()) return [command, [...args]]
  return ["setpriv", [`--reuid=${ids.uid}`, `--regid=${ids.gid}`, "--init-groups", "--", command, ...args]]
}

export interface RunOptions {
  /** Run as this user when the process is root. */
  readonly user?: UserIds
  readonly env?: NodeJS.ProcessEnv
  readonly cwd?: string
  /** @default 60_000 */
  readonly timeoutMs?: number
}

/** Runs a command to completion and resolves with its stdout; rejects with its stderr in the message. */
export function run(command: string, args: readonly string[], options: RunOptions = {}): Promise<string> {
  const [file, argv] = asUser(options.user, command, args)
  return new Promise((resolve, reject) => {
    execFile(
      file,
      argv,
      {
        encoding: "utf8",
        maxBuffer: 16 * 1024 * 1024,
        timeout: options.timeoutMs ?? 60_000,
        killSignal: "SIGKILL",
        ...(options.env === undefined ? {} : { env: options.env }),
        ...(options.cwd === undefined ? {} : { cwd: options.cwd }),
      },
      (error, stdout, stderr) => {
        if (error === null) return resolve(stdout)
        const how = error.killed ? "timed out" : `exit ${error.code ?? error.signal}`
        const output = (stderr.trim() || stdout.trim()).split("\n").slice(-20).join("\n")
        reject(new Error(`${command} ${args.join(" ")}: ${how}\n${output}`, { cause: error }))
      },
    )
  })
}

/** Last lines of a log file, for error messages; empty when it does not exist. */
export function tailFile(path: string, lines = 30): string {
  if (!existsSync(path)) return ""
  return readFileSync(path, "utf8").trimEnd().split("\n").slice(-lines).join("\n")
}

const canBind = (port: number): Promise<boolean> =>
  new Promise((resolve) => {
    const server = net.createServer()
    server.once("error", () => resolve(false))
    server.listen({ port, host: "127.0.0.1", exclusive: true }, () => server.close(() => resolve(true)))
  })

function ephemeralLow(): number {
  try {
    const low = Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0])
    return Number.isInteger(low) && low > 2048 ? low : 32768
  } catch {
    return 32768
  }
}

/**
 * First port of `count` consecutive ports that are free on 127.0.0.1. Taken below the kernel's
 * ephemeral range: a port the kernel can hand to an outgoing connection could be lost while a
 * server restarts on it, and RabbitMQ needs a contiguous range for its CLI's distribution ports.
 */
export async function freePortBlock(count: number): Promise<number> {
  const low = 15000
  const high = ephemeralLow() - count
  for (let attempt = 0; attempt < 100; attempt++) {
    const base = low + Math.floor(Math.random() * (high - low))
    let free = true
    for (let port = base; port < base + count && free; port++) free = await canBind(port)
    if (free) return base
  }
  throw new Error(`no ${count} consecutive free ports on 127.0.0.1 between ${low} and ${high + count}`)
}

/** Resolves once something accepts TCP connections on 127.0.0.1:port. */
export async function waitForPort(port: number, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const open = await new Promise<boolean>((resolve) => {
      const socket = net.connect({ port, host: "127.0.0.1" })
      socket.once("connect", () => {
        socket.destroy()
        resolve(true)
      })
      socket.once("error", () => resolve(false))
    })
    if (open) return
    if (Date.now() > deadline) throw new Error(`nothing listens on 127.0.0.1:${port} after ${timeoutMs} ms`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

/** Whether a process is running (signal 0 probes without sending anything). */
export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
  } catch (error) {
    // EPERM: it exists but belongs to someone else.
    if ((error as NodeJS.ErrnoException).code !== "EPERM") return false
  }
  // A daemon's exit leaves a zombie when PID 1 does not reap (as in this sandbox): that is dead too.
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z"
  } catch {
    // No /proc (macOS): trust the signal probe. With /proc, a missing entry means it just exited.
    return !existsSync("/proc/self/stat")
  }
}

/** Sends a signal, ignoring a process that is already gone. */
export function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig)
  } catch {}
}

/** Waits up to `timeoutMs` for a process to exit; SIGKILLs it if it is still there. */
export async function waitForExit(pid: number, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (isAlive(pid)) {
    if (Date.now() > deadline) {
      signal(pid, "SIGKILL")
      return
    }
    await new Promise((resolve) => setTimeout(resolve, 25))
  }
}

/** Finds an executable: the first candidate path that exists, else a PATH lookup. */
export function findExecutable(name: string, candidates: readonly string[]): string | undefined {
  for (const path of candidates) if (existsSync(path)) return path
  for (const dir of (process.env.PATH ?? "").split(":")) {
    if (dir !== "" && existsSync(`${dir}/${name}`)) return `${dir}/${name}`
  }
  return undefined
}

export interface Watchdog {
  /** Stops the watchdog without running its cleanup (the owner cleaned up itself). */
  cancel(): void
}

/**
 * Runs `script` (sh, with `args` as $1...) once this process is gone, however it goes: the
 * watchdog blocks reading a pipe from us, and the kernel closes that pipe when we exit, even on
 * SIGKILL. Needed because `bun test` fires no process "exit" event, and a crashed or killed run
 * would otherwise leave servers running.
 */
export function startWatchdog(script: string, args: readonly string[]): Watchdog {
  // detached: a terminal's Ctrl-C goes to our process group and must not reach the watchdog.
  const child = spawn("sh", ["-c", `read _ignored; ${script}`, "txbox-watchdog", ...args], {
    stdio: ["pipe", "ignore", "ignore"],
    detached: true,
  })
  child.on("error", () => {})
  child.stdin?.on("error", () => {})
  child.unref()
  // Not even the pipe may keep the event loop alive.
  ;(child.stdin as unknown as { unref?: () => void } | null)?.unref?.()
  return {
    cancel: () => {
      if (child.pid !== undefined) signal(child.pid, "SIGKILL")
    },
  }
}

/**
 * A server's `stop` and `stopSync`, each doing its work at most once: `stop` runs `stopping` once
 * (later calls get the same promise); `stopSync` (an exit handler) kills at once unless a stop
 * already began.
 */
export function stopOnce(
  stopping: () => Promise<void>,
  killSync: () => void,
): { readonly stop: () => Promise<void>; readonly stopSync: () => void } {
  let stopped: Promise<void> | undefined
  return {
    stop: () => {
      stopped ??= stopping()
      return stopped
    },
    stopSync: () => {
      if (stopped) return
      stopped = Promise.resolve()
      killSync()
    },
  }
}
