/**
 * A connection to txbox's database and its transactions: a Kysely instance on
 * PostgreSQL (postgres.js, node-postgres or PGlite underneath), the schema
 * txbox's tables live in, and LISTEN, the one thing Kysely cannot do. Store
 * adapters build the `OutboxStore` and `InboxStore` ports on it; the relay and
 * the inbox never see it. The CLI and migrations use it directly.
 */
import { Context, type Effect, type Scope } from "effect"
import type { Kysely } from "kysely"
import type { StoreError } from "../Errors.ts"

/** What the `Database` service holds: the Kysely instance on txbox's database, its schema, and LISTEN. */
export interface DatabaseShape {
  /** The Kysely instance txbox's statements run on; the store adapter owns its pool or connection. */
  // biome-ignore lint/suspicious/noExplicitAny: the caller's Kysely may describe their own tables too
  readonly db: Kysely<any>
  /** txbox's schema, validated as an identifier (the same value as `TxboxSchema`). */
  readonly schema: string
  /**
   * True when COMMIT of a transaction that a failed statement aborted fails
   * (25P02) instead of rolling back silently, as PostgreSQL answers it; a store
   * that cannot promise it leaves it unset, and txbox probes the transaction
   * before COMMIT (one more round trip).
   */
  readonly commitRefusesAborted?: boolean
  /**
   * True when the relay may hold its claims in a transaction: rows locked
   * (`FOR UPDATE SKIP LOCKED`) from the claim to the mark, which commits them
   * sent in the same transaction, instead of a lease written on every row and
   * written again by the mark. One row write per message instead of two. A
   * relay that dies drops its connection, and PostgreSQL hands the rows back
   * at once; one that hangs is cut off by `idle_in_transaction_session_timeout`
   * (the lease). Unset: leases (PGlite has one connection to share).
   */
  readonly holdsClaims?: boolean
  /**
   * A pooled connection of its own, on which several statements go in one round trip: what a
   * held claim keeps from its claim to its mark, so that `BEGIN` goes with the claim and `COMMIT`
   * with the mark (two round trips a batch instead of four). Optional: without it, held claims
   * run through Kysely's controlled transaction.
   */
  readonly session?: () => Promise<DatabaseSession>
  /**
   * Subscribes to a NOTIFY channel until the scope closes. `onNotify` may be
   * called spuriously or not at all (a lost listener connection): NOTIFY only
   * shortens latency, polling keeps correctness. `onHearing`, when given, is
   * told whether the LISTEN hears NOTIFYs sent the way producers send them
   * (false: a self-test or ping went unheard, or the store does not listen;
   * true again when one is heard), for the loops' health.
   */
  readonly listen: (
    channel: string,
    onNotify: () => void,
    onHearing?: (hears: boolean) => void,
  ) => Effect.Effect<void, StoreError, Scope.Scope>
}

/** One pooled connection, held until released (`DatabaseShape.session`). */
export interface DatabaseSession {
  /**
   * Runs `text`, one or more statements without parameters (the simple query protocol, so they
   * go in one round trip); each statement's rows and row count, in order. The first that fails
   * rejects, and PostgreSQL skips the rest.
   */
  readonly script: (text: string) => Promise<
    ReadonlyArray<{
      // biome-ignore lint/suspicious/noExplicitAny: rows as the driver parses them
      readonly rows: ReadonlyArray<any>
      readonly rowCount: number
    }>
  >
  /** Hands the connection back to the pool; `broken`: close it instead. */
  readonly release: (broken?: Error) => void
}

// The base class in a variable with its type spelled out: JSR's fast check infers no type from a call.
// `@internal` sits on the name: deno doc reads a variable's tags there, not before `const`.
const /** @internal */ DatabaseService: Context.ServiceClass<Database, "txbox/Database", DatabaseShape> =
    Context.Service<Database, DatabaseShape>()("txbox/Database")
/** The service of txbox's database connection: what store adapters and the migrator run on. */
export class Database extends DatabaseService {}

/**
 * The schema holding txbox's tables: the one setting every part reads. A store
 * layer (`PgStore.layer({ schema })`, `PgliteStore.layer({ schema })`)
 * provides it with the value its relay and inbox use, so `Outbox.enqueue` run
 * under that layer writes where the relay reads. Outside any store layer it is
 * "txbox"; provide `Layer.succeed(TxboxSchema)("name")` to change it there.
 */
export const TxboxSchema: Context.Reference<string> = Context.Reference<string>("txbox/Schema", {
  defaultValue: () => "txbox",
})

/** The outbox's NOTIFY channel, as outbox_wake() (migration 0013) sends on it; the inbox's is per consumer (SqlInboxStore). */
export const notifyChannel = (schema: string, table: "outbox"): string => `${schema}.${table}`
