/**
 * Every failure txbox reports is a tagged error with a `reason` and a `retryable`
 * verdict, so callers can `Effect.catchTag` precisely and the relay can decide
 * between "retry later" and "dead at once" without string matching.
 */
import { Data } from "effect"

// Each base class in a variable with its type spelled out: JSR's fast check infers no type from a call.
// Each is `@internal` for deno doc, which reads a variable's tags between `const` and its name only.
type TaggedErrorClass<Tag extends string> = ReturnType<typeof Data.TaggedError<Tag>>

const /** @internal */ ValidationErrorBase: TaggedErrorClass<"ValidationError"> =
    Data.TaggedError("ValidationError")
/** A payload did not match its contract's schema (on enqueue or on consume). */
export class ValidationError extends ValidationErrorBase<{
  readonly type: string
  readonly version: number
  readonly issues: ReadonlyArray<{ readonly message: string; readonly path?: string }>
  /** Set when the payload was sent as this older version and upcast to `version` on the way in. */
  readonly upcastFrom?: number
  /**
   * Set when the validator itself failed (an async validator whose promise
   * rejected: a schema registry that is down), not the payload: worth a retry.
   */
  readonly validatorFailed?: boolean
}> {
  /** True only when the validator failed, not the payload: an invalid payload stays invalid. */
  get retryable(): boolean {
    return this.validatorFailed === true
  }
  /** The contract (`type@vN`) and its first three issues. */
  override get message(): string {
    const first = this.issues
      .slice(0, 3)
      .map((i) => (i.path ? `${i.path}: ${i.message}` : i.message))
      .join("; ")
    const upcast = this.upcastFrom === undefined ? "" : ` (upcast from @v${this.upcastFrom})`
    return `invalid payload for ${this.type}@v${this.version}${upcast}: ${first}`
  }
}

const /** @internal */ UnknownEventErrorBase: TaggedErrorClass<"UnknownEventError"> =
    Data.TaggedError("UnknownEventError")
/**
 * A message arrived whose (type, version) no contract in the registry handles:
 * an unknown type, a version newer than any this consumer knows (upgrade the
 * consumer first), or an older or skipped one that no upcast chain reaches.
 * `version` is undefined when the message carried none (it is read as 1).
 */
export class UnknownEventError extends UnknownEventErrorBase<{
  readonly type: string
  readonly version: number | undefined
  readonly reason: "unknown-type" | "unknown-version" | "newer-version"
  /** The versions this registry handles directly, oldest first (when the type is known). */
  readonly handled?: ReadonlyArray<number>
}> {
  /** Never: the same message meets the same registry until the consumer is upgraded. */
  readonly retryable = false
  /** What was missing, and the upgrade or upcast chain that would handle it. */
  override get message(): string {
    if (this.reason === "unknown-type") return `unknown event type ${JSON.stringify(this.type)}`
    const handled = this.handled ?? []
    const newest = handled[handled.length - 1]
    if (this.reason === "newer-version") {
      return `${this.type}@${String(this.version)} is newer than this consumer handles (@${String(newest)}): upgrade the consumer first`
    }
    const sent =
      this.version === undefined
        ? `event type ${JSON.stringify(this.type)} came without a version (read as 1) and has no contract for version 1`
        : `event type ${JSON.stringify(this.type)} has no contract for version ${this.version}`
    if (handled.length === 0) return sent
    const list = handled.map((v) => `@${v}`).join(", ")
    const hint =
      newest !== undefined ? `; declare an upcast chain from @${this.version ?? 1} to @${newest}` : ""
    return `${sent} (this consumer handles ${list}${hint})`
  }
}

const /** @internal */ ConfigErrorBase: TaggedErrorClass<"ConfigError"> = Data.TaggedError("ConfigError")
/** A programming error in configuration: bad schema name, duplicate contract, bad option. */
export class ConfigError extends ConfigErrorBase<{
  readonly reason: string
}> {
  /** Never: a bad configuration stays bad until the code changes. */
  readonly retryable = false
  /** The `reason` itself. */
  override get message(): string {
    return this.reason
  }
}

const /** @internal */ StoreErrorBase: TaggedErrorClass<"StoreError"> = Data.TaggedError("StoreError")
/**
 * The database could not do what was asked. `connection` and `serialization`
 * reasons are transient; the others are not worth retrying. `data`: the
 * database cannot store the value (a NUL byte, an invalid escape), so the same
 * message will never go in. `aborted`: a statement inside the transaction
 * failed and the error was caught, so PostgreSQL would have answered COMMIT
 * with a silent ROLLBACK.
 */
export class StoreError extends StoreErrorBase<{
  readonly reason: "connection" | "serialization" | "constraint" | "query" | "migration" | "data" | "aborted"
  readonly operation: string
  readonly cause?: unknown
}> {
  /** True for the transient reasons, `connection` and `serialization`. */
  get retryable(): boolean {
    return this.reason === "connection" || this.reason === "serialization"
  }
  /** The operation, the reason and the cause, with credentials in URLs redacted. */
  override get message(): string {
    return `${this.operation} failed (${this.reason}): ${describeCause(this.cause)}`
  }
}

const /** @internal */ TransportErrorBase: TaggedErrorClass<"TransportError"> =
    Data.TaggedError("TransportError")
/** The broker could not be reached or refused an operation that is not per-message. */
export class TransportError extends TransportErrorBase<{
  readonly reason: "connection" | "channel" | "topology" | "closed"
  readonly operation: string
  readonly cause?: unknown
}> {
  /** True except for `topology`: a declaration the broker refuses is refused again. */
  get retryable(): boolean {
    return this.reason !== "topology"
  }
  /** The operation, the reason and the cause, with credentials in URLs redacted. */
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
