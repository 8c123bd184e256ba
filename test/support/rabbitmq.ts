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
  /** Runs `rabbitmqctl -n NODE ...args` as the broker's user with its environment; resolves with stdout. */
  ctl(args: readonly string[]): Promise<string>
  /** Closes every client connection on vhost `/`, as a broker-side fault. */
  closeAllConnections(reason?: string): Promise<void>
  /** `rabbitmqctl stop`, then stops the private epmd and removes the dir. Safe to call twice. */
  stop(): Promise<void>
  /** SIGKILLs the node and epmd and removes the dir, for process exit hooks. */
  stopSync(): void
}

export const RABBITMQ_INSTALL_HINT = "apt-get install -y rabbitmq-server or set TXBOX_TEST_AMQP_URL"

const SBIN = "/usr/lib/rabbitmq/bin"

function binaries(): { server: string; ctl: string; epmd: string } {
  // Not /usr/sbin/rabbitmq-server: that wrapper switches user and writes to system directories.
  const server = join(SBIN, "rabbitmq-server")
  const ctl = join(SBIN, "rabbitmqctl")
  const epmd = findExecutable("epmd", ["/usr/lib/erlang/bin/epmd"])
  if (!existsSync(server) || !existsSync(ctl) || epmd === undefined) {
    throw new Error(
      `RabbitMQ not found (looked for ${SBIN}/rabbitmq-server and epmd): ${RABBITMQ_INSTALL_HINT}`,
    )
  }
  return { server, ctl, epmd }
}

/** Ports, in one free block: AMQP, Erlang distribution, epmd, then the CLI's distribution range. */
const PORT_BLOCK = 3 + 10

export async function startLocalRabbit(): Promise<LocalRabbit> {
  const bin = binaries()
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

class PortTaken extends Error {}

async function attemptStart(
  bin: { server: string; ctl: string; epmd: string },
  user: UserIds | undefined,
): Promise<LocalRabbit> {
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
  const pidFile = join(dir, "rabbit.pid")
  const logDir = join(dir, "log")

  // A clean environment: a developer's RABBITMQ_* or ERL_* variables must not leak in.
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH ?? "/usr/local/bin:/usr/bin:/bin",
    LANG: "C.UTF-8",
    LC_ALL: "C.UTF-8",
    HOME: dir,
    RABBITMQ_NODENAME: node,
    RABBITMQ_NODE_IP_ADDRESS: "127.0.0.1",
    RABBITMQ_NODE_PORT: String(port),
    // The default (AMQP port + 20000) is no port at all above 45535.
    RABBITMQ_DIST_PORT: String(base + 1),
    RABBITMQ_CTL_DIST_PORT_MIN: String(base + 3),
    RABBITMQ_CTL_DIST_PORT_MAX: String(base + PORT_BLOCK - 1),
    RABBITMQ_MNESIA_BASE: join(dir, "mnesia"),
    RABBITMQ_LOG_BASE: logDir,
    RABBITMQ_PID_FILE: pidFile,
    RABBITMQ_CONF_ENV_FILE: join(dir, "rabbitmq-env.conf"),
    RABBITMQ_CONFIG_FILE: join(dir, "rabbitmq"),
    RABBITMQ_ADVANCED_CONFIG_FILE: join(dir, "advanced.config"),
    RABBITMQ_ENABLED_PLUGINS_FILE: join(dir, "enabled_plugins"),
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS: "-kernel inet_dist_use_interface {127,0,0,1}",
    // A private epmd: the shared one on 0.0.0.0:4369 would outlive the node.
    ERL_EPMD_PORT: String(epmdPort),
    ERL_EPMD_ADDRESS: "127.0.0.1",
    // Any Erlang VM here (node or CLI) that finds no epmd would start a shared daemon that outlives
    // the run (`rabbitmqctl help` does); with ours gone, failing is the right outcome.
    ERL_ZFLAGS: "-start_epmd false",
  }
  const runOpts = { ...(user ? { user } : {}), env, cwd: dir }
  const ctl = (args: readonly string[], timeoutMs = 60_000) =>
    run(bin.ctl, ["-n", node, ...args], { ...runOpts, timeoutMs })

  const nodePid = (): number | undefined => {
    try {
      const pid = Number(readFileSync(pidFile, "utf8").trim())
      return Number.isInteger(pid) && pid > 0 ? pid : undefined
    } catch {
      return undefined
    }
  }
  let epmd: ChildProcess | undefined
  const killAllSync = () => {
    const pid = nodePid()
    if (pid !== undefined) signal(pid, "SIGKILL")
    if (epmd?.pid !== undefined) signal(epmd.pid, "SIGKILL")
    rmSync(dir, { recursive: true, force: true, maxRetries: 5 })
    watchdog.cancel()
  }

  try {
    mkdirSync(join(dir, "mnesia"))
    mkdirSync(logDir)
    writeFileSync(join(dir, "rabbitmq-env.conf"), "")
    writeFileSync(join(dir, "enabled_plugins"), "[].\n")
    // Written before the node starts: the node and the CLI would otherwise race to create it.
    writeFileSync(join(dir, ".erlang.cookie"), randomBytes(15).toString("hex").toUpperCase())
    chmodSync(join(dir, ".erlang.cookie"), 0o400)
    if (user) await run("chown", ["-R", `${user.uid}:${user.gid}`, dir])

    // Spawned, not -daemon, so we hold its PID; detached so a terminal's Ctrl-C does not kill it
    // before the node is stopped (rabbitmqctl finds the node through it).
    const [file, args] = asUser(user, bin.epmd, ["-address", "127.0.0.1", "-port", String(epmdPort)])
    epmd = spawn(file, args, { env, cwd: dir, stdio: "ignore", detached: true })
    epmd.unref()
    writeFileSync(join(dir, "epmd.pid"), String(epmd.pid))
    await waitForPort(epmdPort, 5_000)

    await run(bin.server, ["-detached"], runOpts)
    // await_startup right after -detached fails with "node not running": wait on the pid file first.
    await ctl(["wait", pidFile], 90_000)
    await ctl(["await_startup"], 60_000)
  } catch (error) {
    const log = tailFile(join(logDir, `${node}.log`)) || tailFile(join(logDir, `${node}_upgrade.log`))
    const crash = readdirSafe(logDir).includes("erl_crash.dump") ? " (erl_crash.dump written)" : ""
    killAllSync()
    if (/eaddrinuse/i.test(log)) throw new PortTaken(log)
    const message = error instanceof Error ? error.message : String(error)
    const details = log ? `\n--- ${node}.log\n${log}` : ""
    throw new Error(`could not start a local RabbitMQ${crash}: ${message}${details}`, { cause: error })
  }

  let stopped: Promise<void> | undefined
  return {
    url: `amqp://guest:guest@127.0.0.1:${port}`,
    port,
    node,
    dir,
    ctl: (args) => ctl(args),
    closeAllConnections: async (reason = "test") => {
      await ctl(["close_all_connections", "-p", "/", reason])
    },
    stop: () => {
      stopped ??= (async () => {
        const pid = nodePid()
        // Only a live node: `stop PIDFILE` waits out its timeout for a pid file that a node which
        // exited cleanly (SIGTERM) has removed.
        if (pid !== undefined && isAlive(pid)) {
          try {
            await ctl(["stop", pidFile], 30_000)
          } catch {
            signal(pid, "SIGKILL")
          }
          await waitForExit(pid, 10_000)
        }
        if (epmd?.pid !== undefined && isAlive(epmd.pid)) {
          signal(epmd.pid, "SIGTERM")
          await waitForExit(epmd.pid, 2_000)
        }
        rmSync(dir, { recursive: true, force: true, maxRetries: 5 })
        watchdog.cancel()
      })()
      return stopped
    },
    stopSync: () => {
      if (stopped) return
      stopped = Promise.resolve()
      killAllSync()
    },
  }
}

function readdirSafe(path: string): string[] {
  try {
    return readdirSync(path)
  } catch {
    return []
  }
}
