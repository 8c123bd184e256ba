/**
 * postgres.js under Kysely, plus a watched LISTEN. postgres.js 3.4.9 writes to
 * a socket it dropped when a transaction goes on after its connection closed
 * (upstream #1066, #1154, #1208): an uncatchable TypeError that ends a Node
 * process or leaves the statement waiting on Bun. `renewingPool.ts`
 * keeps every statement off such a connection and replaces the pool; its
 * LISTEN is watched (`../shared/listenWatchdog.ts`). `postgres` is an optional peer
 * dependency, imported when the store is built.
 */
import { Effect, type Scope } from "effect"
import { Kysely } from "kysely"
import type postgres from "postgres"
import { defaultExport, loadDriver } from "../../../drivers.ts"
import type { ConfigError, StoreError } from "../../../Errors.ts"
import type { DatabaseShape } from "../../../ports/Database.ts"
import { classifyDbError } from "../../sql/errors.ts"
import { PING_PAYLOAD, watchedListen } from "../shared/listenWatchdog.ts"
import { noListen, relisten, relistenForever, type ValidConnection } from "../shared/postgresConnection.ts"
import { PostgresJsDialect, type PostgresJsPool } from "./dialect.ts"
import { holdLostConnectionGuard } from "./lostConnectionRejections.ts"
import { makeRenewingClient } from "./renewingPool.ts"

// How often a postgres.js LISTEN is checked, and how long its ping may take to come back.
const LISTEN_PING_EVERY_MS = 5_000
const LISTEN_PING_WITHIN_MS = 5_000
// Statements of the retired pool get this long to finish; what still hangs then is failed.
const RENEW_GRACE_SECONDS = 10
// After a close, how long a statement queued in a reservation that has not said which connection it
// holds may wait before it is failed (never sent: failing it cannot hide an answer).
const SETTLE_AFTER_CLOSE_MS = 3_000

/** Opens a postgres.js pool as the `Database` service, in the current scope. */
export const open = (
  v: ValidConnection,
  entry: string,
): Effect.Effect<DatabaseShape, ConfigError, Scope.Scope> =>
  Effect.gen(function* () {
    const driver = defaultExport<typeof postgres>(
      yield* loadDriver({ name: "postgres", entry, load: () => import("postgres") }),
    )
    // postgres.js can reject a promise nobody holds when a new connection dies (see the module).
    yield* Effect.acquireRelease(Effect.sync(holdLostConnectionGuard), (release) => Effect.sync(release))
    // A fresh pool after any connection closes, and no statement on a closed connection (see the module).
    const client = makeRenewingClient(
      (onclose) =>
        driver(v.url, {
          max: v.poolSize,
          connect_timeout: v.timeout,
          max_lifetime: null,
          // Unnamed statements: a transaction pooler (PgBouncer 1.18 in transaction mode) knows no
          // named prepared statement from one transaction to the next.
          prepare: false,
          onnotice: () => {},
          onclose,
          // Names the driver in pg_stat_activity, so an operator can tell which fault behaviour applies.
          connection: { application_name: "txbox/postgres.js" },
        }),
      { graceSeconds: RENEW_GRACE_SECONDS, settleMs: SETTLE_AFTER_CLOSE_MS },
    )
    const db = yield* Effect.acquireRelease(
      Effect.sync(
        () =>
          new Kysely<unknown>({
            dialect: new PostgresJsDialect({ postgres: client.facade as unknown as PostgresJsPool }),
          }),
      ),
      (db) => Effect.promise(() => db.destroy().catch(() => undefined)),
    )
    // With a listenUrl, LISTEN has a connection of its own there (direct, past a transaction pooler).
    const listener =
      v.listenUrl === v.url
        ? undefined
        : yield* Effect.acquireRelease(
            Effect.sync(() =>
              driver(v.listenUrl, {
                max: 1,
                connect_timeout: v.timeout,
                onnotice: () => {},
                connection: { application_name: "txbox/postgres.js-listen" },
              }),
            ),
            (sql) => Effect.promise(() => sql.end({ timeout: 1 }).catch(() => undefined)),
          )
    // postgres.js gives up on a LISTEN whose re-issue after a reconnect fails (the server still
    // down), without a word: the watchdog notices and subscribes again.
    const listen = (
      channel: string,
      onNotify: () => void,
      onHearing?: (hears: boolean) => void,
    ): Effect.Effect<void, StoreError, Scope.Scope> =>
      watchedListen({
        onHearing,
        subscribe: (onPayload) =>
          Effect.tryPromise({
            // postgres.js calls `onlisten` after each LISTEN it issues, its own re-issues included:
            // a NOTIFY sent while none was up is lost, so the loop looks once then.
            try: () => (listener ?? client.current()).listen(channel, onPayload, onNotify),
            catch: (cause) => classifyDbError("listen", cause),
          }).pipe(Effect.retry({ schedule: relisten, times: 5 })),
        ping: Effect.tryPromise({
          try: () => client.current().notify(channel, PING_PAYLOAD),
          catch: (cause) => classifyDbError("listen", cause),
        }),
        onNotify,
        resubscribe: (subscribe) => subscribe.pipe(Effect.retry({ schedule: relistenForever }), Effect.orDie),
        channel,
        every: LISTEN_PING_EVERY_MS,
        within: LISTEN_PING_WITHIN_MS,
      })
    return {
      db,
      schema: v.schema,
      listen: v.listen ? listen : noListen,
      // postgres.js does not report an aborted COMMIT: txbox probes the transaction before COMMIT.
      commitRefusesAborted: false,
      // Off unless asked for: a backend that dies inside a transaction is postgres.js's worst
      // failure (docs/drivers-under-faults.md), and a held claim is a transaction across a publish.
      holdsClaims: v.holdClaims === true,
    } satisfies DatabaseShape
  })
