/**
 * The database port: a Kysely instance on PostgreSQL (any dialect: postgres.js,
 * node-postgres, PGlite) plus the one thing Kysely cannot do, LISTEN. Store
 * adapters (`txbox/postgres`, `txbox/pglite`) provide it; the core's queries
 * are plain Kysely SQL over it.
 */
import { Context, type Effect, type Scope } from "effect"
import type { Kysely } from "kysely"
import type { StoreError } from "../Errors.ts"

export interface DatabaseShape {
  // biome-ignore lint/suspicious/noExplicitAny: the caller's Kysely may describe their own tables too
  readonly db: Kysely<any>
  /** txbox's schema, validated as an identifier. */
  readonly schema: string
  /** Which driver sits under Kysely; tells health checks and docs which fault behaviour applies. */
  readonly driver: "postgres.js" | "pg" | "pglite" | "custom"
  /**
   * Subscribes to a NOTIFY channel until the scope closes. `onNotify` may be
   * called spuriously or not at all (a lost listener connection): NOTIFY only
   * shortens latency, polling keeps correctness.
   */
  readonly listen: (channel: string, onNotify: () => void) => Effect.Effect<void, StoreError, Scope.Scope>
}

// The base class in a variable with its type spelled out: JSR's fast check infers no type from a call.
const DatabaseService: Context.ServiceClass<Database, "txbox/Database", DatabaseShape> = Context.Service<
  Database,
  DatabaseShape
>()("txbox/Database")
export class Database extends DatabaseService {}
