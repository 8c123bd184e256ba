/**
 * How the command fails: one line on stderr, never a stack trace, never a
 * credential, and an exit code a script can branch on — 2 when the command
 * line or configuration is wrong (fix the invocation), 1 when the database
 * said no or could not be reached (fix the environment, or retry).
 */
import { Data } from "effect"
import { ConfigError, redactUrls, StoreError, TransportError } from "../Errors.ts"

/** The invocation is wrong: a bad flag value, a missing URL, a refused combination. Exit code 2. */
export class UsageError extends Data.TaggedError("UsageError")<{ readonly reason: string }> {
  override get message(): string {
    return this.reason
  }
}

/** The database is reachable but not ready for the command (no schema, no tables). Exit code 1. */
export class NotReadyError extends Data.TaggedError("NotReadyError")<{ readonly reason: string }> {
  override get message(): string {
    return this.reason
  }
}

/** A check ran and found a problem (`txbox contracts check`: incompatible). Exit code 1. */
export class CheckFailedError extends Data.TaggedError("CheckFailedError")<{ readonly reason: string }> {
  override get message(): string {
    return this.reason
  }
}

export const EXIT_RUNTIME = 1
export const EXIT_USAGE = 2

// SQLSTATE classes that mean "cannot get in", whatever storage/sql/errors.ts calls them:
// 28 invalid authorization (bad password, no such role), 3D000 no such database.
const cannotConnect = (error: StoreError): boolean => {
  if (error.reason === "connection") return true
  const code = (error.cause as { code?: unknown } | undefined)?.code
  return typeof code === "string" && (code.startsWith("28") || code === "3D000")
}

const causeText = (cause: unknown): string => {
  if (cause instanceof Error) {
    // Node's AggregateError (a host with several addresses, all refusing) has an empty message.
    if (cause.message === "" && "errors" in cause && Array.isArray(cause.errors)) {
      return cause.errors.map((e) => (e instanceof Error ? e.message : String(e))).join("; ")
    }
    return cause.message || (cause as { code?: string }).code || cause.name
  }
  return String(cause)
}

/** One line and an exit code for anything the command can fail with. */
export const describeFailure = (error: unknown): { readonly line: string; readonly exitCode: number } => {
  const line = (text: string) => redactUrls(text.replace(/\s*\n\s*/g, " ").trim())
  if (error instanceof UsageError || error instanceof ConfigError) {
    return { line: line(error.message), exitCode: EXIT_USAGE }
  }
  if (error instanceof NotReadyError || error instanceof CheckFailedError) {
    return { line: line(error.message), exitCode: EXIT_RUNTIME }
  }
  if (error instanceof StoreError) {
    const text = cannotConnect(error)
      ? `cannot connect to the database: ${causeText(error.cause)}`
      : `${error.operation} failed: ${causeText(error.cause)}`
    return { line: line(text), exitCode: EXIT_RUNTIME }
  }
  if (error instanceof TransportError) {
    const text =
      error.reason === "connection"
        ? `cannot connect to the broker: ${causeText(error.cause)}`
        : `${error.operation} failed (${error.reason}): ${causeText(error.cause)}`
    return { line: line(text), exitCode: EXIT_RUNTIME }
  }
  return { line: line(`unexpected failure: ${causeText(error)}`), exitCode: EXIT_RUNTIME }
}
