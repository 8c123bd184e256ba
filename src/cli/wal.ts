/**
 * `txbox wal create|status|drop`: the WAL relay's replication slot and publication (issue #27).
 * `create` makes them ahead of the relay (which makes them itself by default); `status` shows the
 * logical slots of the database and the WAL each keeps; `drop` removes them, which a deployment
 * going back to the polling relay must do: a slot nobody reads keeps its WAL until the disk fills.
 */
import { Effect, Option } from "effect"
import { Command, Flag } from "effect/cli"
import { ConfigError } from "../Errors.ts"
import { classifyDbError } from "../storage/sql/errors.ts"
import { runOn } from "../storage/sql/operations.ts"
import { defaultSlot, dropWal, setUpWal, WAL_NAME, type WalNames, walSlots } from "../storage/wal/slots.ts"
import { UsageError } from "./errors.ts"
import { connectionFlags, jsonFlag, withDatabase } from "./options.ts"
import { print, printJson, table } from "./output.ts"

const slotFlag = Flag.String("slot").pipe(
  Flag.withDescription("the replication slot (default: txbox_outbox, or txbox_<schema>_outbox)"),
  Flag.optional,
)
const publicationFlag = Flag.String("publication").pipe(
  Flag.withDescription("the publication (default: the slot's name)"),
  Flag.optional,
)

/** The statements as an Effect: a ConfigError stays one; a database failure is a StoreError. */
export const running = <A>(operation: string, f: () => Promise<A>) =>
  Effect.tryPromise({
    try: f,
    catch: (cause) => (cause instanceof ConfigError ? cause : classifyDbError(operation, cause)),
  })

const namesOf = (schema: string, slot: Option.Option<string>, publication: Option.Option<string>) =>
  Effect.gen(function* () {
    const s = Option.getOrElse(slot, () => defaultSlot(schema))
    const p = Option.getOrElse(publication, () => s)
    for (const [flag, name] of [
      ["--slot", s],
      ["--publication", p],
    ] as const) {
      if (!WAL_NAME.test(name))
        return yield* new UsageError({ reason: `${flag} ${name}: 1..63 of a-z, 0-9, _` })
    }
    return { schema, slot: s, publication: p } satisfies WalNames
  })

export const mib = (bytes: number | null) => (bytes === null ? "-" : `${(bytes / 2 ** 20).toFixed(1)} MiB`)

const create = Command.make(
  "create",
  { connection: connectionFlags, slot: slotFlag, publication: publicationFlag, json: jsonFlag },
  ({ connection, slot, publication, json }) =>
    withDatabase(connection, { requireTables: true }, (db) =>
      Effect.gen(function* () {
        const names = yield* namesOf(db.schema, slot, publication)
        yield* running("wal.create", () => setUpWal(runOn(db), names, true))
        if (json) return yield* printJson(names)
        yield* print(
          `publication ${names.publication} and slot ${names.slot} are ready for schema ${db.schema}`,
        )
      }),
    ),
).pipe(
  Command.withDescription(
    "Check wal_level and the role's REPLICATION, and create the WAL relay's publication and slot when missing (idempotent)",
  ),
)

const status = Command.make(
  "status",
  { connection: connectionFlags, json: jsonFlag },
  ({ connection, json }) =>
    withDatabase(connection, { requireTables: false }, (db) =>
      Effect.gen(function* () {
        const slots = yield* running("wal.status", () => walSlots(runOn(db)))
        if (json) return yield* printJson(slots)
        if (slots.length === 0) return yield* print("no logical replication slot in this database")
        yield* print(
          table(
            ["SLOT", "PLUGIN", "READ", "RETAINED", "BEHIND", "WAL"],
            slots.map((s) => [
              s.slot,
              s.plugin ?? "-",
              s.active ? "yes" : "no",
              mib(s.retained_bytes),
              mib(s.behind_bytes),
              s.wal_status ?? "-",
            ]),
            ["left", "left", "left", "right", "right", "left"],
          ),
        )
      }),
    ),
).pipe(
  Command.withDescription(
    "The database's logical replication slots: read now or not, the WAL each keeps (RETAINED) and how far its reader is behind (BEHIND)",
  ),
)

const drop = Command.make(
  "drop",
  {
    connection: connectionFlags,
    slot: slotFlag,
    publication: publicationFlag,
    force: Flag.Boolean("force").pipe(
      Flag.withDescription(
        "cut off the slot's reader first (a relay still running would create the slot again)",
      ),
      Flag.withDefault(false),
    ),
    json: jsonFlag,
  },
  ({ connection, slot, publication, force, json }) =>
    withDatabase(connection, { requireTables: false }, (db) =>
      Effect.gen(function* () {
        const names = yield* namesOf(db.schema, slot, publication)
        const dropped = yield* running("wal.drop", () => dropWal(runOn(db), names, force))
        if (json) return yield* printJson({ ...names, dropped })
        yield* print(
          `slot ${names.slot}: ${dropped.slot ? "dropped" : "not found"}; publication ${names.publication}: ${dropped.publication ? "dropped" : "not found"}`,
        )
      }),
    ),
).pipe(
  Command.withDescription(
    "Drop the WAL relay's slot and publication: going back to the polling relay, a slot nobody reads keeps its WAL until the disk fills",
  ),
)

export const command = Command.make("wal").pipe(
  Command.withDescription("The WAL relay's replication slot and publication"),
  Command.withSubcommands([create, status, drop]),
)
