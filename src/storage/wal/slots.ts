/**
 * The WAL relay's server objects: a publication of the outbox's inserts and a logical replication
 * slot with the `pgoutput` plugin. Set up (checked, created when missing), dropped and listed over
 * any way of running a statement, so `WalLog.layer` (its own node-postgres pool) and the `txbox wal`
 * command (the CLI's Kysely) share them.
 */
import { ConfigError } from "../../Errors.ts"

/** Runs one statement with positional parameters and gives its rows. */
export type Run = <R>(text: string, params?: ReadonlyArray<unknown>) => Promise<ReadonlyArray<R>>

export interface WalNames {
  /** The schema of txbox's tables (validated). */
  readonly schema: string
  /** The slot's and the publication's names (validated: a-z, 0-9, `_`). */
  readonly slot: string
  readonly publication: string
}

/** A slot's or a publication's name: PostgreSQL's rule for slots (lower case, digits, `_`), at most 63. */
export const WAL_NAME = /^[a-z0-9_]{1,63}$/

/** The slot's name when none is given: `txbox_outbox`, or `txbox_<schema>_outbox` for another schema. */
export const defaultSlot = (schema: string): string =>
  schema === "txbox" ? "txbox_outbox" : `txbox_${schema.toLowerCase()}_outbox`

const ALREADY_EXISTS = "42710"
const codeOf = (error: unknown): string | undefined => {
  const code = (error as { code?: unknown } | undefined)?.code
  return typeof code === "string" ? code : undefined
}

/** Another process created it first: as good. */
const ignoreExisting = (statement: Promise<unknown>): Promise<void> =>
  statement.then(
    () => undefined,
    (error) => {
      if (codeOf(error) !== ALREADY_EXISTS) throw error
    },
  )

/**
 * Checks what the server needs and creates what is missing (with `create`). What the server lacks
 * (`wal_level`, the role's REPLICATION, a missing object without `create`, a slot of another
 * plugin) is a `ConfigError` saying what to do; anything else (a connection lost) is thrown as is.
 */
export const setUpWal = async (run: Run, names: WalNames, create: boolean): Promise<void> => {
  const { schema, slot, publication } = names
  const level = (await run<{ wal_level: string }>("SHOW wal_level"))[0]?.wal_level
  if (level !== "logical") {
    throw new ConfigError({
      reason:
        `the WAL relay needs wal_level = logical, and the server has ${level}: ` +
        "ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL",
    })
  }
  const role = (
    await run<{ ok: boolean; name: string }>(
      "SELECT rolreplication OR rolsuper AS ok, rolname AS name FROM pg_roles WHERE rolname = current_user",
    )
  )[0]
  if (role?.ok !== true) {
    throw new ConfigError({
      reason: `the WAL relay's role ${role?.name ?? "?"} needs REPLICATION: ALTER ROLE ${role?.name ?? "<role>"} REPLICATION`,
    })
  }
  const missing = (what: string) =>
    new ConfigError({
      reason: `${what} does not exist: create it with txbox wal create, or let WalLog.layer create it (create: true)`,
    })
  if ((await run("SELECT 1 FROM pg_publication WHERE pubname = $1", [publication])).length === 0) {
    if (!create) throw missing(`publication ${publication}`)
    // Inserts only: the relay publishes new rows. Through the partitioned table's root, so every
    // day partition made later is in it, and the rows arrive as the root's.
    await ignoreExisting(
      run(
        `CREATE PUBLICATION "${publication}" FOR TABLE "${schema}".outbox WITH (publish = 'insert', publish_via_partition_root = true)`,
      ),
    )
  }
  const found = (
    await run<{ plugin: string | null; database: string | null; here: boolean }>(
      "SELECT plugin, database, database = current_database() AS here FROM pg_replication_slots WHERE slot_name = $1",
      [slot],
    )
  )[0]
  if (found === undefined) {
    if (!create) throw missing(`replication slot ${slot}`)
    await ignoreExisting(run("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", [slot]))
  } else if (found.here !== true) {
    // Slot names are the cluster's: another database's outbox has this one.
    throw new ConfigError({
      reason: `replication slot ${slot} belongs to database ${found.database ?? "(none: physical)"}: give WalLog a slot name of its own for this one`,
    })
  } else if (found.plugin !== "pgoutput") {
    throw new ConfigError({
      reason: `replication slot ${slot} is not a pgoutput logical slot (plugin ${found.plugin ?? "none: physical"}); give WalLog another slot name`,
    })
  }
}

/** What `dropWal` removed. */
export interface WalDropped {
  readonly slot: boolean
  readonly publication: boolean
}

/**
 * Drops the slot (so it holds no WAL any more) and the publication. A slot being read is refused
 * by PostgreSQL (its relay still runs); with `force` its reader is cut off first.
 */
export const dropWal = async (run: Run, names: WalNames, force: boolean): Promise<WalDropped> => {
  const { slot, publication } = names
  if (force) {
    await run(
      "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active",
      [slot],
    )
  }
  const slots = await run<{ slot_name: string }>(
    "SELECT pg_drop_replication_slot(slot_name), slot_name FROM pg_replication_slots WHERE slot_name = $1",
    [slot],
  )
  const publications = await run<{ pubname: string }>(
    "SELECT pubname FROM pg_publication WHERE pubname = $1",
    [publication],
  )
  if (publications.length > 0) await run(`DROP PUBLICATION IF EXISTS "${publication}"`)
  return { slot: slots.length > 0, publication: publications.length > 0 }
}

/** A logical slot of this database, as `txbox wal status` and `txbox status` show it. */
export interface WalSlot {
  readonly slot: string
  readonly plugin: string | null
  /** Whether a reader streams it now. */
  readonly active: boolean
  /** WAL the slot keeps on the server, bytes (from its restart position). */
  readonly retained_bytes: number | null
  /** WAL written since the position its reader last confirmed, bytes. */
  readonly behind_bytes: number | null
  /** `lost` once the server gave up its WAL (`max_slot_wal_keep_size`): its reader must start anew. */
  readonly wal_status: string | null
}

/** The logical replication slots of the current database. */
export const walSlots = (run: Run): Promise<ReadonlyArray<WalSlot>> =>
  run<WalSlot>(
    `SELECT slot_name AS slot, plugin, active,
            pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::float8 AS retained_bytes,
            pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::float8 AS behind_bytes,
            wal_status
       FROM pg_replication_slots
      WHERE slot_type = 'logical' AND database = current_database()
      ORDER BY slot_name`,
  )
