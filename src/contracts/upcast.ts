/**
 * Version routes: which sent versions of a type a set of registered contracts
 * can decode, and through which upcast steps. A registered contract handles
 * its own version; through its `upcast.from` chain it also takes every older
 * version, each upcast one step at a time and validated at every step. Built
 * once per registry, so a delivery costs one map lookup.
 */

import { ConfigError, UnknownEventError } from "../Errors.ts"
import type { AnyContract } from "./types.ts"

/** How a sent version reaches a registered contract: `steps[0]` is the sent version's contract, the last is `target`. */
export interface Route {
  readonly target: AnyContract
  readonly steps: ReadonlyArray<AnyContract>
}

/** Every version of one type a registry decodes. */
export interface TypeRoutes {
  readonly routes: ReadonlyMap<number, Route>
  /** The versions registered directly (each has a handler), oldest first. */
  readonly handled: ReadonlyArray<number>
}

interface Version {
  readonly type: string
  readonly version: number
}

/**
 * The one rule of an upcast step: it comes from the same type's previous
 * version. A `ConfigError` otherwise, from `defineEvent` and again for a
 * hand-built contract when a registry follows its chain.
 */
export const checkUpcastFrom = (to: Version, from: Version): void => {
  if (from.type !== to.type || from.version !== to.version - 1) {
    throw new ConfigError({
      reason: `${to.type}@${to.version} upcasts from ${from.type}@${from.version}: an upcast must come from the same type's previous version (@${to.version - 1})`,
    })
  }
}

/**
 * The contract and the older versions it upcasts from, oldest first. Versions
 * must fall one by one within one type (`defineEvent` checks that too; this
 * guards hand-built contracts, which could otherwise loop).
 */
export const chainOf = (contract: AnyContract): ReadonlyArray<AnyContract> => {
  const chain = [contract]
  let current = contract
  while (current.upcast !== undefined) {
    const from: AnyContract = current.upcast.from
    checkUpcastFrom(current, from)
    chain.unshift(from)
    current = from
  }
  return chain
}

/**
 * The route table of a set of contracts. A version registered directly is
 * decoded as itself (a consumer that keeps a handler for @1 still gets @1);
 * any other version goes to the oldest registered version whose chain
 * reaches it, so it is upcast no further than needed.
 */
export const buildRoutes = (contracts: ReadonlyArray<AnyContract>): ReadonlyMap<string, TypeRoutes> => {
  const byType = new Map<string, Array<AnyContract>>()
  for (const contract of contracts) {
    const registered = byType.get(contract.type) ?? []
    if (registered.some((c) => c.version === contract.version)) {
      throw new ConfigError({ reason: `contract ${contract.type}@v${contract.version} is registered twice` })
    }
    registered.push(contract)
    byType.set(contract.type, registered)
  }
  const table = new Map<string, TypeRoutes>()
  for (const [type, registered] of byType) {
    const ascending = [...registered].sort((a, b) => a.version - b.version)
    const routes = new Map<number, Route>(ascending.map((c) => [c.version, { target: c, steps: [c] }]))
    for (const target of ascending) {
      const chain = chainOf(target)
      for (let i = chain.length - 2; i >= 0; i--) {
        const from = chain[i]!
        if (!routes.has(from.version)) routes.set(from.version, { target, steps: chain.slice(i) })
      }
    }
    table.set(type, { routes, handled: ascending.map((c) => c.version) })
  }
  return table
}

/** The route for a sent `(type, version)`, or why there is none. A message without a version is read as version 1. */
export const routeFor = (
  table: ReadonlyMap<string, TypeRoutes>,
  type: string,
  version: number | undefined,
): Route | UnknownEventError => {
  const known = table.get(type)
  if (known === undefined) return new UnknownEventError({ type, version, reason: "unknown-type" })
  const route = known.routes.get(version ?? 1)
  if (route !== undefined) return route
  const newest = known.handled[known.handled.length - 1] ?? 0
  return new UnknownEventError({
    type,
    version,
    reason: (version ?? 1) > newest ? "newer-version" : "unknown-version",
    handled: known.handled,
  })
}
