/**
 * The flags every command shares (where the database is) and the scope a
 * command's work runs in: a small pool that is closed when the command ends,
 * checked for reachability and for txbox's tables before any other statement.
 */
import { Effect, Option } from "effect"
import { type Command, Flag } from "effect/cli"
import { validateSchemaName } from "../core/identifier.ts"
import type { ConfigError, StoreError } from "../Errors.ts"
import type { DatabaseShape } from "../ports/Database.ts"
import * as PgStore from "../storage/drivers/pg/PgStore.ts"
import * as PostgresJsStore from "../storage/drivers/postgres-js/PostgresJsStore.ts"
import * as opsSql from "../storage/sql/operations.ts"
import { NotReadyError, UsageError } from "./errors.ts"

export const connectionFlags = {
  url: Flag.String("url").pipe(
    Flag.withDescription("PostgreSQL URL, postgres://user:pass@host:port/db (default: $DATABASE_URL)"),
    Flag.optional,
  ),
  schema: Flag.String("schema").pipe(
    Flag.withDescription("schema holding txbox's tables (default: txbox)"),
    Flag.withDefault("txbox"),
  ),
  driver: Flag.Literals("driver", ["postgres.js", "pg"]).pipe(
    Flag.withDescription("driver under Kysely (default: pg, node-postgres)"),
    Flag.optional,
  ),
} as const

/** Each `--driver` value's store; node-postgres when none is given. */
const stores = { pg: PgStore, "postgres.js": PostgresJsStore } as const

export type Connection = Command.Command.Config.Infer<typeof connectionFlags>

export const jsonFlag: Flag.Flag<boolean> = Flag.Boolean("json").pipe(
  Flag.withDescription("print JSON instead of a table"),
  Flag.withDefault(false),
)

/** Runs `f`, turning the `UsageError`/`ConfigError` its parsing throws into a typed failure. */
export const parsing = <A>(f: () => A): Effect.Effect<A, UsageError | ConfigError> =>
  Effect.try({ try: f, catch: (e) => e as UsageError | ConfigError })

export interface DatabaseOptions {
  /**
   * Refuse to run unless `outbox` and `inbox` exist in the schema: every
   * command but `migrate`, which is how they come to exist.
   */
  readonly requireTables: boolean
}

/** Opens the store named by `connection`, runs `use` on it and closes it, whatever happens. */
export const withDatabase = <A, E, R>(
  connection: Connection,
  options: DatabaseOptions,
  use: (db: DatabaseShape) => Effect.Effect<A, E, R>,
): Effect.Effect<A, E | UsageError | ConfigError | NotReadyError | StoreError, R> =>
  Effect.gen(function* () {
    const url = Option.getOrUndefined(connection.url) ?? process.env.DATABASE_URL
    if (url === undefined || url === "") {
      return yield* new UsageError({ reason: "no database URL: pass --url or set DATABASE_URL" })
    }
    const schema = yield* parsing(() => validateSchemaName(connection.schema))
    const store = stores[Option.getOrElse(connection.driver, () => "pg" as const)]
    const db = yield* store.make({
      url,
      schema,
      // A command runs its statements one after another; LISTEN would only
      // hold a second connection open for nothing.
      listen: false,
      poolSize: 2,
    })
    const state = yield* opsSql.schemaState(db)
    if (options.requireTables) {
      if (!state.schemaExists) {
        return yield* new NotReadyError({ reason: `schema ${schema} not found — run \`txbox migrate\`` })
      }
      const missing = ["inbox", "outbox"].filter((t) => !state.tables.includes(t))
      if (missing.length > 0) {
        return yield* new NotReadyError({
          reason: `schema ${schema} has no ${missing.join(" or ")} table — run \`txbox migrate\``,
        })
      }
    }
    return yield* use(db)
  }).pipe(Effect.scoped)
