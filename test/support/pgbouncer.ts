// A local PgBouncer in front of the tests' PostgreSQL, in `pool_mode = transaction` (what most
// production PostgreSQL sits behind): each transaction gets whichever server connection is free, so
// nothing a session sets outlives its statement or transaction. Started per test file, on a free
// port; killed when the file's tests end (and by a watchdog if the run dies).
import { type ChildProcess, spawn } from "node:child_process"
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import {
  findExecutable,
  freePortBlock,
  isRoot,
  signal,
  startWatchdog,
  tailFile,
  userIds,
  waitForExit,
  waitForPort,
} from "./proc.ts"

export const PGBOUNCER_INSTALL_HINT =
  "install PgBouncer (Debian/Ubuntu: apt-get install -y pgbouncer; macOS: brew install pgbouncer)"

export interface LocalPgBouncer {
  /** The same database as `databaseUrl`, through PgBouncer. */
  readonly url: string
  readonly port: number
  stop(): Promise<void>
}

export interface PgBouncerOptions {
  /** Server connections per (database, user): fewer than the clients, so they take turns. */
  readonly poolSize: number
}

/** Starts PgBouncer in transaction mode in front of `databaseUrl` (trust authentication, as the tests' server). */
export async function startPgBouncer(
  databaseUrl: string,
  options: PgBouncerOptions,
): Promise<LocalPgBouncer> {
  const binary = findExecutable("pgbouncer", [
    "/usr/sbin/pgbouncer",
    "/usr/bin/pgbouncer",
    "/usr/local/bin/pgbouncer",
  ])
  if (binary === undefined) throw new Error(`no pgbouncer for the tests: ${PGBOUNCER_INSTALL_HINT}`)
  const target = new URL(databaseUrl)
  const user = decodeURIComponent(target.username || "postgres")
  const database = target.pathname.slice(1) || "postgres"
  const dir = mkdtempSync(join(tmpdir(), "txbox-pgbouncer-"))
  chmodSync(dir, 0o777)
  const port = await freePortBlock(1)
  const log = join(dir, "pgbouncer.log")
  writeFileSync(join(dir, "users.txt"), `"${user}" ""\n`)
  writeFileSync(
    join(dir, "pgbouncer.ini"),
    [
      "[databases]",
      `* = host=${target.hostname} port=${target.port || 5432}`,
      "[pgbouncer]",
      "listen_addr = 127.0.0.1",
      `listen_port = ${port}`,
      "unix_socket_dir =",
      "auth_type = trust",
      `auth_file = ${join(dir, "users.txt")}`,
      "pool_mode = transaction",
      `default_pool_size = ${options.poolSize}`,
      "min_pool_size = 0",
      "reserve_pool_size = 0",
      "max_client_conn = 500",
      "max_db_connections = 0",
      // postgres.js and node-postgres send these at startup; PgBouncer would refuse the connection.
      "ignore_startup_parameters = extra_float_digits,options",
      `logfile = ${log}`,
      "",
    ].join("\n"),
  )
  // PgBouncer refuses to run as root: run it as postgres, as the local PostgreSQL.
  const ids = isRoot() ? await userIds("postgres") : undefined
  const args = [join(dir, "pgbouncer.ini")]
  const child: ChildProcess = ids
    ? spawn("setpriv", [`--reuid=${ids.uid}`, `--regid=${ids.gid}`, "--init-groups", "--", binary, ...args], {
        stdio: "ignore",
      })
    : spawn(binary, args, { stdio: "ignore" })
  child.on("error", () => {})
  const pid = child.pid
  const watchdog = startWatchdog('kill -KILL "$1" 2>/dev/null; rm -rf "$2"', [String(pid ?? 0), dir])
  try {
    await waitForPort(port, 15_000)
  } catch (error) {
    if (pid !== undefined) signal(pid, "SIGKILL")
    const details = tailFile(log)
    rmSync(dir, { recursive: true, force: true })
    watchdog.cancel()
    throw new Error(
      `could not start PgBouncer: ${error instanceof Error ? error.message : error}\n${details}`,
    )
  }
  const url = new URL(databaseUrl)
  url.hostname = "127.0.0.1"
  url.port = String(port)
  url.pathname = `/${database}`
  let stopped: Promise<void> | undefined
  return {
    url: url.toString(),
    port,
    stop: () => {
      stopped ??= (async () => {
        if (pid !== undefined) {
          signal(pid, "SIGTERM")
          await waitForExit(pid, 5_000).catch(() => signal(pid, "SIGKILL"))
        }
        rmSync(dir, { recursive: true, force: true })
        watchdog.cancel()
      })()
      return stopped
    },
  }
}
