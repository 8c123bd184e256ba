/**
 * What a keyed message tells its consumers about the messages before it.
 *
 * A key's numbers count every message of the key, whatever its routing key;
 * a consumer receives only the routes its queue is bound to. So each message
 * carries, per route of its key, the last message before it (number and
 * enqueue time, from the key's counter). A consumer waits only for the last of
 * those on a route it is bound to, and only if that message was enqueued after
 * its binding existed: a message on a route it is not bound to is "not for
 * me", one enqueued before its queue was bound never reached it; anything
 * else is "not here yet" and is waited for.
 */
import type { PartitionPosition } from "../ports/Transport.ts"

/** Per routing key, the last message of the key before this one: `[seq, enqueuedAtMs]`. */
export type KeyRoutes = Readonly<Record<string, readonly [number, number]>>

/** A consumer's binding: a topic pattern, and when its queue was first bound to it (ms, the inbox database's clock). */
export interface RouteBinding {
  /** The topic pattern (a routing key with `*` and `#` wildcards) the consumer's queue is bound with. */
  readonly pattern: string
  /** When the queue was first bound to it: ms since 1970, on the inbox database's clock. */
  readonly boundAtMs: number
}

export const formatKeyRoutes = (routes: KeyRoutes): string => JSON.stringify(routes)

/** The routes a header carries; undefined when it is absent or not what txbox writes. */
export const parseKeyRoutes = (text: string | undefined): KeyRoutes | undefined => {
  if (text === undefined) return undefined
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch {
    return undefined
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return undefined
  const routes: Record<string, readonly [number, number]> = {}
  for (const [name, entry] of Object.entries(value)) {
    if (
      !Array.isArray(entry) ||
      entry.length !== 2 ||
      !entry.every((n) => Number.isSafeInteger(n) && n >= 0) ||
      entry[0] < 1
    )
      return undefined
    routes[name] = [entry[0], entry[1]]
  }
  return routes
}

/** AMQP topic matching: words split on ".", `*` is one word, `#` zero or more. */
export const topicMatches = (pattern: string, routingKey: string): boolean => {
  const p = pattern.split(".")
  const k = routingKey.split(".")
  const match = (i: number, j: number): boolean => {
    if (i === p.length) return j === k.length
    if (p[i] === "#") {
      for (let skip = j; skip <= k.length; skip++) if (match(i + 1, skip)) return true
      return false
    }
    return j < k.length && (p[i] === "*" || p[i] === k[j]) && match(i + 1, j + 1)
  }
  return match(0, 0)
}

/**
 * What a message at `seq` waits for, for a consumer bound as `bindings`: the
 * last message before it on a route the consumer is bound to, enqueued after
 * that binding existed (its number and enqueue time); number 0 when there is none.
 */
export const waitsFor = (
  routes: KeyRoutes,
  bindings: ReadonlyArray<RouteBinding>,
  seq: number,
): { readonly seq: number; readonly atMs: number } => {
  let after = 0
  let afterAt = 0
  for (const [route, [before, at]] of Object.entries(routes)) {
    if (before >= seq || before <= after) continue
    let boundAt = Number.POSITIVE_INFINITY
    for (const b of bindings)
      if (b.boundAtMs < boundAt && topicMatches(b.pattern, route)) boundAt = b.boundAtMs
    if (at >= boundAt) {
      after = before
      afterAt = at
    }
  }
  return { seq: after, atMs: afterAt }
}

export const afterFor = (routes: KeyRoutes, bindings: ReadonlyArray<RouteBinding>, seq: number): number =>
  waitsFor(routes, bindings, seq).seq

/** `at` with what it waits for, when the message carries its routes and the consumer knows its bindings. */
export const withAfter = (
  at: PartitionPosition,
  routes: KeyRoutes | undefined,
  bindings: ReadonlyArray<RouteBinding> | undefined,
): PartitionPosition => {
  if (routes === undefined || bindings === undefined) return at
  const before = waitsFor(routes, bindings, at.seq)
  return before.seq === 0 ? { ...at, after: 0 } : { ...at, after: before.seq, afterAtMs: before.atMs }
}

/** A headers JSON object text with one more header. */
export const withHeader = (headers: string, name: string, value: string): string =>
  headers === "{}"
    ? JSON.stringify({ [name]: value })
    : JSON.stringify({ ...(JSON.parse(headers) as Record<string, string>), [name]: value })
