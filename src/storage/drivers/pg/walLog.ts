/**
 * The `OutboxLog` port over PostgreSQL logical replication, on node-postgres (issue #27): a durable
 * slot with the `pgoutput` plugin and a publication of the outbox's inserts, read by one process
 * at a time. `WalLog.layer` sets them up when missing (`create`), checks what the server needs
 * (`wal_level = logical`, a role with REPLICATION) and says what is missing as a `ConfigError`.
 *
 * - One reader per slot: PostgreSQL lets one connection stream a slot; another process's start is
 *   refused ("active for PID") and it stands by, trying again every `standbyRetry`, so it takes
 *   over within that once the reader's connection is gone.
 * - A lost connection is opened again; the server sends again from the slot's confirmed position.
 * - A slot that is gone (dropped, or lost with a failover) is created anew, from now: what was
 *   committed meanwhile and not published is found by the relay's sweep, never skipped.
 * - Idle, the slot is told the server's WAL end (`logReader.ts`), and a heartbeat
 *   (`pg_logical_emit_message`, no table write) moves that end on, so the slot holds no WAL.
 *
 * The stream is read through a node-postgres client in replication mode: a query object of its
 * own (node-postgres's `Submittable`) receives the CopyData frames, and status updates go back
 * as CopyData.
 */
import { Cause, type Duration, Effect, Layer, type Redacted, type Scope } from "effect"
import type pg from "pg"
import * as config from "../../../core/config.ts"
import { validateSchemaName } from "../../../core/identifier.ts"
import { defaultExport, loadDriver } from "../../../drivers.ts"
import { ConfigError, redactUrls } from "../../../Errors.ts"
import { urlText } from "../../../layerConfig.ts"
import {
  OutboxLog,
  type OutboxLogBatch,
  type OutboxLogShape,
  type OutboxLogStatus,
} from "../../../ports/OutboxLog.ts"
import { LogReader } from "../../wal/logReader.ts"
import { statusUpdate } from "../../wal/pgoutput.ts"
import { defaultSlot, setUpWal, WAL_NAME } from "../../wal/slots.ts"
import { validUrl } from "../shared/postgresConnection.ts"

/** The settings of `WalLog.layer`. */
export interface WalLogConfig {
  /**
   * A direct connection to the primary (not through a transaction pooler: replication is a
   * session of its own), as a role with REPLICATION (or a superuser). A string or a `Redacted`.
   */
  readonly url: string | Redacted.Redacted<string>
  /** Schema holding txbox's tables: the store's. @default "txbox" */
  readonly schema?: string
  /** The replication slot. @default "txbox_outbox" (for another schema, `txbox_<schema>_outbox`) */
  readonly slot?: string
  /** The publication of the outbox's inserts. @default the slot's name */
  readonly publication?: string
  /** Create the publication and the slot when missing. Off: a missing one is a `ConfigError`. @default true */
  readonly create?: boolean
  /** How often the reader writes a heartbeat into the WAL and measures what the slot retains. @default "10 seconds" */
  readonly heartbeat?: Duration.Input
  /** Retained WAL over this many bytes is logged as a warning and flagged in the status. @default 1 GiB */
  readonly retainedWarningBytes?: number
  /** How often a standby (another process reads the slot) tries to take it over. @default "2 seconds" */
  readonly standbyRetry?: Duration.Input
  /** Seconds to wait for a connection. @default 10 */
  readonly connectTimeoutSeconds?: number
}

interface Resolved {
  readonly url: string
  readonly schema: string
  readonly slot: string
  readonly publication: string
  readonly create: boolean
  readonly heartbeatMs: number
  readonly retainedWarningBytes: number
  readonly standbyRetryMs: number
  readonly timeoutSeconds: number
}

const resolve = (c: WalLogConfig): Effect.Effect<Resolved, ConfigError> =>
  config.validateConfig(() => {
    const schema = validateSchemaName(c.schema ?? "txbox")
    const slot = c.slot ?? defaultSlot(schema)
    config.check(
      typeof slot === "string" && WAL_NAME.test(slot),
      "wal slot",
      "must be 1..63 of a-z, 0-9, _",
      slot,
    )
    const publication = c.publication ?? slot
    config.check(
      typeof publication === "string" && WAL_NAME.test(publication),
      "wal publication",
      "must be 1..63 of a-z, 0-9, _",
      publication,
    )
    return {
      url: validUrl("wal url", urlText(c.url)),
      schema,
      slot,
      publication,
      create: config.flag("wal create", c.create, true),
      heartbeatMs: config.millis("wal heartbeat", c.heartbeat, "10 seconds", { minMs: 100 }),
      retainedWarningBytes: config.atLeast("wal retainedWarningBytes", c.retainedWarningBytes, 2 ** 30, 0),
      standbyRetryMs: config.millis("wal standbyRetry", c.standbyRetry, "2 seconds", { minMs: 10 }),
      timeoutSeconds: config.atLeast("wal connectTimeoutSeconds", c.connectTimeoutSeconds, 10, 1),
    }
  })

/** SQLSTATEs the reader acts on. */
const SLOT_IN_USE = "55006"
const SLOT_MISSING = "42704"

const codeOf = (error: unknown): string | undefined => {
  const code = (error as { code?: unknown } | undefined)?.code
  return typeof code === "string" ? code : undefined
}
const messageOf = (error: unknown): string =>
  redactUrls(error instanceof Error ? error.message : String(error))

/**
 * A status update this often while reading (or every heartbeat, when sooner), whatever the server
 * asks: it is how the slot moves on while idle. The heartbeat is a logical decoding message, which
 * the stream carries (`messages 'true'`, PostgreSQL 14 and later) with the server's WAL end.
 */
const STATUS_EVERY_MS = 5_000

/**
 * `START_REPLICATION` as node-postgres's `Submittable`: the client hands it every message of its
 * answer. CopyData frames go to `onData`; an error, or the end of the stream, ends it.
 */
class ReplicationQuery {
  private readonly text: string
  private readonly onData: (chunk: Uint8Array) => void
  private readonly onEnd: (error?: unknown) => void
  constructor(text: string, onData: (chunk: Uint8Array) => void, onEnd: (error?: unknown) => void) {
    this.text = text
    this.onData = onData
    this.onEnd = onEnd
  }
  submit(connection: { query: (text: string) => void }): void {
    connection.query(this.text)
  }
  handleCopyData(message: { chunk: Uint8Array }): void {
    this.onData(message.chunk)
  }
  handleError(error: unknown): void {
    this.onEnd(error)
  }
  handleReadyForQuery(): void {
    this.onEnd(new Error("the server ended the replication stream"))
  }
  handleCommandComplete(): void {}
  handleRowDescription(): void {}
  handleDataRow(): void {}
  handleEmptyQuery(): void {}
  handlePortalSuspended(): void {}
  handleCopyInResponse(): void {}
}

interface Shared {
  reading: boolean
  retainedBytes: number | undefined
  retainedOverWarning: boolean
  lastError: string | undefined
  /** Sends a status update, while a stream is up. */
  write: ((bytes: Uint8Array) => void) | undefined
  /** The batch waiting for rows, if any. */
  waiter: (() => void) | undefined
}

/**
 * One replication connection, from its start to its end: the error it ended with (undefined when
 * closed by us), and whether it streamed. The frames go to `reader`.
 */
const openSession = (
  driver: typeof pg,
  c: Resolved,
  reader: LogReader,
  shared: Shared,
  sendStatus: () => void,
) =>
  Effect.callback<{ readonly error: unknown; readonly streamed: boolean }>((resume) => {
    const client = new driver.Client({
      connectionString: c.url,
      replication: "database",
      application_name: "txbox/wal",
      connectionTimeoutMillis: c.timeoutSeconds * 1000,
      // Timestamps as the row decoder reads them (storage/wal/outboxRows.ts).
      options: "-c DateStyle=ISO -c TimeZone=UTC",
    } as pg.ClientConfig)
    let ended = false
    let streamed = false
    let timer: ReturnType<typeof setInterval> | undefined
    const end = (error?: unknown) => {
      if (ended) return
      ended = true
      streamed ||= shared.reading
      shared.reading = false
      shared.write = undefined
      if (timer !== undefined) clearInterval(timer)
      client.end().catch(() => undefined)
      resume(Effect.succeed({ error, streamed }))
    }
    client.on("error", end)
    client.on("end", () => end(new Error("replication connection closed")))
    const onData = (chunk: Uint8Array) => {
      if (!shared.reading) {
        shared.reading = true
        shared.lastError = undefined
      }
      try {
        const what = reader.feed(chunk)
        if (what === "reply") {
          // PostgreSQL waits on this reply when it shuts down: see `LogReader.confirmAll`.
          reader.confirmAll()
          sendStatus()
        } else if (what === "rows") shared.waiter?.()
      } catch (error) {
        end(error)
      }
    }
    client.connect().then(() => {
      if (ended) return
      reader.restart()
      const connection = (
        client as unknown as {
          connection: {
            sendCopyFromChunk: (b: Uint8Array) => void
            once: (e: string, f: () => void) => void
          }
        }
      ).connection
      connection.once("replicationStart", () => {
        shared.reading = true
        shared.lastError = undefined
        sendStatus()
      })
      shared.write = (bytes) => connection.sendCopyFromChunk(Buffer.from(bytes))
      client.query(
        new ReplicationQuery(
          `START_REPLICATION SLOT "${c.slot}" LOGICAL 0/0 (proto_version '1', publication_names '"${c.publication}"', messages 'true')`,
          onData,
          end,
        ) as unknown as pg.QueryConfig,
      )
      timer = setInterval(sendStatus, Math.min(STATUS_EVERY_MS, c.heartbeatMs))
    }, end)
    return Effect.sync(() => end())
  })

/**
 * The heartbeat (while reading) and the slot's retained WAL (always: a standby reports it too),
 * logged once each time it goes over the warning threshold, and once when back under it.
 */
const measureSlot = (admin: pg.Pool, c: Resolved, shared: Shared) =>
  Effect.tryPromise({
    try: async () => {
      if (shared.reading) await admin.query("SELECT pg_logical_emit_message(false, 'txbox.heartbeat', '')")
      const row = (
        await admin.query<{ retained: number | null }>(
          "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::float8 AS retained FROM pg_replication_slots WHERE slot_name = $1",
          [c.slot],
        )
      ).rows[0]
      shared.retainedBytes = row?.retained == null ? undefined : Number(row.retained)
    },
    catch: (error) => error,
  }).pipe(
    Effect.flatMap(() => {
      const over = (shared.retainedBytes ?? 0) > c.retainedWarningBytes
      if (over === shared.retainedOverWarning) return Effect.void
      shared.retainedOverWarning = over
      return over
        ? Effect.logWarning(
            `wal: slot ${c.slot} retains ${shared.retainedBytes} bytes of WAL (warning at ${c.retainedWarningBytes}): is its relay running?`,
          )
        : Effect.logInfo(`wal: slot ${c.slot} retains ${shared.retainedBytes} bytes of WAL again`)
    }),
    Effect.ignore,
  )

/** Opens the log in the current scope: set up, then read in the background until the scope closes. */
export const make = (walConfig: WalLogConfig): Effect.Effect<OutboxLogShape, ConfigError, Scope.Scope> =>
  Effect.gen(function* () {
    const c = yield* resolve(walConfig)
    const driver = defaultExport<typeof pg>(
      yield* loadDriver({ name: "pg", entry: "txbox/pg WalLog", load: () => import("pg") }),
    )
    const admin = new driver.Pool({
      connectionString: c.url,
      max: 1,
      connectionTimeoutMillis: c.timeoutSeconds * 1000,
      application_name: "txbox/wal-admin",
    })
    admin.on("error", () => {})
    yield* Effect.addFinalizer(() => Effect.promise(() => admin.end().catch(() => undefined)))

    // What the server lacks fails the layer now; a server that cannot be reached is tried again by the reader.
    const run = <R>(text: string, params?: ReadonlyArray<unknown>) =>
      admin.query(text, params as unknown[] | undefined).then((r) => r.rows as ReadonlyArray<R>)
    const setUpOnce = Effect.tryPromise({ try: () => setUpWal(run, c, c.create), catch: (error) => error })
    let ready = yield* setUpOnce.pipe(
      Effect.as(true),
      Effect.catch((error) =>
        error instanceof ConfigError
          ? Effect.fail(error)
          : Effect.as(
              Effect.logWarning(`wal: setting up slot ${c.slot} failed, retrying: ${messageOf(error)}`),
              false,
            ),
      ),
    )

    const reader = new LogReader(`${c.schema}.outbox`)
    const shared: Shared = {
      reading: false,
      retainedBytes: undefined,
      retainedOverWarning: false,
      lastError: undefined,
      write: undefined,
      waiter: undefined,
    }
    const sendStatus = () => shared.write?.(statusUpdate(reader.flushPosition, Date.now()))

    const session = openSession(driver, c, reader, shared, sendStatus)

    const readLoop = Effect.gen(function* () {
      let failures = 0
      let standingBy = false
      while (true) {
        if (!ready) {
          const setup = yield* Effect.exit(setUpOnce)
          if (setup._tag === "Failure") {
            shared.lastError = `setting up slot ${c.slot}: ${messageOf(setup.cause)}`
            yield* Effect.sleep(backoff(failures++))
            continue
          }
          ready = true
        }
        const { error, streamed } = yield* session
        if (streamed) failures = 0
        const code = codeOf(error)
        if (code === SLOT_IN_USE) {
          if (!standingBy)
            yield* Effect.logInfo(`wal: slot ${c.slot} is read by another process; standing by`)
          standingBy = true
          shared.lastError = undefined
          yield* Effect.sleep(c.standbyRetryMs)
          continue
        }
        if (standingBy) yield* Effect.logInfo(`wal: reading slot ${c.slot}`)
        standingBy = false
        if (code === SLOT_MISSING) {
          yield* Effect.logWarning(
            `wal: slot ${c.slot} is gone; creating it anew from now (rows left pending are published by the relay's sweep)`,
          )
          ready = false
          continue
        }
        shared.lastError = messageOf(error)
        yield* Effect.logWarning(`wal: replication connection ended: ${shared.lastError}`)
        yield* Effect.sleep(backoff(failures))
        failures = Math.min(failures + 1, 8)
      }
    })
    yield* Effect.forkScoped(restartingAfterDefects(readLoop))

    const measure = measureSlot(admin, c, shared)
    yield* Effect.forkScoped(Effect.forever(Effect.andThen(measure, Effect.sleep(c.heartbeatMs))))

    const take = (maxRows: number) =>
      Effect.callback<OutboxLogBatch>((resume) => {
        const now = reader.take(maxRows)
        if (now !== undefined) {
          resume(Effect.succeed(now))
          return
        }
        const wake = () => {
          const batch = reader.take(maxRows)
          if (batch === undefined) return
          shared.waiter = undefined
          resume(Effect.succeed(batch))
        }
        shared.waiter = wake
        return Effect.sync(() => {
          if (shared.waiter === wake) shared.waiter = undefined
        })
      })

    const confirm = (position: bigint) =>
      Effect.sync(() => {
        reader.confirm(position)
        sendStatus()
      })

    const status = Effect.sync(
      (): OutboxLogStatus => ({
        slot: c.slot,
        reading: shared.reading,
        retainedBytes: shared.retainedBytes,
        retainedOverWarning: shared.retainedOverWarning,
        lastError: shared.lastError,
      }),
    )
    return { take, confirm, status } satisfies OutboxLogShape
  })

/**
 * A defect in the loop (a bug of ours or the driver's) must not end the reading for good: logged,
 * and the loop starts again a second later.
 */
const restartingAfterDefects = (loop: Effect.Effect<never>): Effect.Effect<never> =>
  Effect.forever(
    Effect.catchCause(loop, (cause) =>
      Cause.hasInterruptsOnly(cause)
        ? Effect.failCause(cause)
        : Effect.andThen(
            Effect.logError("wal: the reader died (a bug); starting it again", cause),
            Effect.sleep(1000),
          ),
    ),
  )

/** 200 ms doubling to 10 s. */
const backoff = (failures: number): number => Math.min(10_000, 200 * 2 ** failures)

/** The log as a layer: `OutboxLog`, read while the layer lives. */
export const layer = (walConfig: WalLogConfig): Layer.Layer<OutboxLog, ConfigError> =>
  Layer.effect(OutboxLog, make(walConfig))
