import { Effect } from "effect"
import { StoreError } from "../../Errors.ts"

// Node socket errors and postgres.js's own connection codes: the server is
// gone or unreachable, so the operation may succeed on a later try.
const CONNECTION_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EPIPE",
  "ETIMEDOUT",
  "ENOTFOUND",
  "EAI_AGAIN",
  "CONNECTION_CLOSED",
  "CONNECTION_ENDED",
  "CONNECTION_DESTROYED",
  "CONNECT_TIMEOUT",
])

const CONNECTION_MESSAGES =
  /connection terminated|connection (?:is )?closed|terminating connection|server closed the connection|Client has encountered a connection error|Connection terminated|not queryable|the database system is (?:starting up|shutting down)/i

/** Functions of txbox's migrations that its statements call (0013's, 0020's). */
const TXBOX_FUNCTIONS = /\b(?:outbox_wake|outbox_claim_held|outbox_last_published|outbox_mark_held_sent)\b/

/**
 * A call of a function a newer migration adds, on a schema that has not had it: PostgreSQL says
 * "does not exist", which does not say that `txbox migrate` is the fix.
 */
const schemaBehind = (code: unknown, message: string, cause: unknown): unknown =>
  code === "42883" && TXBOX_FUNCTIONS.test(message) ? behindHint(code, message, cause) : cause

/** `cause` with its message saying that the schema is behind and `txbox migrate` is the fix. */
export const behindHint = (code: unknown, message: string, cause: unknown): Error =>
  Object.assign(
    new Error(`${message} (txbox's schema is behind this version of txbox: run \`txbox migrate\`)`, {
      cause,
    }),
    { code },
  )

/** Maps a driver error to a `StoreError` reason by SQLSTATE class, socket code or (last) message. */
export const classifyDbError = (operation: string, original: unknown): StoreError => {
  const code =
    typeof original === "object" && original !== null ? (original as { code?: unknown }).code : undefined
  const originalMessage = original instanceof Error ? original.message : String(original)
  const cause = schemaBehind(code, originalMessage, original)
  const message = cause instanceof Error ? cause.message : String(cause)
  let reason: StoreError["reason"] = "query"
  if (typeof code === "string") {
    // 08: connection exception; 57P0x: admin/crash shutdown; 53: insufficient resources;
    // 28: authentication (a rotated password comes back; keep trying, loudly).
    // 3D000: the database does not exist (yet).
    if (
      CONNECTION_CODES.has(code) ||
      code.startsWith("08") ||
      code.startsWith("57P") ||
      code.startsWith("53") ||
      code.startsWith("28") ||
      code === "3D000"
    ) {
      reason = "connection"
    } else if (code === "40001" || code === "40P01") reason = "serialization"
    else if (code.startsWith("23")) reason = "constraint"
    // 22021 invalid byte sequence (a NUL in text), 22P05 unsupported Unicode escape (\u0000 in jsonb).
    else if (code === "22021" || code === "22P05") reason = "data"
    // 25P02: current transaction is aborted, commands ignored until end of transaction block.
    else if (code === "25P02") reason = "aborted"
  }
  if (reason === "query" && CONNECTION_MESSAGES.test(message)) reason = "connection"
  return new StoreError({ reason, operation, cause })
}

/** Runs a driver call, turning whatever it throws into a classified `StoreError`. */
export const withDbErrors = async <T>(operation: string, f: () => Promise<T>): Promise<T> => {
  try {
    return await f()
  } catch (cause) {
    throw classifyDbError(operation, cause)
  }
}

/**
 * A driver call as an Effect failing with a classified `StoreError` (one
 * already classified by `withDbErrors` passes through). The signal aborts
 * when the Effect is interrupted, e.g. by a timeout.
 */
export const tryStore = <A>(
  operation: string,
  f: (signal: AbortSignal) => Promise<A>,
): Effect.Effect<A, StoreError> =>
  Effect.tryPromise({
    try: f,
    catch: (cause) => (cause instanceof StoreError ? cause : classifyDbError(operation, cause)),
  })

/**
 * `tryStore` for a statement that must be undone if it completes after it was given up on
 * (interrupted, e.g. timed out): `undo` gets its promise then. A callback with an interruption
 * handler, so no AbortController and listener per statement.
 */
export const tryStoreUndoable = <A>(
  operation: string,
  run: () => Promise<A>,
  undo: (pending: Promise<A>) => void,
): Effect.Effect<A, StoreError> =>
  Effect.callback<A, StoreError>((resume) => {
    const pending = run()
    pending.then(
      (value) => resume(Effect.succeed(value)),
      (cause) => resume(Effect.fail(cause instanceof StoreError ? cause : classifyDbError(operation, cause))),
    )
    return Effect.sync(() => undo(pending))
  })
