// A private RabbitMQ node from the Debian package's scripts, for tests that need a broker of their
// own (closing connections, restarts) and as the fallback when there is neither a URL nor Docker.
// The traps avoided here are listed in /work/shared/SERVICES.md.
import { type ChildProcess, spawn } from "node:child_process"
import { randomBytes } from "node:crypto"
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import {
  asUser,
  findExecutable,
  freePortBlock,
  isAlive,
  isRoot,
  run,
  signal,
  startWatchdog,
  stopOnce,
  tailFile,
  type UserIds,
  userIds,
  waitForExit,
  waitForPort,
} from "./proc.ts"

export interface LocalRabbit {
  /** `amqp://guest:guest@127.0.0.1:PORT`; guest is allowed from loopback only, which is all we use. */
  readonly url: string
  readonly port: number
  /** Erlang node name, for `rabbitmqctl -n`. */
  readonly node: string
  /** Temp dir: HOME (with the cookie), mnesia, logs, pid file; removed by `stop`. */
  readonly dir: string
  /** Runs `rabbitmqctl -n NODE ...args` as the broker's user with its environment; resolves with stdout. @default timeoutMs 60 s */
  ctl(args: readonly string[], timeoutMs?: number): Promise<string>
  /** Closes every client connection on vhost `/`, as a broker-side fault. */
  closeAllConnections(reason?: string): Promise<void>
  /** `rabbitmqctl stop`, then stops the private epmd and removes the dir. Safe to call twice. */
  stop(): Promise<void>
  /** SIGKILLs the node and epmd and removes the dir, for process exit hooks. */
  stopSync(): void
}

export const RABBITMQ_INSTALL_HINT = "apt-get install -y rabbitmq-server or set TXBOX_TEST_AMQP_URL"

const SBIN = "/usr/lib/rabbitmq/bin"

export interface RabbitBinaries {
  readonly server: string
  readonly ctl: string
  readonly epmd: string
}

/** Why the Debian package's scripts cannot be used here, or undefined when they can. */
export function localRabbitMissing(): string | undefined {
  const epmd = findExecutable("epmd", ["/usr/lib/erlang/bin/epmd"])
  if (existsSync(join(SBIN, "rabbitmq-server")) && existsSync(join(SBIN, "rabbitmqctl")) && epmd) return
  return `RabbitMQ not found (looked for ${SBIN}/rabbitmq-server and epmd)`
}

export function rabbitBinaries(): RabbitBinaries {
  const missing = localRabbitMissing()
  if (missing !== undefined) throw new Error(`${missing}: ${RABBITMQ_INSTALL_HINT}`)
  // Not /usr/sbin/rabbitmq-server: that wrapper switches user and writes to system directories.
  return {
    server: join(SBIN, "rabbitmq-server"),
    ctl: join(SBIN, "rabbitmqctl"),
    epmd: findExecutable("epmd", ["/usr/lib/erlang/bin/epmd"])!,
  }
}

/** The ports of the CLI's distribution range (rabbitmqctl is an Erlang node too). */
export const CTL_PORTS = 10

/** Ports, in one free block: AMQP, Erlang distribution, epmd, then the CLI's distribution range. */
const PORT_BLOCK = 3 + CTL_PORTS

/** Where one node lives and listens. */
export interface NodeLayout {
  /** Erlang node name, `name@localhost`. */
  readonly node: string
  /** HOME, with the Erlang cookie: shared by the nodes of a cluster and their CLI. */
  readonly home: string
  /** The node's own files: mnesia, logs, pid file, its (empty) config files. */
  readonly dir: string
  readonly port: number
  readonly distPort: number
  /** First port of the CLI's distribution range (`CTL_PORTS` long). */
  readonly ctlPort: number
  readonly epmdPort: number
}

export const pidFileOf = (layout: Pick<NodeLayout, "dir">): string => join(layout.dir, "rabbit.pid")
export const logDirOf = (layout: Pick<NodeLayout, "dir">): string => join(layout.dir, "log")

/** A clean environment for a node and its CLI: a developer's RABBITMQ_* or ERL_* variables must not leak in. */
export function nodeEnv(layout: NodeLayout): NodeJS.ProcessEnv {
  const { dir } = layout
  return {
    PATH: process.env.PATH ?? "/usr/local/bin:/usr/bin:/bin",
    LANG: "C.UTF-8",
    LC_ALL: "C.UTF-8",
    HOME: layout.home,
    RABBITMQ_NODENAME: layout.node,
    RABBITMQ_NODE_IP_ADDRESS: "127.0.0.1",
    RABBITMQ_NODE_PORT: String(layout.port),
    // The default (AMQP port + 20000) is no port at all above 45535.
    RABBITMQ_DIST_PORT: String(layout.distPort),
    RABBITMQ_CTL_DIST_PORT_MIN: String(layout.ctlPort),
    RABBITMQ_CTL_DIST_PORT_MAX: String(layout.ctlPort + CTL_PORTS - 1),
    RABBITMQ_MNESIA_BASE: join(dir, "mnesia"),
    RABBITMQ_LOG_BASE: logDirOf(layout),
    RABBITMQ_PID_FILE: pidFileOf(layout),
    RABBITMQ_CONF_ENV_FILE: join(dir, "rabbitmq-env.conf"),
    RABBITMQ_CONFIG_FILE: join(dir, "rabbitmq"),
    RABBITMQ_ADVANCED_CONFIG_FILE: join(dir, "advanced.config"),
    RABBITMQ_ENABLED_PLUGINS_FILE: join(dir, "enabled_plugins"),
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS: "-kernel inet_dist_use_interface {127,0,0,1}",
    // A private epmd: the shared one on 0.0.0.0:4369 would outlive the node.
    ERL_EPMD_PORT: String(layout.epmdPort),
    ERL_EPMD_ADDRESS: "127.0.0.1",
    // Any Erlang VM here (node or CLI) that finds no epmd would start a shared daemon that outlives
    // the run (`rabbitmqctl help` does); with ours gone, failing is the right outcome.
    ERL_ZFLAGS: "-start_epmd false",
  }
}

/** The node's directories and (empty) files; call before `chown`. */
export function prepareNodeDir(layout: NodeLayout): void {
  mkdirSync(join(layout.dir, "mnesia"), { recursive: true })
  mkdirSync(logDirOf(layout), { recursive: true })
  writeFileSync(join(layout.dir, "rabbitmq-env.conf"), "")
  writeFileSync(join(layout.dir, "enabled_plugins"), "[].\n")
}

/** The Erlang cookie in `home`. Written before any node starts: the node and the CLI would otherwise race to create it. */
export function writeCookie(home: string): void {
  writeFileSync(join(home, ".erlang.cookie"), randomBytes(15).toString("hex").toUpperCase())
  chmodSync(join(home, ".erlang.cookie"), 0o400)
}

/** The OS pid in a node's pid file, if there is one. */
export function readPid(pidFile: string): number | undefined {
  try {
    const pid = Number(readFileSync(pidFile, "utf8").trim())
    return Number.isInteger(pid) && pid > 0 ? pid : undefined
  } catch {
    return undefined
  }
}

/**
 * Starts a private epmd on 127.0.0.1:`port`, its pid written to `dir/epmd.pid`. Spawned, not
 * -daemon, so we hold its PID; detached so a terminal's Ctrl-C does not kill it before the nodes
 * are stopped (rabbitmqctl finds them through it).
 */
export async function startEpmd(
  bin: RabbitBinaries,
  user: UserIds | undefined,
  env: NodeJS.ProcessEnv,
  dir: string,
  port: number,
): Promise<ChildProcess> {
  const [file, args] = asUser(user, bin.epmd, ["-address", "127.0.0.1", "-port", String(port)])
  const epmd = spawn(file, args, { env, cwd: dir, stdio: "ignore", detached: true })
  epmd.unref()
  writeFileSync(join(dir, "epmd.pid"), String(epmd.pid))
  await waitForPort(port, 5_000)
  return epmd
}

/** Runs `rabbitmqctl -n NODE ...args` as the broker's user with the node's environment. */
export type Ctl = (args: readonly string[], timeoutMs?: number) => Promise<string>

export function nodeCtl(bin: RabbitBinaries, user: UserIds | undefined, layout: NodeLayout): Ctl {
  const env = nodeEnv(layout)
  return (args, timeoutMs = 60_000) =>
    run(bin.ctl, ["-n", layout.node, ...args], { ...(user ? { user } : {}), env, cwd: layout.dir, timeoutMs })
}

/** Boots a node (`-detached`) and waits until it has started. Its directories must exist. */
export async function bootNode(
  bin: RabbitBinaries,
  user: UserIds | undefined,
  layout: NodeLayout,
): Promise<void> {
  const ctl = nodeCtl(bin, user, layout)
  await run(bin.server, ["-detached"], { ...(user ? { user } : {}), env: nodeEnv(layout), cwd: layout.dir })
  // await_startup right after -detached fails with "node not running": wait on the pid file first.
  await ctl(["wait", pidFileOf(layout)], 90_000)
  await ctl(["await_startup"], 60_000)
}

/** The error for a node that did not start: its log's tail; `PortTaken` when a port was taken. */
/**
 * Stops a node that is running: `rabbitmqctl stop`, SIGKILL when that fails, then waits for the
 * process to go. Only a live node: `stop PIDFILE` waits out its timeout for a pid file that a node
 * which exited cleanly (SIGTERM) has removed.
 */
export async function stopNode(ctl: Ctl, pidFile: string): Promise<void> {
  const pid = readPid(pidFile)
  if (pid === undefined || !isAlive(pid)) return
  try {
    await ctl(["stop", pidFile], 30_000)
  } catch {
    signal(pid, "SIGKILL")
  }
  await waitForExit(pid, 10_000)
}

/** Stops the private epmd, if it still runs. */
export async function stopEpmd(epmd: { readonly pid?: number | undefined } | undefined): Promise<void> {
  if (epmd?.pid === undefined || !isAlive(epmd.pid)) return
  signal(epmd.pid, "SIGTERM")
  await waitForExit(epmd.pid, 2_000)
}

export function bootFailure(layout: NodeLayout, error: unknown): Error {
  const logDir = logDirOf(layout)
  const log =
    tailFile(join(logDir, `${layout.node}.log`)) || tailFile(join(logDir, `${layout.node}_upgrade.log`))
  const crash = readdirSafe(logDir).includes("erl_crash.dump") ? " (erl_crash.dump written)" : ""
  if (/eaddrinuse/i.test(log)) return new PortTaken(log)
  const message = error instanceof Error ? error.message : String(error)
  const details = log ? `\n--- ${layout.node}.log\n${log}` : ""
  return new Error(`could not start a local RabbitMQ${crash}: ${message}${details}`, { cause: error })
}

export async function startLocalRabbit(): Promise<LocalRabbit> {
  const bin = rabbitBinaries()
  const user: UserIds | undefined = isRoot() ? await userIds("rabbitmq") : undefined
  for (let attempt = 1; ; attempt++) {
    try {
      return await attemptStart(bin, user)
    } catch (error) {
      // Another process may have taken one of the ports between the check and the bind.
      if (attempt < 3 && error instanceof PortTaken) continue
      throw error
    }
  }
}

/** A port of the block was taken between the check and the bind: try another block. */
export class PortTaken extends Error {}

async function attemptStart(bin: RabbitBinaries, user: UserIds | undefined): Promise<LocalRabbit> {
  const base = await freePortBlock(PORT_BLOCK)
  const port = base
  const epmdPort = base + 2
  const id = `${process.pid}-${randomBytes(3).toString("hex")}`
  const node = `txbox-${id}@localhost`
  const dir = mkdtempSync(join(tmpdir(), "txbox-rabbit-"))
  // If this process dies without stopping the node. SIGKILL: the data is thrown away anyway.
  const watchdog = startWatchdog(
    'for f in rabbit.pid epmd.pid; do pid=$(cat "$1/$f" 2>/dev/null) && kill -KILL "$pid"; done; sleep 1; rm -rf "$1"',
    [dir],
  )
  const layout: NodeLayout = {
    node,
    home: dir,
    dir,
    port,
    distPort: base + 1,
    ctlPort: base + 3,
    epmdPort,
  }
  const pidFile = pidFileOf(layout)
  const env = nodeEnv(layout)
  const ctl = nodeCtl(bin, user, layout)

  const nodePid = (): number | undefined => readPid(pidFile)
  let epmd: ChildProcess | undefined
  const killAllSync = () => {
    const pid = nodePid()
    if (pid !== undefined) signal(pid, "SIGKILL")
    if (epmd?.pid !== undefined) signal(epmd.pid, "SIGKILL")
    rmSync(dir, { recursive: true, force: true, maxRetries: 5 })
    watchdog.cancel()
  }

  try {
    prepareNodeDir(layout)
    writeCookie(dir)
    if (user) await run("chown", ["-R", `${user.uid}:${user.gid}`, dir])
    epmd = await startEpmd(bin, user, env, dir, epmdPort)
    await bootNode(bin, user, layout)
  } catch (error) {
    const failure = bootFailure(layout, error)
    killAllSync()
    throw failure
  }

  return {
    url: `amqp://guest:guest@127.0.0.1:${port}`,
    port,
    node,
    dir,
    ctl: (args, timeoutMs) => ctl(args, timeoutMs),
    closeAllConnections: async (reason = "test") => {
      await ctl(["close_all_connections", "-p", "/", reason])
    },
    ...stopOnce(async () => {
      await stopNode(ctl, pidFile)
      await stopEpmd(epmd)
      rmSync(dir, { recursive: true, force: true, maxRetries: 5 })
      watchdog.cancel()
    }, killAllSync),
  }
}

function readdirSafe(path: string): string[] {
  try {
    return readdirSync(path)
  } catch {
    return []
  }
}
