/** `txbox status`: how far behind the relay is, what is dead, per type, tenant and inbox consumer. */
import { Effect } from "effect"
import { Command, Flag } from "effect/cli"
import * as opsSql from "../storage/sql/operations.ts"
import { type WalSlot, walSlots } from "../storage/wal/slots.ts"
import { connectionFlags, jsonFlag, withDatabase } from "./options.ts"
import { oneLine, print, printJson, table } from "./output.ts"
import { formatAge } from "./parse.ts"
import { mib, running } from "./wal.ts"

const COUNTS = ["PENDING", "DUE", "IN FLIGHT", "DEAD", "SENT", "LAG"]
const RIGHT = ["left", "right", "right", "right", "right", "right", "right"] as const

/** A count, `~n` when estimated, `-` when not counted (an estimated table's per-type rows). */
const count = (n: number | null, estimated = false) => (n === null ? "-" : estimated ? `~${n}` : String(n))

const countCells = (c: opsSql.OutboxCounts, estimated = false) => [
  String(c.pending),
  String(c.due),
  String(c.in_flight),
  String(c.dead),
  count(c.sent, estimated),
  formatAge(c.lag_seconds),
]

/** The longest-waiting ordered keys `status` shows. */
const KEYS_SHOWN = 20

const headText = (k: opsSql.WaitingKey) =>
  k.head === "dead"
    ? `#${k.head_seq} dead: redrive, or \`txbox dead skip --consumer ${k.consumer} --id ${k.head_message_id}\``
    : k.head === "missing"
      ? `waiting for #${k.next_seq} (not received)`
      : `#${k.head_seq} pending`

export const render = (
  schema: string,
  outbox: opsSql.OutboxStatus,
  inbox: ReadonlyArray<opsSql.InboxConsumerStatus>,
  keys: ReadonlyArray<opsSql.WaitingKey> = [],
  slots: ReadonlyArray<WalSlot> = [],
): string => {
  const parts = [
    table([`OUTBOX (${schema})`, ...COUNTS], [["all", ...countCells(outbox.total, outbox.estimated)]], RIGHT),
  ]
  if (outbox.by_type.length > 0) {
    parts.push(
      table(
        ["TYPE", ...COUNTS],
        outbox.by_type.map((r) => [r.type, ...countCells(r)]),
        RIGHT,
      ),
    )
  }
  if (outbox.by_tenant.length > 0) {
    parts.push(
      table(
        ["TENANT", ...COUNTS],
        outbox.by_tenant.map((r) => [r.tenant ?? "(none)", ...countCells(r)]),
        RIGHT,
      ),
    )
  }
  parts.push(
    inbox.length === 0
      ? "INBOX: no rows"
      : table(
          ["INBOX CONSUMER", "PENDING", "PROCESSED", "DEAD", "OLDEST PENDING"],
          inbox.map((c) => [
            c.consumer,
            String(c.pending),
            count(c.processed),
            String(c.dead),
            formatAge(c.oldest_pending_age_seconds),
          ]),
          ["left", "right", "right", "right", "right"],
        ),
  )
  if (keys.length > 0) {
    parts.push(
      table(
        ["ORDERED KEY", "CONSUMER", "WAITING", "OLDEST", "HEAD", "LAST ERROR"],
        keys.map((k) => [
          k.partition_key,
          k.consumer,
          String(k.waiting),
          formatAge(k.oldest_age_seconds),
          headText(k),
          k.head === "dead" ? oneLine(k.head_last_error, 60) : "",
        ]),
        ["left", "left", "right", "right", "left", "left"],
      ),
    )
  }
  if (slots.length > 0) {
    parts.push(
      table(
        ["WAL SLOT", "READ", "RETAINED", "BEHIND", "WAL"],
        slots.map((s) => [
          s.slot,
          s.active ? "yes" : "no",
          mib(s.retained_bytes),
          mib(s.behind_bytes),
          s.wal_status ?? "-",
        ]),
        ["left", "left", "right", "right", "left"],
      ),
    )
  }
  if (outbox.estimated || inbox.some((c) => c.processed === null))
    parts.push(
      "Large tables: sent and processed rows are estimated from the table statistics (~) or not counted (-); --exact-up-to raises the limit.",
    )
  return parts.join("\n\n")
}

export const command = Command.make(
  "status",
  {
    connection: connectionFlags,
    json: jsonFlag,
    exactUpTo: Flag.Int("exact-up-to").pipe(
      Flag.withDescription(
        "count every row of a table up to this many (by its statistics); past it, count pending and dead rows through their indexes and estimate sent and processed ones, instead of a full scan",
      ),
      Flag.withDefault(opsSql.EXACT_UP_TO),
    ),
  },
  ({ connection, json, exactUpTo }) =>
    withDatabase(connection, { requireTables: true }, (db) =>
      Effect.gen(function* () {
        const outbox = yield* opsSql.outboxStatus(db, exactUpTo)
        const inbox = yield* opsSql.inboxStatus(db, exactUpTo)
        const keys = yield* opsSql.waitingKeys(db, KEYS_SHOWN)
        // The WAL relay's slots (and any other logical slot of the database): the WAL each keeps.
        const slots = yield* running("status.wal", () => walSlots(opsSql.runOn(db)))
        if (json)
          return yield* printJson({ schema: db.schema, outbox, inbox, ordered_keys: keys, wal_slots: slots })
        yield* print(render(db.schema, outbox, inbox, keys, slots))
      }),
    ),
).pipe(
  Command.withDescription(
    "Outbox pending / due / in flight / dead / sent and lag (seconds the oldest due row has waited), " +
      "per type and tenant; inbox pending / processed / dead per consumer; ordered keys still waiting " +
      "(the longest-waiting 20), with what holds each back; logical replication slots (the WAL relay's) and the WAL each keeps",
  ),
  Command.withShortDescription("Backlog, lag and dead rows, per type, tenant and consumer"),
)
