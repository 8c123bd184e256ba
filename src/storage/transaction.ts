import { Effect, Exit } from "effect"
import type { Kysely, Transaction } from "kysely"
import type { StoreError } from "../Errors.ts"
import { classifyDbError } from "./dbErrors.ts"

/**
 * Runs `use` in a database transaction as an Effect: commit when it succeeds,
 * roll back when it fails or is interrupted. Kysely's controlled transaction
 * lets the handler stay an Effect (spans, context) instead of a callback.
 */
export const withTransaction = <A, E, R>(
  // biome-ignore lint/suspicious/noExplicitAny: any database the caller describes
  db: Kysely<any>,
  // biome-ignore lint/suspicious/noExplicitAny: idem
  use: (trx: Transaction<any>) => Effect.Effect<A, E, R>,
): Effect.Effect<A, E | StoreError, R> =>
  Effect.acquireUseRelease(
    Effect.tryPromise({
      try: () => db.startTransaction().execute(),
      catch: (cause) => classifyDbError("begin", cause),
    }),
    (trx) =>
      Effect.flatMap(use(trx), (a) =>
        Effect.as(
          Effect.tryPromise({
            try: () => trx.commit().execute(),
            catch: (cause) => classifyDbError("commit", cause),
          }),
          a,
        ),
      ),
    (trx, exit) =>
      Exit.isSuccess(exit) || trx.isCommitted || trx.isRolledBack
        ? Effect.void
        : Effect.promise(() =>
            trx
              .rollback()
              .execute()
              .catch(() => undefined),
          ),
  )
