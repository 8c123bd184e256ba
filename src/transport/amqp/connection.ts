/**
 * One AMQP connection per layer, kept alive in the background: a supervisor
 * fiber connects, waits for the connection to drop, and reconnects with the
 * configured backoff. Everything is acquired in scopes, so closing the layer
 * closes channels, then the connection, then stops the supervisor.
 *
 * With a cluster's URLs, each attempt takes the next URL, round robin from a
 * random start (config.ts says why): a lost node sends the connection, and
 * with it publishing and every subscription (resubscribe.ts waits for the
 * connection), to the next node.
 */
import type { Channel, ChannelModel, ConfirmChannel } from "amqplib"
import { Deferred, Duration, Effect, Exit, Latch, Scope } from "effect"
import { defaultExport, loadDriver } from "../../drivers.ts"
import { type ConfigError, describeCause, redactUrls, TransportError } from "../../Errors.ts"
import type { ResolvedConfig } from "./config.ts"
import type { ConfirmPublisher } from "./confirms.ts"

/** A connection that is up, with the scope its channels live in. */
export interface Live {
  readonly model: ChannelModel
  /** `host:port` of the node it is connected to (no credentials), for logs. */
  readonly endpoint: string
  /** Closed when the connection is lost or the layer closes; channels are acquired in children of it. */
  readonly scope: Scope.Scope
  /** The publishing confirm channel, opened on first use and reopened after a channel error. */
  publisher: ConfirmPublisher | undefined
}

export interface Connection {
  /** The live connection, if any, right now. */
  readonly current: () => Live | undefined
  /** Waits until a connection is up (returns at once if one is). */
  readonly awaitConnected: Effect.Effect<void>
  /** The error to report when there is no connection. */
  readonly notConnected: (operation: string) => TransportError
  /** When (`Date.now()`) the broker last closed the connection because its node was stopping; undefined: never. */
  readonly brokerStoppedAt: () => number | undefined
}

/**
 * Whether a connection's close says its broker node is stopping (`rabbitmqctl stop_app`, a node
 * shutting down): RabbitMQ closes every connection with this text once its queues have stopped.
 */
export const closedForShutdown = (cause: unknown): boolean =>
  /CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'/.test(
    cause instanceof Error ? cause.message : String(cause),
  )

/** Closing a channel or connection never hangs the caller for longer than this. */
const CLOSE_TIMEOUT = Duration.seconds(5)

/** A copy of an error with any URL credentials removed from its message and stack. */
export const redactError = (error: unknown): unknown => {
  if (!(error instanceof Error)) return typeof error === "string" ? redactUrls(error) : error
  const copy = new Error(redactUrls(error.message))
  copy.name = error.name
  if (error.stack !== undefined) copy.stack = redactUrls(error.stack)
  const code = (error as { code?: unknown }).code
  if (code !== undefined) (copy as { code?: unknown }).code = code
  return copy
}

export const transportError = (
  reason: TransportError["reason"],
  operation: string,
  cause: unknown,
): TransportError => new TransportError({ reason, operation, cause: redactError(cause) })

/** Classifies a failed channel operation: the broker refusing a declaration is `topology`. */
export const channelError = (operation: string, cause: unknown): TransportError => {
  const code = (cause as { code?: unknown } | undefined)?.code
  // 403 access refused, 404 not found, 405 resource locked, 406 precondition failed (inequivalent arguments).
  if (code === 403 || code === 404 || code === 405 || code === 406)
    return transportError("topology", operation, cause)
  const text = cause instanceof Error ? cause.message : String(cause)
  if (/Connection (closed|closing)/i.test(text)) return transportError("connection", operation, cause)
  return transportError("channel", operation, cause)
}

/** The broker refused a declaration because the entity exists with other arguments (406). */
export const isPreconditionFailed = (error: unknown): boolean =>
  error instanceof TransportError && (error.cause as { code?: unknown } | undefined)?.code === 406

/** Runs one broker RPC (a promise), bounded by `timeoutMs`, mapping failures to `TransportError`. */
export const rpc = <A>(
  operation: string,
  timeoutMs: number,
  run: () => Promise<A>,
): Effect.Effect<A, TransportError> =>
  Effect.tryPromise({ try: run, catch: (cause) => channelError(operation, cause) }).pipe(
    Effect.timeoutOrElse({
      duration: Duration.millis(timeoutMs),
      orElse: () => Effect.fail(transportError("channel", operation, `no reply within ${timeoutMs} ms`)),
    }),
  )

/** Closes a channel, ignoring that it may already be closed; never hangs. */
export const closeChannel = (channel: Channel): Effect.Effect<void> =>
  Effect.tryPromise(() => channel.close()).pipe(Effect.timeout(CLOSE_TIMEOUT), Effect.ignore)

interface ChannelOptions {
  /** amqplib's write buffer, in frames, before `publish` returns false (default 1024). */
  readonly highWaterMark: number
  readonly timeoutMs: number
  readonly operation: string
}

/**
 * Opens a channel in `scope` (closed with it). `watch` runs in the promise's
 * own continuation, before any other I/O callback can run: a `close` event
 * emitted between the channel opening and a fiber resuming would otherwise be
 * missed, and the channel silently dead forever.
 */
const acquireChannel = <C extends Channel, A>(
  scope: Scope.Scope,
  options: ChannelOptions,
  create: () => Promise<C>,
  watch: (channel: C) => A,
): Effect.Effect<A, TransportError> =>
  Effect.acquireRelease(
    Effect.callback<{ readonly channel: C; readonly value: A }, TransportError>((resume) => {
      let abandoned = false
      create().then(
        (channel) => {
          // An EventEmitter without an `error` listener throws; failures surface through `close`.
          channel.on("error", () => {})
          // Timed out or interrupted while opening: nobody else will close it.
          if (abandoned) channel.close().catch(() => {})
          else resume(Effect.succeed({ channel, value: watch(channel) }))
        },
        (cause: unknown) => resume(Effect.fail(channelError(options.operation, cause))),
      )
      return Effect.sync(() => {
        abandoned = true
      })
    }).pipe(
      Effect.timeoutOrElse({
        duration: Duration.millis(options.timeoutMs),
        orElse: () =>
          Effect.fail(
            transportError("channel", options.operation, `no channel within ${options.timeoutMs} ms`),
          ),
      }),
    ),
    ({ channel }) => closeChannel(channel),
    // So the timeout can interrupt a stuck open.
    { interruptible: true },
  ).pipe(
    Effect.map(({ value }) => value),
    Scope.provide(scope),
  )

/** A confirm channel on `live`, closed with `scope`; `watch` attaches listeners at once. */
export const openConfirmChannel = <A>(
  live: Live,
  scope: Scope.Scope,
  options: ChannelOptions,
  watch: (channel: ConfirmChannel) => A,
): Effect.Effect<A, TransportError> =>
  acquireChannel(
    scope,
    options,
    () => live.model.createConfirmChannel({ highWaterMark: options.highWaterMark }),
    watch,
  )

/** A plain channel on `live`, closed with `scope`. */
export const openPlainChannel = (
  live: Live,
  scope: Scope.Scope,
  options: ChannelOptions,
): Effect.Effect<Channel, TransportError> =>
  acquireChannel(
    scope,
    options,
    () => live.model.createChannel({ highWaterMark: options.highWaterMark }),
    (channel) => channel,
  )

interface SocketHolder {
  readonly connection?: { readonly stream?: { destroy?: () => void } }
}

const closeModel = (model: ChannelModel): Effect.Effect<void> =>
  Effect.tryPromise(() => model.close()).pipe(
    Effect.timeout(CLOSE_TIMEOUT),
    // The broker did not answer the close: drop the socket instead.
    Effect.catch(() => Effect.sync(() => (model as unknown as SocketHolder).connection?.stream?.destroy?.())),
    Effect.ignore,
  )

/** The URL amqplib connects to: a configured one with our heartbeat unless it sets its own. */
const connectUrl = (config: ResolvedConfig, configured: string): string => {
  const url = new URL(configured)
  if (!url.searchParams.has("heartbeat")) url.searchParams.set("heartbeat", String(config.heartbeatSeconds))
  return url.toString()
}

/** `host:port` of a broker URL: what logs and errors name, never its credentials. */
export const endpointOf = (configured: string): string => {
  const url = new URL(configured)
  return `${url.hostname}:${url.port || (url.protocol === "amqps:" ? "5671" : "5672")}`
}

interface Opened {
  readonly model: ChannelModel
  /** Completed with the reason when the connection closes. */
  readonly lost: Deferred.Deferred<unknown>
  readonly endpoint: string
}

type Amqplib = typeof import("amqplib")

/**
 * amqplib, loaded when the first transport is built rather than when
 * `txbox/amqp` is imported: a missing amqplib is then a `ConfigError` naming
 * the package, like a missing database driver.
 */
const loadAmqplib: Effect.Effect<Amqplib, ConfigError> = loadDriver({
  name: "amqplib",
  entry: "txbox/amqp",
  load: () => import("amqplib"),
}).pipe(Effect.map((module) => defaultExport<Amqplib>(module as Amqplib & { default?: Amqplib })))

interface Muxed {
  readonly connection?: {
    readonly muxer?: {
      _readIncoming?: () => void
      readonly out?: { cork?: () => void; uncork?: () => void }
    }
  }
}

/**
 * One socket write per round of amqplib's frame multiplexer instead of one per
 * frame: it writes every frame its channels buffered (a relay's batch of
 * publishes, an inbox's acks) in one loop, and each `write` was a system call
 * of its own (bench/README.md, finding 9). Corked for that loop, they leave as
 * one. Reaches into amqplib's internals, so it does nothing where they differ.
 */
const coalesceWrites = (model: ChannelModel): void => {
  const muxer = (model as unknown as Muxed).connection?.muxer
  const out = muxer?.out
  const round = muxer?._readIncoming
  if (muxer === undefined || round === undefined || out?.cork === undefined || out.uncork === undefined)
    return
  muxer._readIncoming = function (this: unknown) {
    out.cork!()
    try {
      round.call(this)
    } finally {
      out.uncork!()
    }
  }
}

const CONNECT = "AmqpTransport.connect"

/**
 * Whether amqplib closed the connection before its promise gave it to us. A broker that stops
 * right after letting a client in sends Connection.Close behind Connection.OpenOk; read together,
 * amqplib handles both in one go and emits `close` before our listeners exist (its `connect`
 * resolves in a later microtask). Such a connection taken for live stays "connected" forever: every
 * channel on it fails (the soak saw a consumer that never resubscribed). Reaches into amqplib's
 * connection (`expectSocketClose`, set once it is closed or its socket failed), so it answers false
 * where that differs.
 */
const closedAlready = (model: ChannelModel): boolean =>
  (model as unknown as { readonly connection?: { readonly expectSocketClose?: unknown } }).connection
    ?.expectSocketClose === true

/** Connects to `url`; `onClose` runs synchronously on the connection's `close` event. */
const openModel = (
  amqp: Amqplib,
  config: ResolvedConfig,
  url: string,
  onClose: () => void,
): Effect.Effect<Opened, TransportError> =>
  Effect.callback<Opened, TransportError>((resume) => {
    let abandoned = false
    amqp
      .connect(connectUrl(config, url), {
        timeout: config.connectTimeoutMs,
        clientProperties: { connection_name: `txbox ${config.source}` },
      })
      .then(
        (model) => {
          // Listeners first (see acquireChannel): a missed `close` would leave us "connected" forever.
          const lost = Deferred.makeUnsafe<unknown>()
          let error: unknown
          model.on("error", (cause: unknown) => {
            error = cause
          })
          model.on("blocked", (reason: unknown) => {
            error = `connection blocked by the broker: ${String(reason)}`
          })
          model.on("close", (cause?: unknown) => {
            onClose()
            Deferred.doneUnsafe(lost, Effect.succeed(cause ?? error ?? "connection closed"))
          })
          coalesceWrites(model)
          // Interrupted while connecting: nobody will close this one but us.
          if (abandoned) model.close().catch(() => {})
          else if (closedAlready(model))
            resume(
              Effect.fail(
                transportError("connection", CONNECT, error ?? "closed by the broker as it opened"),
              ),
            )
          else resume(Effect.succeed({ model, lost, endpoint: endpointOf(url) }))
        },
        (cause: unknown) => resume(Effect.fail(transportError("connection", CONNECT, cause))),
      )
    return Effect.sync(() => {
      abandoned = true
    })
  })

/** Which URL the next attempt takes: an index into `config.urls`, advanced by every attempt. */
interface Cursor {
  next: number
}

/**
 * One round of attempts: the next URL, and when that fails the one after it,
 * until one connects or each has been tried once. Back to back: a dead node
 * in the list costs one failed connect, not a backoff. With several URLs a
 * failed round names each one's error (host and port only).
 */
const openRound = (
  amqp: Amqplib,
  config: ResolvedConfig,
  cursor: Cursor,
  onClose: () => void,
): Effect.Effect<Opened, TransportError> =>
  Effect.suspend(() => {
    const { urls } = config
    const failures: string[] = []
    const attempt = (left: number): Effect.Effect<Opened, TransportError> =>
      Effect.suspend(() => {
        const url = urls[cursor.next % urls.length]!
        cursor.next = (cursor.next + 1) % urls.length
        return openModel(amqp, config, url, onClose).pipe(
          Effect.catch((error) => {
            if (urls.length === 1) return Effect.fail(error)
            failures.push(`${endpointOf(url)}: ${describeCause(error.cause)}`)
            if (left > 1) {
              return Effect.logDebug(
                `txbox amqp: cannot connect to ${failures.at(-1)}; trying the next URL`,
              ).pipe(Effect.andThen(attempt(left - 1)))
            }
            return Effect.fail(
              transportError("connection", CONNECT, `no broker URL answered: ${failures.join("; ")}`),
            )
          }),
        )
      })
    return attempt(urls.length)
  })

/**
 * Starts the connection supervisor in the current scope and waits for its
 * first round of attempts (each URL once), so a transport built against a
 * healthy broker, or a cluster with a node down, is connected when the layer
 * is ready. If that round fails, the layer still starts (unless `failFast`)
 * and keeps reconnecting in the background.
 */
export const makeConnection: (
  config: ResolvedConfig,
) => Effect.Effect<Connection, TransportError | ConfigError, Scope.Scope> = Effect.fnUntraced(function* (
  config: ResolvedConfig,
) {
  const amqp = yield* loadAmqplib
  // A random start spreads the processes that share one list of URLs over the cluster.
  const cursor: Cursor = { next: Math.floor(Math.random() * config.urls.length) }
  let live: Live | undefined
  let lastError: unknown
  let brokerStoppedAt: number | undefined
  const connected = yield* Latch.make(false)
  const firstAttempt = Deferred.makeUnsafe<void, TransportError>()
  // From the `close` event on, publish fails fast and subscriptions wait.
  const markDown = (): void => {
    live = undefined
    connected.closeUnsafe()
  }

  const lifetime = Effect.gen(function* () {
    const { model, lost, endpoint } = yield* Effect.acquireRelease(
      openRound(amqp, config, cursor, markDown),
      ({ model }) => closeModel(model),
      // A round can try several URLs: closing the layer must not wait for it (an
      // abandoned connect closes what it opens, see openModel).
      { interruptible: true },
    )
    yield* Effect.addFinalizer(() => Effect.sync(markDown))
    // The connection may have dropped while this fiber was waiting to resume.
    if (!Deferred.isDoneUnsafe(lost)) {
      live = { model, endpoint, scope: yield* Effect.scope, publisher: undefined }
      lastError = undefined
      connected.openUnsafe()
      Deferred.doneUnsafe(firstAttempt, Effect.void)
      yield* Effect.logDebug(`txbox amqp: connected to ${endpoint}`)
    }
    const cause = yield* Deferred.await(lost)
    lastError = cause
    if (closedForShutdown(cause)) brokerStoppedAt = Date.now()
    yield* Effect.logWarning(
      `txbox amqp: connection to ${endpoint} lost (${describeCause(cause)}); reconnecting`,
    )
  }).pipe(
    Effect.scoped,
    Effect.tapError((error) =>
      Effect.suspend(() => {
        lastError = error.cause
        const first = Deferred.doneUnsafe(firstAttempt, Effect.fail(error))
        return first ? Effect.void : Effect.logWarning(`txbox amqp: reconnect failed: ${error.message}`)
      }),
    ),
  )

  // Each loss starts a fresh backoff, between rounds (a round tries each URL
  // once); the pause after a loss keeps a connection that drops right after
  // opening from turning into a reconnect storm.
  const supervisor = lifetime.pipe(
    Effect.retry(config.reconnect),
    Effect.andThen(Effect.sleep(Duration.millis(config.reconnectInitialMs))),
    Effect.forever,
  )
  yield* Effect.forkScoped(supervisor)

  const first = yield* Effect.exit(Deferred.await(firstAttempt))
  if (Exit.isFailure(first)) {
    if (config.failFast) return yield* Effect.failCause(first.cause)
    yield* Effect.logWarning(
      `txbox amqp: broker unreachable at start (${describeCause(lastError)}); reconnecting`,
    )
  }

  const connection: Connection = {
    current: () => live,
    awaitConnected: connected.await,
    notConnected: (operation) =>
      transportError("connection", operation, lastError === undefined ? "not connected" : lastError),
    brokerStoppedAt: () => brokerStoppedAt,
  }
  return connection
})
