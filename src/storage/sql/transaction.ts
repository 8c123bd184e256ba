import { Effect, Exit } from "effect"
import { type ControlledTransaction, type Kysely, sql, type Transaction } from "kysely"
import { StoreError } from "../../Errors.ts"
import { classifyDbError } from "./errors.ts"

const ROLLBACK_TIMEOUT_MS = 5_000

/** 25P02 at commit time, said the way a handler's author needs to read it. */
const aborted = (error: StoreError): StoreError =>
  error.reason === "aborted"
    ? new StoreError({
        reason: "aborted",
        operation: "commit",
        cause:
          "a statement in the handler's transaction failed and its error was caught; nothing was committed",
      })
    : error

/**
 * Runs `use` in a database transaction as an Effect: commit when it succeeds,
 * roll back when it fails or is interrupted. Kysely's controlled transaction
 * lets the handler stay an Effect (spans, context) instead of a callback.
 *
 * PostgreSQL answers COMMIT of a transaction in which a statement failed with
 * ROLLBACK and no error, so a handler that caught a failed statement
 * (`try { await trx… } catch {}`) would look committed while nothing was
 * written. Such a transaction fails as `StoreError` reason "aborted": the
 * node-postgres store turns that answer (command tag ROLLBACK) into an error
 * itself, at no cost (`commitRefusesAborted`); elsewhere one probe statement
 * before COMMIT fails with 25P02.
 */
export const withTransaction = <A, E, R>(
  // biome-ignore lint/suspicious/noExplicitAny: any database the caller describes
  db: Kysely<any>,
  // biome-ignore lint/suspicious/noExplicitAny: idem
  use: (trx: Transaction<any>) => Effect.Effect<A, E, R>,
  options: { readonly commitRefusesAborted: boolean },
): Effect.Effect<A, E | StoreError, R> =>
  Effect.acquireUseRelease(
    // Interruptible, so a bound around the whole transaction also cuts a BEGIN that hangs on a
    // dead connection (postgres.js after a restart, seen in the soak); a BEGIN that completes
    // after it was given up on is rolled back at once.
    Effect.interruptible(
      // A callback with an interruption handler, not tryPromise with a signal: no AbortController
      // and listener per transaction (one per message at low load).
      // biome-ignore lint/suspicious/noExplicitAny: any database the caller describes
      Effect.callback<ControlledTransaction<any>, StoreError>((resume) => {
        const begun = db.startTransaction().execute()
        begun.then(
          (trx) => resume(Effect.succeed(trx)),
          (cause) => resume(Effect.fail(classifyDbError("begin", cause))),
        )
        return Effect.sync(() => {
          begun.then((trx) => trx.rollback().execute()).catch(() => undefined)
        })
      }),
    ),
    (trx) =>
      Effect.flatMap(use(trx), (a) => {
        const commit = Effect.tryPromise({
          try: () => trx.commit().execute(),
          catch: (cause) => aborted(classifyDbError("commit", cause)),
        })
        const probe = Effect.tryPromise({
          try: () => sql`SELECT 1`.execute(trx),
          catch: (cause) => aborted(classifyDbError("commit", cause)),
        })
        return Effect.as(options.commitRefusesAborted ? commit : Effect.andThen(probe, commit), a)
      }),
    (trx, exit) =>
      Exit.isSuccess(exit) || trx.isCommitted || trx.isRolledBack
        ? Effect.void
        : // Bounded: on a connection whose server died, a rollback can hang (postgres.js); the
          // transaction is gone with the connection anyway.
          Effect.promise(() =>
            trx
              .rollback()
              .execute()
              .catch(() => undefined),
          ).pipe(Effect.timeout(ROLLBACK_TIMEOUT_MS), Effect.ignore),
  )
