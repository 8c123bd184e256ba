/** `txbox status`: how far behind the relay is, what is dead, per type, tenant and inbox consumer. */
import { Effect } from "effect"
import { Command } from "effect/cli"
import * as opsSql from "../storage/opsSql.ts"
import { connectionFlags, jsonFlag, withDatabase } from "./options.ts"
import { print, printJson, table } from "./output.ts"
import { formatAge } from "./parse.ts"

const COUNTS = ["PENDING", "DUE", "IN FLIGHT", "DEAD", "SENT", "LAG"]
const RIGHT = ["left", "right", "right", "right", "right", "right", "right"] as const

const countCells = (c: opsSql.OutboxCounts) => [
  String(c.pending),
  String(c.due),
  String(c.in_flight),
  String(c.dead),
  String(c.sent),
  formatAge(c.lag_seconds),
]

export const render = (
  schema: string,
  outbox: opsSql.OutboxStatus,
  inbox: ReadonlyArray<opsSql.InboxConsumerStatus>,
): string => {
  const parts = [table([`OUTBOX (${schema})`, ...COUNTS], [["all", ...countCells(outbox.total)]], RIGHT)]
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
            String(c.processed),
            String(c.dead),
            formatAge(c.oldest_pending_age_seconds),
          ]),
          ["left", "right", "right", "right", "right"],
        ),
  )
  return parts.join("\n\n")
}

export const command = Command.make(
  "status",
  { connection: connectionFlags, json: jsonFlag },
  ({ connection, json }) =>
    withDatabase(connection, { requireTables: true }, (db) =>
      Effect.gen(function* () {
        const outbox = yield* opsSql.outboxStatus(db)
        const inbox = yield* opsSql.inboxStatus(db)
        if (json) return yield* printJson({ schema: db.schema, outbox, inbox })
        yield* print(render(db.schema, outbox, inbox))
      }),
    ),
).pipe(
  Command.withDescription(
    "Outbox pending / due / in flight / dead / sent and lag (seconds the oldest due row has waited), " +
      "per type and tenant; inbox pending / processed / dead per consumer",
  ),
  Command.withShortDescription("Backlog, lag and dead rows, per type, tenant and consumer"),
)
