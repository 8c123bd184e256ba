/**
 * `txbox purge --older-than 7d`: retention for rows whose work is done — sent
 * outbox rows and processed inbox rows. Pending and dead rows are never
 * touched: they are work still to do, or evidence an operator must look at.
 */
import { Effect, Option } from "effect"
import { Command, Flag } from "effect/cli"
import type { StoreError } from "../Errors.ts"
import * as opsSql from "../storage/sql/operations.ts"
import { UsageError } from "./errors.ts"
import { connectionFlags, jsonFlag, parsing, withDatabase } from "./options.ts"
import { print, printJson } from "./output.ts"
import { parseDuration, parsePositive } from "./parse.ts"

interface Plan {
  readonly olderThan: number
  readonly outbox: boolean
  readonly inbox: boolean
  readonly batch: number
  /** Seconds: partition counters idle this long go; consumer cursors idle twice as long. */
  readonly idleKeys: number | undefined
  /** Seconds: archived dead rows (dropped partitions') archived this long ago go. */
  readonly archivedOlderThan: number | undefined
}

const plan = (input: {
  readonly olderThan: string
  readonly dedupeWindow: string
  readonly only: Option.Option<"outbox" | "inbox">
  readonly batch: number
  readonly idleKeys: Option.Option<string>
  readonly archivedOlderThan: Option.Option<string>
}): Plan => {
  const olderThan = parseDuration("older-than", input.olderThan)
  const window = parseDuration("dedupe-window", input.dedupeWindow)
  const only = Option.getOrUndefined(input.only)
  const batch = parsePositive("batch", input.batch)
  const inbox = only !== "outbox"
  // An inbox row is the only memory that a message was handled. Delete it
  // while the broker may still redeliver that message and the handler runs a
  // second time: the exactly-once effect the inbox exists for is gone.
  if (inbox && olderThan < window) {
    throw new UsageError({
      reason:
        `refusing to purge inbox rows younger than the dedupe window: --older-than ${input.olderThan} is less than ` +
        `--dedupe-window ${input.dedupeWindow} (inbox keys must outlive any broker redelivery; ` +
        "use --only outbox to purge the outbox alone)",
    })
  }
  const idle = Option.getOrUndefined(input.idleKeys)
  const idleKeys = idle === undefined ? undefined : parseDuration("idle-keys", idle)
  // A key's state may go only once nothing of it can still be on its way: a counter removed while
  // its last messages are in flight would let a newer epoch overtake them.
  if (idleKeys !== undefined && idleKeys < window) {
    throw new UsageError({
      reason: `refusing --idle-keys ${idle}: less than --dedupe-window ${input.dedupeWindow} (a key's last messages may still be on their way)`,
    })
  }
  const archived = Option.getOrUndefined(input.archivedOlderThan)
  const archivedOlderThan =
    archived === undefined ? undefined : parseDuration("archived-older-than", archived)
  return { olderThan, outbox: only !== "inbox", inbox, batch, idleKeys, archivedOlderThan }
}

/** Deletes in batches until a batch finds nothing: each statement holds its row locks for one batch only. */
const drain = (step: () => Effect.Effect<number, StoreError>) =>
  Effect.gen(function* () {
    let total = 0
    while (true) {
      const n = yield* step()
      if (n === 0) return total
      total += n
    }
  })

export const command = Command.make(
  "purge",
  {
    connection: connectionFlags,
    olderThan: Flag.String("older-than").pipe(
      Flag.withDescription("delete sent / processed rows older than this: 12h, 7d, 4w"),
    ),
    dedupeWindow: Flag.String("dedupe-window").pipe(
      Flag.withDescription(
        "how long the broker may redeliver a message; inbox rows younger than this are never purged (default: 7d)",
      ),
      Flag.withDefault("7d"),
    ),
    only: Flag.Literals("only", ["outbox", "inbox"]).pipe(
      Flag.withDescription("purge one table only (default: both)"),
      Flag.optional,
    ),
    batch: Flag.Int("batch").pipe(
      Flag.withDescription("rows per DELETE, so no statement holds locks for long (default: 5000)"),
      Flag.withDefault(5000),
    ),
    idleKeys: Flag.String("idle-keys").pipe(
      Flag.withDescription(
        "also delete per-key order state: partition counters unused this long (the key restarts at 1 in a newer " +
          "epoch) and consumer cursors unmoved twice as long with nothing left to handle; at least --dedupe-window",
      ),
      Flag.optional,
    ),
    archivedOlderThan: Flag.String("archived-older-than").pipe(
      Flag.withDescription(
        "also delete archived dead rows (moved out of dropped partitions) archived this long ago: 30d, 52w; " +
          "the archive is their last copy (default: the archives are kept)",
      ),
      Flag.optional,
    ),
    json: jsonFlag,
  },
  ({ connection, olderThan, dedupeWindow, only, batch, idleKeys, archivedOlderThan, json }) =>
    Effect.gen(function* () {
      const p = yield* parsing(() =>
        plan({ olderThan, dedupeWindow, only, batch, idleKeys, archivedOlderThan }),
      )
      yield* withDatabase(connection, { requireTables: true }, (db) =>
        Effect.gen(function* () {
          const before = yield* opsSql.cutoff(db, p.olderThan)
          const outbox = p.outbox ? yield* drain(() => opsSql.purgeSent(db, before, p.batch)) : null
          const inbox = p.inbox ? yield* drain(() => opsSql.purgeProcessed(db, before, p.batch)) : null
          let keys: { counters: number; cursors: number } | null = null
          if (p.idleKeys !== undefined) {
            const idleBefore = yield* opsSql.cutoff(db, p.idleKeys)
            const cursorsBefore = yield* opsSql.cutoff(db, 2 * p.idleKeys)
            keys = {
              counters: yield* drain(() => opsSql.purgeIdleCounters(db, idleBefore, p.batch)),
              cursors: yield* drain(() => opsSql.purgeIdleCursors(db, cursorsBefore, p.batch)),
            }
          }
          let archives: { outbox: number | null; inbox: number | null } | null = null
          if (p.archivedOlderThan !== undefined) {
            const archivedBefore = yield* opsSql.cutoff(db, p.archivedOlderThan)
            const of = (table: "outbox" | "inbox") =>
              drain(() => opsSql.purgeArchived(db, table, archivedBefore, p.batch))
            archives = {
              outbox: p.outbox ? yield* of("outbox") : null,
              inbox: p.inbox ? yield* of("inbox") : null,
            }
          }
          if (json) {
            return yield* printJson({
              cutoff: before,
              outbox_sent_deleted: outbox,
              inbox_processed_deleted: inbox,
              ...(keys === null
                ? {}
                : { partition_counters_deleted: keys.counters, inbox_cursors_deleted: keys.cursors }),
              ...(archives === null
                ? {}
                : { outbox_archive_deleted: archives.outbox, inbox_archive_deleted: archives.inbox }),
            })
          }
          if (archives !== null) {
            for (const [table, n] of Object.entries(archives))
              if (n !== null)
                yield* print(
                  `${table}_archive: deleted ${n} archived dead row${n === 1 ? "" : "s"} archived more than --archived-older-than ago`,
                )
          }
          if (keys !== null) {
            yield* print(
              `order state: deleted ${keys.counters} idle partition counter${keys.counters === 1 ? "" : "s"} and ${keys.cursors} idle consumer cursor${keys.cursors === 1 ? "" : "s"}`,
            )
          }
          if (outbox !== null) {
            yield* print(
              `outbox: deleted ${outbox} sent row${outbox === 1 ? "" : "s"} published before ${before.toISOString()}`,
            )
          }
          if (inbox !== null) {
            yield* print(
              `inbox: deleted ${inbox} processed row${inbox === 1 ? "" : "s"} processed before ${before.toISOString()}`,
            )
          }
        }),
      )
    }),
).pipe(
  Command.withDescription(
    "Delete sent outbox rows and processed inbox rows older than --older-than, in batches; pending and dead rows are never touched",
  ),
  Command.withShortDescription("Delete old sent and processed rows"),
)
