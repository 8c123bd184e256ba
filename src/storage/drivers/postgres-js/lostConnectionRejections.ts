/**
 * postgres.js 3.4.9 fetches array types on every new connection from inside
 * its socket handler and returns that promise to nobody: when the connection
 * closes during the fetch (a connect that lands as the server shuts down),
 * the rejection is unhandled, which ends a Node process (seen in the Node
 * postgres.js soak after a relay restart during a PostgreSQL restart). It
 * cannot be caught where it happens, and turning the fetch off
 * (`fetch_types: false`) makes `reserve()` on a fresh connection never
 * resolve. So, while a txbox postgres.js store is open, an
 * `unhandledRejection` listener drops exactly these: a postgres.js
 * connection-loss error thrown from its own `connection.js`. Anything else is
 * left as it was: with no other listener it is rethrown, which ends the
 * process as Node's default does; with the app's own listeners, theirs decide.
 *
 * When the server resets the connection instead of closing it (a restart under load), postgres.js
 * rejects the same orphaned promise with the socket's own error (`read ECONNRESET`), which carries
 * no postgres.js frame (seen in the Node postgres.js soak). Such an error raised by a socket
 * itself, with no JavaScript caller in its stack, is dropped too, with a warning: an app's own
 * unawaited socket error would otherwise have ended the process.
 */

const CONNECTION_LOSS = new Set(["CONNECTION_CLOSED", "CONNECTION_DESTROYED", "CONNECTION_ENDED"])

/** A connection-loss error raised inside postgres.js itself (not by txbox or the app). */
export const isPostgresJsConnectionLoss = (reason: unknown): boolean =>
  reason instanceof Error &&
  CONNECTION_LOSS.has(String((reason as { code?: unknown }).code)) &&
  /[\\/]postgres[\\/](src|cjs[\\/]src|cf[\\/]src)[\\/]connection\.js/.test(reason.stack ?? "")

const SOCKET_LOSS = new Set(["ECONNRESET", "EPIPE", "ETIMEDOUT"])

/** A socket's own failure as Node reports it (`read ECONNRESET`): no frame but Node's internals. */
export const isSocketLoss = (reason: unknown): boolean => {
  if (!(reason instanceof Error)) return false
  const { code, syscall } = reason as { code?: unknown; syscall?: unknown }
  if (!SOCKET_LOSS.has(String(code)) || typeof syscall !== "string") return false
  const frames = (reason.stack ?? "").split("\n").filter((line) => line.trimStart().startsWith("at "))
  return (
    frames.length > 0 && frames.every((line) => /\(node:|\(internal[/:]|at node:|at internal[/:]/.test(line))
  )
}

interface ProcessEvents {
  on(event: "unhandledRejection", listener: (reason: unknown) => void): unknown
  off(event: "unhandledRejection", listener: (reason: unknown) => void): unknown
  listenerCount(event: "unhandledRejection"): number
}

const events = (): ProcessEvents | undefined => {
  const p = (globalThis as { process?: Partial<ProcessEvents> }).process
  return typeof p?.on === "function" && typeof p.off === "function" && typeof p.listenerCount === "function"
    ? (p as ProcessEvents)
    : undefined
}

let users = 0
let warned = false
const listener = (reason: unknown): void => {
  if (isPostgresJsConnectionLoss(reason)) return
  if (isSocketLoss(reason)) {
    if (!warned) {
      warned = true
      console.warn(
        `txbox: dropped an unhandled socket error nobody awaited (${(reason as Error).message}), as postgres.js leaves one when a connection is reset; said once`,
      )
    }
    return
  }
  // Ours is the only listener: do what Node does without one.
  if (events()?.listenerCount("unhandledRejection") === 1) throw reason
}

/** Installs the listener while at least one store holds it; returns the release. */
export const holdLostConnectionGuard = (): (() => void) => {
  const p = events()
  if (p === undefined) return () => {}
  if (users++ === 0) p.on("unhandledRejection", listener)
  let released = false
  return () => {
    if (released) return
    released = true
    if (--users === 0) p.off("unhandledRejection", listener)
  }
}
