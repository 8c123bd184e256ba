/**
 * `txbox partitions list|create|drop`: the outbox's and the inbox's day
 * partitions (migration 0015). `create` makes the ones ahead of time (the
 * relay's and the inbox's housekeeping do too); `drop` removes whole old
 * partitions that hold nothing pending or dead, the cheap retention.
 */
import { Effect } from "effect"
import { Command, Flag } from "effect/cli"
import { DAY_MS } from "../storage/sql/partitionBounds.ts"
import * as partitions from "../storage/sql/partitions.ts"
import { UsageError } from "./errors.ts"
import { connectionFlags, jsonFlag, parsing, withDatabase } from "./options.ts"
import { print, printJson, table } from "./output.ts"
import { parseDuration } from "./parse.ts"

const when = (at: Date | undefined, id: string | undefined) => at?.toISOString() ?? id ?? "-"

export const renderPartitions = (rows: ReadonlyArray<partitions.QueuePartition>): string => {
  if (rows.length === 0) return "no partitions: the outbox and the inbox are plain tables (run txbox migrate)"
  return table(
    ["TABLE", "PARTITION", "FROM", "TO", "ROWS (EST.)"],
    rows.map((p) => [
      p.table,
      p.name,
      p.isDefault ? "DEFAULT" : when(p.from?.at, p.from?.id),
      p.isDefault ? "" : when(p.to?.at, p.to?.id),
      p.estimatedRows === undefined ? "-" : String(Math.round(p.estimatedRows)),
    ]),
    ["left", "left", "left", "left", "right"],
  )
}

const list = Command.make("list", { connection: connectionFlags, json: jsonFlag }, ({ connection, json }) =>
  withDatabase(connection, { requireTables: true }, (db) =>
    Effect.gen(function* () {
      const rows = yield* partitions.listPartitions(db)
      if (json) return yield* printJson(rows)
      yield* print(renderPartitions(rows))
    }),
  ),
).pipe(
  Command.withDescription(
    "List the outbox's and the inbox's partitions, with their ranges and estimated rows",
  ),
)

/** `--every` as ms: whole hours that divide a day, or whole days. */
export const parseEvery = (text: string): number => {
  const ms = parseDuration("every", text) * 1000
  const hourly = ms % 3_600_000 === 0 && ms < DAY_MS && DAY_MS % ms === 0
  if (!hourly && ms % DAY_MS !== 0)
    throw new UsageError({
      reason: `--every ${text}: a partition is whole days (1d, 7d) or hours that divide a day (1h, 6h, 12h)`,
    })
  return ms
}

const create = Command.make(
  "create",
  {
    connection: connectionFlags,
    ahead: Flag.String("ahead").pipe(
      Flag.withDescription("cover from now to this far ahead (default: 3d)"),
      Flag.withDefault("3d"),
    ),
    every: Flag.String("every").pipe(
      Flag.withDescription("each partition's length: 1d (default), 7d, or 1h, 6h, 12h"),
      Flag.withDefault("1d"),
    ),
    json: jsonFlag,
  },
  ({ connection, ahead, every, json }) =>
    Effect.gen(function* () {
      const aheadMs = yield* parsing(() => parseDuration("ahead", ahead) * 1000)
      const everyMs = yield* parsing(() => parseEvery(every))
      yield* withDatabase(connection, { requireTables: true }, (db) =>
        Effect.gen(function* () {
          const result = yield* partitions.ensurePartitions(db, { aheadMs, everyMs })
          if (json) return yield* printJson(result)
          for (const t of result.notPartitioned) yield* print(`${t}: not partitioned (run txbox migrate)`)
          for (const c of result.created) yield* print(`${c.table}: created ${c.name}`)
          for (const s of result.skipped)
            yield* print(`${s.table}: left ${s.name} to the default partition: ${s.reason}`)
          if (
            result.created.length === 0 &&
            result.skipped.length === 0 &&
            result.notPartitioned.length === 0
          )
            yield* print(`every partition up to ${ahead} ahead exists`)
        }),
      )
    }),
).pipe(
  Command.withDescription("Create the partitions from now to --ahead that do not exist yet (idempotent)"),
)

const drop = Command.make(
  "drop",
  {
    connection: connectionFlags,
    olderThan: Flag.String("older-than").pipe(
      Flag.withDescription("drop partitions whose range ended longer ago than this: 7d, 4w"),
    ),
    dedupeWindow: Flag.String("dedupe-window").pipe(
      Flag.withDescription(
        "inbox partitions stay until their range, and their last processed row, are older than this (default: 7d)",
      ),
      Flag.withDefault("7d"),
    ),
    dryRun: Flag.Boolean("dry-run").pipe(
      Flag.withDescription("say what would go; drop nothing"),
      Flag.withDefault(false),
    ),
    json: jsonFlag,
  },
  ({ connection, olderThan, dedupeWindow, dryRun, json }) =>
    Effect.gen(function* () {
      const olderThanMs = yield* parsing(() => parseDuration("older-than", olderThan) * 1000)
      const dedupeWindowMs = yield* parsing(() => parseDuration("dedupe-window", dedupeWindow) * 1000)
      yield* withDatabase(connection, { requireTables: true }, (db) =>
        Effect.gen(function* () {
          const decisions = yield* partitions.dropPartitions(db, { olderThanMs, dedupeWindowMs, dryRun })
          if (json) return yield* printJson(decisions)
          if (decisions.length === 0) return yield* print("no partition is old enough to drop")
          for (const d of decisions) {
            yield* print(
              d.dropped
                ? `${d.table}: ${dryRun ? "would drop" : "dropped"} ${d.name} (ended ${d.to.toISOString()})` +
                    (d.archived === 0
                      ? ""
                      : `, ${dryRun ? "archiving" : "archived"} ${d.archived} dead row${d.archived === 1 ? "" : "s"}`)
                : `${d.table}: kept ${d.name}: ${d.reason}`,
            )
          }
        }),
      )
    }),
).pipe(
  Command.withDescription(
    "Drop whole partitions older than --older-than that hold no pending row, their dead rows moved to the archive (never the default partition)",
  ),
)

export const command = Command.make("partitions").pipe(
  Command.withDescription("The outbox's and the inbox's time partitions: list, create ahead, drop old ones"),
  Command.withShortDescription("List, create or drop partitions"),
  Command.withSubcommands([list, create, drop]),
)
