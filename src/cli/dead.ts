/**
 * `txbox dead list|redrive|skip`: the dead letters of the outbox (default) or
 * of the inbox (`--inbox`, `--consumer NAME`), selected by the same filters;
 * `skip` lets an ordered key move past its dead head message.
 */
import { Effect, Option } from "effect"
import { Command, Flag } from "effect/cli"
import * as opsSql from "../storage/sql/operations.ts"
import { NotReadyError } from "./errors.ts"
import { connectionFlags, jsonFlag, parsing, withDatabase } from "./options.ts"
import { oneLine, print, printJson, table } from "./output.ts"
import { parseOutboxId, parsePositive, parseTimeBound } from "./parse.ts"

const text = (name: string, description: string) =>
  Flag.String(name).pipe(Flag.withDescription(description), Flag.optional)

const filterFlags = {
  inbox: Flag.Boolean("inbox").pipe(
    Flag.withDescription("the inbox's dead rows (every consumer) instead of the outbox's"),
    Flag.withDefault(false),
  ),
  consumer: text("consumer", "one inbox consumer's dead rows (implies --inbox)"),
  id: text("id", "one row: the outbox event id (a uuid) or the inbox message id"),
  type: text("type", "event type, exactly"),
  tenant: text("tenant", "tenant id, exactly"),
  since: text(
    "since",
    "from this time on: 2h, 7d (ago) or an ISO timestamp; outbox: occurred_at, inbox: received_at",
  ),
  until: text("until", "before this time: 2h, 7d (ago) or an ISO timestamp"),
} as const

type FilterInput = Command.Command.Config.Infer<typeof filterFlags>

const toFilter = (input: FilterInput): opsSql.DeadFilter => {
  const get = Option.getOrUndefined
  const table = input.inbox || Option.isSome(input.consumer) ? "inbox" : "outbox"
  const id = get(input.id)
  const since = get(input.since)
  const until = get(input.until)
  const consumer = get(input.consumer)
  const type = get(input.type)
  const tenant = get(input.tenant)
  return {
    table,
    ...(id === undefined ? {} : { id: table === "outbox" ? parseOutboxId(id) : id }),
    ...(consumer === undefined ? {} : { consumer }),
    ...(type === undefined ? {} : { type }),
    ...(tenant === undefined ? {} : { tenant }),
    ...(since === undefined ? {} : { since: parseTimeBound("since", since) }),
    ...(until === undefined ? {} : { until: parseTimeBound("until", until) }),
  }
}

/** "dead outbox rows", "dead inbox row of consumer billing". */
const deadRows = (filter: opsSql.DeadFilter, n: number) =>
  `dead ${filter.table} row${n === 1 ? "" : "s"}${filter.consumer === undefined ? "" : ` of consumer ${filter.consumer}`}`

export const renderList = (filter: opsSql.DeadFilter, rows: ReadonlyArray<opsSql.DeadRow>, limit: number) => {
  if (rows.length === 0) return `no ${deadRows(filter, 0)} match`
  const inbox = filter.table === "inbox"
  // The column shows only when some row was archived (its partition dropped: migration 0016).
  const archive = rows.some((r) => r.archived)
  const headers = [
    inbox ? "MESSAGE ID" : "ID",
    ...(inbox ? ["CONSUMER"] : []),
    "TYPE",
    "TENANT",
    "ATTEMPTS",
    inbox ? "RECEIVED" : "OCCURRED",
    ...(archive ? ["ARCHIVED"] : []),
    "LAST ERROR",
  ]
  const body = rows.map((r) => [
    r.id,
    ...(inbox ? [r.consumer ?? "-"] : []),
    r.type ?? "-",
    r.tenant ?? "-",
    String(r.attempts),
    r.time.toISOString(),
    ...(archive ? [r.archived ? "yes" : "no"] : []),
    oneLine(r.last_error, 100),
  ])
  const align = [
    ...(["left", "left", "left"] as const),
    ...(inbox ? (["left"] as const) : []),
    ...(["right", "left"] as const),
    ...(archive ? (["left"] as const) : []),
    "left" as const,
  ]
  const footer =
    rows.length === limit
      ? `${rows.length} ${deadRows(filter, rows.length)} (the newest ${limit}; --limit shows more)`
      : `${rows.length} ${deadRows(filter, rows.length)}`
  return `${table(headers, body, align)}\n\n${footer}`
}

const list = Command.make(
  "list",
  {
    connection: connectionFlags,
    filters: filterFlags,
    limit: Flag.Int("limit").pipe(
      Flag.withDescription("at most this many rows, newest first (default: 50)"),
      Flag.withDefault(50),
    ),
    json: jsonFlag,
  },
  ({ connection, filters, limit, json }) =>
    Effect.gen(function* () {
      const filter = yield* parsing(() => toFilter(filters))
      const max = yield* parsing(() => parsePositive("limit", limit))
      yield* withDatabase(connection, { requireTables: true }, (db) =>
        Effect.gen(function* () {
          const rows = yield* opsSql.listDead(db, filter, max)
          if (json) return yield* printJson(rows)
          yield* print(renderList(filter, rows, max))
        }),
      )
    }),
).pipe(
  Command.withDescription(
    "List dead rows, newest first (outbox by default; --inbox or --consumer for the inbox)",
  ),
  Command.withShortDescription("List dead rows"),
)

const redrive = Command.make(
  "redrive",
  {
    connection: connectionFlags,
    filters: filterFlags,
    limit: Flag.Int("limit").pipe(
      Flag.withDescription("redrive at most this many rows (default: every matching row)"),
      Flag.optional,
    ),
    batch: Flag.Int("batch").pipe(
      Flag.withDescription("rows per statement, so row locks are held briefly (default: 5000)"),
      Flag.withDefault(5000),
    ),
    dryRun: Flag.Boolean("dry-run").pipe(
      Flag.withDescription("only count the rows that would be redriven"),
      Flag.withDefault(false),
    ),
    json: jsonFlag,
  },
  ({ connection, filters, limit, batch, dryRun, json }) =>
    Effect.gen(function* () {
      const filter = yield* parsing(() => toFilter(filters))
      const size = yield* parsing(() => parsePositive("batch", batch))
      const cap = yield* parsing(() => Option.map(limit, (n) => parsePositive("limit", n)))
      yield* withDatabase(connection, { requireTables: true }, (db) =>
        Effect.gen(function* () {
          const matched = yield* opsSql.countDead(db, filter)
          const target = Option.match(cap, { onNone: () => matched, onSome: (n) => Math.min(n, matched) })
          if (dryRun) {
            if (json)
              return yield* printJson({ table: filter.table, dry_run: true, matched, would_redrive: target })
            return yield* print(
              `${target} ${deadRows(filter, target)} would be redriven (dry run: nothing changed)`,
            )
          }
          // Bounded by the count taken first: rows that die again while this
          // runs (a relay retrying them at once) cannot keep the loop going.
          let redriven = 0
          while (redriven < target) {
            const n = yield* opsSql.redriveDead(db, filter, Math.min(size, target - redriven))
            if (n === 0) break
            redriven += n
          }
          if (json) return yield* printJson({ table: filter.table, dry_run: false, matched, redriven })
          yield* print(
            `redrove ${redriven} ${deadRows(filter, redriven)}: pending again, attempts reset to 0, due now` +
              (filter.table === "inbox"
                ? " (the consumer's inbox processor takes them, in either mode)"
                : ""),
          )
        }),
      )
    }),
).pipe(
  Command.withDescription(
    "Set matching dead rows back to pending (attempts 0, due now, last_error kept); safe to repeat: the inbox deduplicates",
  ),
  Command.withShortDescription("Send dead rows again"),
)

const skip = Command.make(
  "skip",
  {
    connection: connectionFlags,
    consumer: Flag.String("consumer").pipe(Flag.withDescription("the inbox consumer")),
    id: Flag.String("id").pipe(Flag.withDescription("the dead message's id (the head of its key)")),
    json: jsonFlag,
  },
  ({ connection, consumer, id, json }) =>
    withDatabase(connection, { requireTables: true }, (db) =>
      Effect.gen(function* () {
        const result = yield* opsSql.skipDead(db, consumer, id)
        if (json) return yield* printJson(result)
        // The database is fine; the row is not one that can be skipped: exit 1, as a refused state.
        if (!result.skipped)
          return yield* new NotReadyError({
            reason: `cannot skip ${id} of consumer ${consumer}: ${result.reason}`,
          })
        yield* print(
          `skipped #${result.seq} of key ${result.partition_key} for consumer ${consumer}: the key's next message runs; ` +
            "the dead row stays (redriving it later runs it out of order)",
        )
      }),
    ),
).pipe(
  Command.withDescription(
    "Let an ordered key move past its dead head message: its later messages run; the dead row is kept",
  ),
  Command.withShortDescription("Unblock an ordered key past a dead message"),
)

export const command = Command.make("dead").pipe(
  Command.withDescription(
    "Dead letters: list them, redrive them to be tried again, or skip one that blocks an ordered key",
  ),
  Command.withShortDescription("List, redrive or skip dead rows"),
  Command.withSubcommands([list, redrive, skip]),
)
