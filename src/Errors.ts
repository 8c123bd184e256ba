/**
 * Every failure txbox reports is a tagged error with a `reason` and a `retryable`
 * verdict, so callers can `Effect.catchTag` precisely and the relay can decide
 * between "retry later" and "dead at once" without string matching.
 */
import { Data } from "effect"

// Each base class in a variable with its type spelled out: JSR's fast check infers no type from a call.
type TaggedErrorClass<Tag extends string> = ReturnType<typeof Data.TaggedError<Tag>>

/** A payload did not match its contract's schema (on enqueue or on consume). */
const ValidationErrorBase: TaggedErrorClass<"ValidationError"> = Data.TaggedError("ValidationError")
export class ValidationError extends ValidationErrorBase<{
  readonly type: string
  readonly version: number
  readonly issues: ReadonlyArray<{ readonly message: string; readonly path?: string }>
}> {
  readonly retryable = false
  override get message(): string {
    const first = this.issues
      .slice(0, 3)
      .map((i) => (i.path ? `${i.path}: ${i.message}` : i.message))
      .join("; ")
    return `invalid payload for ${this.type}@v${this.version}: ${first}`
  }
}

/** A message arrived whose (type, version) no contract in the registry handles. */
const UnknownEventErrorBase: TaggedErrorClass<"UnknownEventError"> = Data.TaggedError("UnknownEventError")
export class UnknownEventError extends UnknownEventErrorBase<{
  readonly type: string
  readonly version: number | undefined
  readonly reason: "unknown-type" | "unknown-version"
}> {
  readonly retryable = false
  override get message(): string {
    return this.reason === "unknown-type"
      ? `unknown event type ${JSON.stringify(this.type)}`
      : `event type ${JSON.stringify(this.type)} has no contract for version ${String(this.version)}`
  }
}

/** A programming error in configuration: bad schema name, duplicate contract, bad option. */
const ConfigErrorBase: TaggedErrorClass<"ConfigError"> = Data.TaggedError("ConfigError")
export class ConfigError extends ConfigErrorBase<{
  readonly reason: string
}> {
  readonly retryable = false
  override get message(): string {
    return this.reason
  }
}

/**
 * The database could not do what was asked. `connection` and `serialization`
 * reasons are transient; the others are not worth retrying. `data`: the
 * database cannot store the value (a NUL byte, an invalid escape), so the same
 * message will never go in. `aborted`: a statement inside the transaction
 * failed and the error was caught, so PostgreSQL would have answered COMMIT
 * with a silent ROLLBACK.
 */
const StoreErrorBase: TaggedErrorClass<"StoreError"> = Data.TaggedError("StoreError")
export class StoreError extends StoreErrorBase<{
  readonly reason: "connection" | "serialization" | "constraint" | "query" | "migration" | "data" | "aborted"
  readonly operation: string
  readonly cause?: unknown
}> {
  get retryable(): boolean {
    return this.reason === "connection" || this.reason === "serialization"
  }
  override get message(): string {
    return `${this.operation} failed (${this.reason}): ${describeCause(this.cause)}`
  }
}

/** The broker could not be reached or refused an operation that is not per-message. */
const TransportErrorBase: TaggedErrorClass<"TransportError"> = Data.TaggedError("TransportError")
export class TransportError extends TransportErrorBase<{
  readonly reason: "connection" | "channel" | "topology" | "closed"
  readonly operation: string
  readonly cause?: unknown
}> {
  get retryable(): boolean {
    return this.reason !== "topology"
  }
  override get message(): string {
    return `${this.operation} failed (${this.reason}): ${describeCause(this.cause)}`
  }
}

/** Messages of a cause without leaking connection strings that drivers sometimes echo. */
export const describeCause = (cause: unknown): string => {
  if (cause === undefined) return "no detail"
  const text = cause instanceof Error ? cause.message : String(cause)
  return redactUrls(text)
}

/** Removes credentials from any URL-looking text: `scheme://user:pass@host` → `scheme://***@host`. */
export const redactUrls = (text: string): string =>
  text.replace(/([a-z][a-z0-9+.-]*:\/\/)[^@\s/]+@/gi, "$1***@")
