// A private three-node RabbitMQ cluster on loopback, for tests of failover: nodes with their own
// names, AMQP and distribution ports and data directories, one shared cookie (HOME) and one
// private epmd. Nodes 2 and 3 join node 1; a node can be SIGKILLed by its OS pid and restarted.
// The single-node launcher (rabbitmq.ts) has the traps avoided here; its helpers are shared.
import type { ChildProcess } from "node:child_process"
import { randomBytes } from "node:crypto"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import {
  freePortBlock,
  isAlive,
  isRoot,
  run,
  signal,
  startWatchdog,
  stopOnce,
  type UserIds,
  userIds,
  waitForExit,
} from "./proc.ts"
import {
  bootFailure,
  bootNode,
  CTL_PORTS,
  type Ctl,
  type NodeLayout,
  nodeCtl,
  nodeEnv,
  PortTaken,
  pidFileOf,
  prepareNodeDir,
  type RabbitBinaries,
  rabbitBinaries,
  readPid,
  startEpmd,
  stopEpmd,
  stopNode,
  writeCookie,
} from "./rabbitmq.ts"

export interface ClusterNode {
  /** 1, 2, 3: node 1 is the one the others joined. */
  readonly index: number
  /** Erlang node name, `rabbit@…` style. */
  readonly node: string
  readonly port: number
  /** `amqp://guest:guest@127.0.0.1:PORT` (guest works from loopback). */
  readonly url: string
  /** OS pid of the node's VM (beam.smp), from its pid file. */
  readonly pid: () => number | undefined
  readonly isRunning: () => boolean
  /** `rabbitmqctl -n NODE ...args` as the broker's user; resolves with stdout. */
  readonly ctl: Ctl
  /** SIGKILL by its OS pid, as a crash; resolves once the process is gone. */
  readonly kill: () => Promise<void>
  /** Boots the node again; resolves once it runs and the cluster counts it as running. */
  readonly restart: () => Promise<void>
}

/** A client connection as the broker lists it. */
export interface BrokerConnection {
  /** The AMQP port of the node that serves it: which node a client is on. */
  readonly port: number
  /** The client's `connection_name` property (txbox sends `txbox <source>`). */
  readonly name: string | undefined
}

export interface RabbitCluster {
  readonly nodes: ReadonlyArray<ClusterNode>
  /** Every node's URL, in node order. */
  readonly urls: ReadonlyArray<string>
  /** Temp dir: HOME (with the cookie), one directory per node, epmd's pid; removed by `stop`. */
  readonly dir: string
  /** The node of `port`, if it is one of ours. */
  readonly nodeOfPort: (port: number) => ClusterNode | undefined
  /** `running_nodes` of `cluster_status`, asked of the first running node. */
  readonly runningNodes: () => Promise<ReadonlyArray<string>>
  /** Waits until `cluster_status` shows `count` running nodes. */
  readonly awaitRunning: (count: number, timeoutMs?: number) => Promise<void>
  /** Every client connection on the cluster (vhost `/`), asked of the first running node. */
  readonly connections: () => Promise<ReadonlyArray<BrokerConnection>>
  /** Stops every node that runs, then epmd, and removes the dir. Safe to call twice. */
  readonly stop: () => Promise<void>
  /** SIGKILLs every node and epmd and removes the dir, for process exit hooks. */
  readonly stopSync: () => void
}

const SIZE = 3

/** Ports, in one free block: AMQP and distribution per node, epmd, then the CLI's range. */
const PORT_BLOCK = 2 * SIZE + 1 + CTL_PORTS

export async function startRabbitCluster(): Promise<RabbitCluster> {
  const bin = rabbitBinaries()
  const user = isRoot() ? await userIds("rabbitmq") : undefined
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

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** `running_nodes` from `cluster_status --formatter json`. */
const parseRunning = (json: string): ReadonlyArray<string> => {
  const status = JSON.parse(json) as { running_nodes?: unknown }
  return Array.isArray(status.running_nodes) ? status.running_nodes.map(String) : []
}

/**
 * `list_connections port client_properties --formatter json`: client properties come as
 * `[name, type, value]` triples.
 */
const parseConnections = (json: string): ReadonlyArray<BrokerConnection> => {
  const rows = JSON.parse(json) as Array<{ port?: unknown; client_properties?: unknown }>
  return rows.map((row) => {
    const properties = Array.isArray(row.client_properties) ? (row.client_properties as unknown[]) : []
    const named = properties.find((p) => Array.isArray(p) && p[0] === "connection_name") as
      | unknown[]
      | undefined
    return { port: Number(row.port), name: named === undefined ? undefined : String(named[2]) }
  })
}

async function attemptStart(bin: RabbitBinaries, user: UserIds | undefined): Promise<RabbitCluster> {
  const base = await freePortBlock(PORT_BLOCK)
  const epmdPort = base + 2 * SIZE
  const id = `${process.pid}-${randomBytes(3).toString("hex")}`
  const dir = mkdtempSync(join(tmpdir(), "txbox-rabbit-cluster-"))
  // If this process dies without stopping the nodes. SIGKILL: the data is thrown away anyway.
  const watchdog = startWatchdog(
    'for f in "$1"/n*/rabbit.pid "$1"/epmd.pid; do pid=$(cat "$f" 2>/dev/null) && kill -KILL "$pid"; done; sleep 1; rm -rf "$1"',
    [dir],
  )
  const layouts: NodeLayout[] = Array.from({ length: SIZE }, (_, i) => ({
    node: `txbox-${id}-${i + 1}@localhost`,
    home: dir,
    dir: join(dir, `n${i + 1}`),
    port: base + 2 * i,
    distPort: base + 2 * i + 1,
    ctlPort: epmdPort + 1,
    epmdPort,
  }))
  const ctls = layouts.map((layout) => nodeCtl(bin, user, layout))
  let epmd: ChildProcess | undefined
  const killAllSync = () => {
    for (const layout of layouts) {
      const pid = readPid(pidFileOf(layout))
      if (pid !== undefined) signal(pid, "SIGKILL")
    }
    if (epmd?.pid !== undefined) signal(epmd.pid, "SIGKILL")
    rmSync(dir, { recursive: true, force: true, maxRetries: 5 })
    watchdog.cancel()
  }
  const running = (i: number) => {
    const pid = readPid(pidFileOf(layouts[i]!))
    return pid !== undefined && isAlive(pid)
  }
  /** The first running node's CLI: cluster-wide questions go to any member. */
  const anyCtl = (): Ctl => {
    const i = layouts.findIndex((_, j) => running(j))
    if (i < 0) throw new Error("no node of the cluster is running")
    return ctls[i]!
  }
  const runningNodes = async () => parseRunning(await anyCtl()(["cluster_status", "--formatter", "json"]))
  const awaitRunning = async (count: number, timeoutMs = 60_000) => {
    const deadline = Date.now() + timeoutMs
    let last: ReadonlyArray<string> = []
    for (;;) {
      try {
        last = await runningNodes()
        if (last.length === count) return
      } catch {}
      if (Date.now() > deadline) {
        throw new Error(`cluster_status shows ${last.length} running nodes, not ${count}: ${last.join(", ")}`)
      }
      await sleep(250)
    }
  }

  try {
    for (const layout of layouts) prepareNodeDir(layout)
    writeCookie(dir)
    if (user) await run("chown", ["-R", `${user.uid}:${user.gid}`, dir])
    epmd = await startEpmd(bin, user, nodeEnv(layouts[0]!), dir, epmdPort)
    const booted = await Promise.allSettled(layouts.map((layout) => bootNode(bin, user, layout)))
    for (const [i, result] of booted.entries()) {
      if (result.status === "rejected") throw bootFailure(layouts[i]!, result.reason)
    }
    // One at a time: joins that run at once can race on the cluster's schema.
    for (const ctl of ctls.slice(1)) {
      await ctl(["stop_app"])
      await ctl(["reset"])
      await ctl(["join_cluster", layouts[0]!.node])
      await ctl(["start_app"])
    }
    await awaitRunning(SIZE)
  } catch (error) {
    killAllSync()
    throw error
  }

  const nodes: ClusterNode[] = layouts.map((layout, i) => {
    const pidFile = pidFileOf(layout)
    return {
      index: i + 1,
      node: layout.node,
      port: layout.port,
      url: `amqp://guest:guest@127.0.0.1:${layout.port}`,
      pid: () => readPid(pidFile),
      isRunning: () => running(i),
      ctl: ctls[i]!,
      kill: async () => {
        const pid = readPid(pidFile)
        if (pid === undefined || !isAlive(pid)) return
        signal(pid, "SIGKILL")
        await waitForExit(pid, 10_000)
      },
      restart: async () => {
        if (running(i)) throw new Error(`${layout.node} is running`)
        // The killed node's pid file names a dead process, which `rabbitmqctl wait` would wait on.
        rmSync(pidFile, { force: true })
        try {
          await bootNode(bin, user, layout)
        } catch (error) {
          throw bootFailure(layout, error)
        }
        await awaitRunning(SIZE)
      },
    }
  })

  const cluster: RabbitCluster = {
    nodes,
    urls: nodes.map((n) => n.url),
    dir,
    nodeOfPort: (port) => nodes.find((n) => n.port === port),
    runningNodes,
    awaitRunning,
    connections: async () =>
      parseConnections(
        await anyCtl()(["list_connections", "-p", "/", "port", "client_properties", "--formatter", "json"]),
      ),
    ...stopOnce(async () => {
      await Promise.all(layouts.map((layout, i) => stopNode(ctls[i]!, pidFileOf(layout))))
      await stopEpmd(epmd)
      rmSync(dir, { recursive: true, force: true, maxRetries: 5 })
      watchdog.cancel()
    }, killAllSync),
  }
  return cluster
}
