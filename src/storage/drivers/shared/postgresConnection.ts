/**
 * What the PostgreSQL stores share whatever the driver: the settings and their
 * validation and the LISTEN retry schedules. Imports no driver.
 */
import { type Duration, Effect, type Redacted, Schedule } from "effect"
import { validateSchemaName } from "../../../core/identifier.ts"
import { ConfigError, redactUrls } from "../../../Errors.ts"
import { urlText } from "../../../layerConfig.ts"
import { makeRetryPolicy, schedule } from "../../../Retry.ts"

/** The settings of a PostgreSQL store, whichever driver it runs on. */
export interface PostgresConnectionConfig {
  /**
   * `postgres://user:pass@host:port/db`, as a string or a `Redacted` (what
   * `Config.Redacted("DATABASE_URL")` gives). Never logged; errors show it redacted.
   */
  readonly url: string | Redacted.Redacted<string>
  /** Schema holding txbox's tables. @default "txbox" */
  readonly schema?: string
  /** Pooled connections (LISTEN takes one more of its own). @default 10 */
  readonly poolSize?: number
  /** Open a LISTEN connection for low-latency wake-ups. Polling stays correct without it. @default true */
  readonly listen?: boolean
  /**
   * A direct connection (not through a transaction pooler such as PgBouncer in `pool_mode =
   * transaction`) for the one LISTEN connection of the process. Through a transaction pooler a
   * NOTIFY reaches whichever client holds the server connection that ran LISTEN, or nobody, so
   * wake-ups would be lost to the poll by chance. A string or a `Redacted`. @default `url`
   */
  readonly listenUrl?: string | Redacted.Redacted<string>
  /** Seconds to wait for a connection. @default 10 */
  readonly connectTimeoutSeconds?: number
  /**
   * The relay holds each claim in a transaction, from the claim to the mark that commits its rows
   * sent (one row write per message), instead of writing a lease on every row and writing it again
   * when marking (two). The relay's `lease` becomes the transaction's
   * `idle_in_transaction_session_timeout`: a relay that hangs longer is cut off and its rows
   * handed back; one that dies hands them back at once. Each relay worker holds a pooled
   * connection while it publishes. @default true on node-postgres, false on postgres.js
   */
  readonly holdClaims?: boolean
}

/** Validated settings, the URL in clear for the driver. */
export interface ValidConnection {
  readonly url: string
  /** Where the LISTEN connection goes: `listenUrl`, else `url`. */
  readonly listenUrl: string
  readonly schema: string
  readonly poolSize: number
  readonly timeout: number
  readonly listen: boolean
  /** Unset: the driver's default. */
  readonly holdClaims: boolean | undefined
}

/** Throws `ConfigError` on a bad setting (run it under `validateConfig`). */
export const validateConnection = (config: PostgresConnectionConfig): ValidConnection => {
  const schema = validateSchemaName(config.schema ?? "txbox")
  const poolSize = config.poolSize ?? 10
  if (!Number.isInteger(poolSize) || poolSize < 1) {
    throw new ConfigError({ reason: `poolSize must be a positive integer, got ${poolSize}` })
  }
  const text = validUrl("database URL", urlText(config.url))
  return {
    url: text,
    listenUrl: config.listenUrl === undefined ? text : validUrl("listenUrl", urlText(config.listenUrl)),
    schema,
    poolSize,
    timeout: config.connectTimeoutSeconds ?? 10,
    listen: config.listen !== false,
    holdClaims: config.holdClaims,
  }
}

export const validUrl = (what: string, text: string): string => {
  let url: URL
  try {
    url = new URL(text)
  } catch {
    throw new ConfigError({ reason: `${what} is not a valid URL: ${redactUrls(String(text))}` })
  }
  if (url.protocol !== "postgres:" && url.protocol !== "postgresql:") {
    throw new ConfigError({ reason: `${what} must start with postgres:// (got ${url.protocol}//)` })
  }
  return text
}

// Retry a lost LISTEN connection gently: it only costs latency.
export const relisten: Schedule.Schedule<Duration.Duration> = Schedule.exponential("200 millis").pipe(
  Schedule.jittered,
)
// ... and forever once it was up, capped at 5 s between attempts.
export const relistenForever: Schedule.Schedule<Duration.Duration> = schedule(
  makeRetryPolicy({ initialDelay: "200 millis", maxDelay: "5 seconds" }),
)

/** A store's `listen` with LISTEN off: no wake-ups, the loops poll. */
export const noListen = (
  _channel: string,
  _onNotify: () => void,
  onHearing?: (hears: boolean) => void,
): Effect.Effect<void> => Effect.sync(() => onHearing?.(false))
