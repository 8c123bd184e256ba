// A private PostgreSQL 15 cluster from the local binaries, for tests that need a server of their
// own (restarts, killed backends) and as the fallback when there is neither a URL nor Docker.
import { spawnSync } from "node:child_process"
import { appendFileSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import {
  asUser,
  findExecutable,
  freePortBlock,
  isRoot,
  run,
  startWatchdog,
  stopOnce,
  tailFile,
  type UserIds,
  userIds,
} from "./proc.ts"

export interface LocalPostgres {
  /** `postgres://postgres@127.0.0.1:PORT/postgres`; trust auth, so no password. */
  readonly url: string
  readonly port: number
  /** Temp dir holding the data dir (`data/`), the socket and `postgres.log`; removed by `stop`. */
  readonly dir: string
  /** `pg_ctl restart -m fast`: same port, same URL; open connections are cut. */
  restart(): Promise<void>
  /** An outage: `pg_ctl stop -m fast`, `ms` with no server, then start again on the same port. */
  outage(ms: number): Promise<void>
  /** `pg_ctl stop -m immediate`, then removes the dir. Safe to call twice. */
  stop(): Promise<void>
  /** Synchronous `stop` for process exit hooks, where promises no longer run. */
  stopSync(): void
}

export interface LocalPostgresOptions {
  /** Shows in the temp dir name and in `ps` (as `cluster_name`), to tell clusters apart. */
  readonly name?: string
  /** More `postgresql.conf` lines (e.g. `wal_level = logical` for the WAL relay's tests). */
  readonly settings?: ReadonlyArray<string>
}

const BIN_DIRS = ["/usr/lib/postgresql/15/bin"]

export const POSTGRES_INSTALL_HINT =
  "install PostgreSQL 15 (apt-get install -y postgresql-15, for initdb and pg_ctl) or set TXBOX_TEST_DATABASE_URL"

const binDirs = (): string[] =>
  process.env.TXBOX_TEST_PG_BINDIR ? [process.env.TXBOX_TEST_PG_BINDIR, ...BIN_DIRS] : BIN_DIRS

/** A PostgreSQL binary (`initdb`, `pgbench`, …): TXBOX_TEST_PG_BINDIR, then the usual dirs, then PATH. */
export function postgresBinary(name: string): string | undefined {
  return findExecutable(
    name,
    binDirs().map((dir) => join(dir, name)),
  )
}

function binaries(): { initdb: string; pgCtl: string } {
  const initdb = postgresBinary("initdb")
  const pgCtl = postgresBinary("pg_ctl")
  if (initdb === undefined || pgCtl === undefined) {
    throw new Error(
      `PostgreSQL binaries not found (looked in ${binDirs().join(", ")} and PATH): ${POSTGRES_INSTALL_HINT}`,
    )
  }
  return { initdb, pgCtl }
}

// Durability off: a test cluster is thrown away, and fsync dominates commit latency otherwise.
const settings = (port: number, socketDir: string, name: string, more: ReadonlyArray<string> = []): string =>
  [
    "listen_addresses = '127.0.0.1'",
    `port = ${port}`,
    `unix_socket_directories = '${socketDir}'`,
    `cluster_name = '${name}'`,
    "max_connections = 200",
    "fsync = off",
    "synchronous_commit = off",
    "full_page_writes = off",
    ...more,
    "",
  ].join("\n")

export async function startLocalPostgres(options: LocalPostgresOptions = {}): Promise<LocalPostgres> {
  const { initdb, pgCtl } = binaries()
  const name = `txbox-${(options.name ?? "pg").replace(/[^A-Za-z0-9_-]/g, "_")}`
  const dir = mkdtempSync(join(tmpdir(), `${name}-`))
  const dataDir = join(dir, "data")
  const log = join(dir, "postgres.log")
  // If this process dies without stopping the cluster: SIGQUIT is PostgreSQL's immediate shutdown.
  const watchdog = startWatchdog(
    'pid=$(head -n 1 "$1/data/postmaster.pid" 2>/dev/null) && kill -QUIT "$pid"; sleep 1; rm -rf "$1"',
    [dir],
  )
  // initdb and pg_ctl refuse to run as root.
  const user: UserIds | undefined = isRoot() ? await userIds("postgres") : undefined
  const pgCtlRun = (args: readonly string[], timeoutMs = 90_000) =>
    run(pgCtl, ["-D", dataDir, ...args], { ...(user ? { user } : {}), cwd: dir, timeoutMs })

  try {
    if (user) await run("chown", [`${user.uid}:${user.gid}`, dir])
    // -N: no fsync of the new cluster, as with the settings above. C locale: same sort order everywhere.
    const initdbArgs = ["-D", dataDir, "-A", "trust", "--username=postgres", "-E", "UTF8", "--locale=C", "-N"]
    await run(initdb, initdbArgs, { ...(user ? { user } : {}), cwd: dir })
    // initdb 15 has no -c; settings go in an included file so a retry can rewrite the port.
    const conf = join(dataDir, "txbox.conf")
    appendFileSync(join(dataDir, "postgresql.conf"), "\ninclude 'txbox.conf'\n")

    let port = 0
    for (let attempt = 1; ; attempt++) {
      port = await freePortBlock(1)
      writeFileSync(conf, settings(port, dir, name, options.settings))
      if (user) await run("chown", [`${user.uid}:${user.gid}`, conf])
      try {
        await pgCtlRun(["-l", log, "-w", "-t", "60", "start"])
        break
      } catch (error) {
        // Another process may have taken the port between the check and the bind.
        if (attempt < 3 && /already in use|could not create any TCP\/IP sockets/.test(tailFile(log))) continue
        throw error
      }
    }

    return {
      url: `postgres://postgres@127.0.0.1:${port}/postgres`,
      port,
      dir,
      restart: async () => {
        await pgCtlRun(["-l", log, "-m", "fast", "-w", "-t", "60", "restart"])
      },
      outage: async (ms) => {
        await pgCtlRun(["-m", "fast", "-w", "-t", "60", "stop"])
        await new Promise((resolve) => setTimeout(resolve, ms))
        await pgCtlRun(["-l", log, "-w", "-t", "60", "start"])
      },
      ...stopOnce(
        () =>
          pgCtlRun(["-m", "immediate", "-w", "stop"], 30_000)
            .catch(() => {})
            .then(() => {
              rmSync(dir, { recursive: true, force: true, maxRetries: 5 })
              watchdog.cancel()
            }),
        () => {
          const [file, args] = asUser(user, pgCtl, ["-D", dataDir, "-m", "immediate", "-w", "stop"])
          spawnSync(file, args, { cwd: dir, stdio: "ignore", timeout: 10_000 })
          rmSync(dir, { recursive: true, force: true, maxRetries: 5 })
          watchdog.cancel()
        },
      ),
    }
  } catch (error) {
    const [file, args] = asUser(user, pgCtl, ["-D", dataDir, "-m", "immediate", "-w", "stop"])
    spawnSync(file, args, { cwd: dir, stdio: "ignore", timeout: 10_000 })
    const logTail = tailFile(log)
    rmSync(dir, { recursive: true, force: true, maxRetries: 5 })
    watchdog.cancel()
    const message = error instanceof Error ? error.message : String(error)
    const details = logTail ? `\n--- postgres.log\n${logTail}` : ""
    throw new Error(`could not start a local PostgreSQL: ${message}${details}`, { cause: error })
  }
}
