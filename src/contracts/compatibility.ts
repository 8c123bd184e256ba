/**
 * Is a new version of a contract safe to deploy? Two versions are compared
 * through their JSON Schemas, both ways: what an old producer sends that the
 * new schema refuses ("breaks old producers"), and what a new producer sends
 * that the old schema refuses ("breaks old consumers").
 *
 * The verdict follows how txbox delivers versions. A consumer refuses a
 * version newer than it handles (a dead row: upgrade consumers first), so a
 * new version breaking old consumers is expected and not a failure. Old
 * producers' messages reach new consumers, so breaking them fails the check —
 * unless the new version upcasts from the old one. A schema changed in place
 * (same version) is checked both ways: no upcast can cover it.
 */
import { Effect } from "effect"
import { validateConfig } from "../core/config.ts"
import { ConfigError } from "../Errors.ts"
import { type JsonSchemaConverter, jsonSchemaOf } from "./jsonSchema.ts"
import { diffSchemas, type Finding } from "./schemaDiff.ts"
import type { AnyContract } from "./types.ts"
import { chainOf } from "./upcast.ts"

export type { Finding } from "./schemaDiff.ts"

/** The verdict on one pair of contract versions (or one version changed in place), with what breaks and what to do. */
export interface CompatibilityReport {
  /** The event type compared. */
  readonly type: string
  /** The old contract's version. */
  readonly oldVersion: number
  /** The new contract's version (equal to `oldVersion` for a change in place). */
  readonly newVersion: number
  /** Old producers' messages the new schema refuses, worded as changes from old to new. */
  readonly breaksOldProducers: ReadonlyArray<Finding>
  /** New producers' messages the old schema refuses. */
  readonly breaksOldConsumers: ReadonlyArray<Finding>
  /** The new version's upcast chain reaches the old version. */
  readonly upcast: boolean
  /** Safe to deploy: nothing breaks old producers, or an upcast covers them; a change in place must break neither side. */
  readonly compatible: boolean
  /** What to do about it, one sentence each. */
  readonly notes: ReadonlyArray<string>
}

/** What `checkContracts` found for a whole module: a report per pair compared. */
export interface CheckResult {
  /** Every report is compatible. */
  readonly compatible: boolean
  /** One per pair of versions compared. */
  readonly reports: ReadonlyArray<CompatibilityReport>
  /** Module-level remarks (a type the new module no longer defines). */
  readonly notes: ReadonlyArray<string>
}

/** Options of `checkCompatibility` and `checkContracts`. */
export interface CheckOptions {
  /** For schemas that carry no JSON Schema of their own (see `jsonSchemaOf`). */
  readonly toJsonSchema?: JsonSchemaConverter
}

const verdict = (
  oldContract: AnyContract,
  next: AnyContract,
  breaks: ReturnType<typeof diffSchemas>,
): Pick<CompatibilityReport, "upcast" | "compatible" | "notes"> => {
  const type = next.type
  const o = `@${oldContract.version}`
  const n = `@${next.version}`
  const broken = breaks.breaksOldProducers.length > 0 || breaks.breaksOldConsumers.length > 0
  if (next.version < oldContract.version) {
    return {
      upcast: false,
      compatible: false,
      notes: [
        `${type}'s newest version went down from ${o} to ${n}: is the new module older than the released one?`,
      ],
    }
  }
  if (next.version === oldContract.version) {
    return {
      upcast: false,
      compatible: !broken,
      notes: broken
        ? [
            `${type}${n} changed in place: messages already sent as ${n} and services on the old module disagree with the new one — ` +
              `publish the change as @${next.version + 1} with an upcast from ${n}`,
          ]
        : [],
    }
  }
  const upcast = chainOf(next).some((c) => c.version === oldContract.version)
  const notes = upcast
    ? [`${o} messages are upcast to ${n} by consumers that register ${n}`]
    : [
        `no upcast from ${o} on ${n}: a consumer that registers only ${n} sends ${o} messages still in flight to dead rows — ` +
          `declare \`upcast: { from: <the ${o} contract>, to }\``,
      ]
  notes.push(
    `consumers that handle only ${o} send ${n} messages to dead rows (newer version): upgrade consumers first`,
  )
  return { upcast, compatible: breaks.breaksOldProducers.length === 0 || upcast, notes }
}

/** Compares two versions (or two editions of one version) of a contract. */
export const checkCompatibility = (
  oldContract: AnyContract,
  newContract: AnyContract,
  options: CheckOptions = {},
): Effect.Effect<CompatibilityReport, ConfigError> =>
  Effect.gen(function* () {
    if (oldContract.type !== newContract.type) {
      return yield* new ConfigError({
        reason: `cannot compare ${oldContract.type}@${oldContract.version} with ${newContract.type}@${newContract.version}: different types`,
      })
    }
    const oldSchema = yield* jsonSchemaOf(oldContract, options.toJsonSchema)
    const newSchema = yield* jsonSchemaOf(newContract, options.toJsonSchema)
    const breaks = diffSchemas(oldSchema, newSchema)
    // An upcast chain with a gap is a ConfigError thrown by `chainOf`.
    const outcome = yield* validateConfig(() => verdict(oldContract, newContract, breaks))
    return {
      type: newContract.type,
      oldVersion: oldContract.version,
      newVersion: newContract.version,
      ...breaks,
      ...outcome,
    }
  })

/**
 * Every contract of a module with the versions its upcast chains name, by
 * type and version. The same (type, version) as two different values is a
 * `ConfigError`: which one is the contract would be a guess.
 */
export const contractsByType = (
  contracts: Iterable<AnyContract>,
): Effect.Effect<ReadonlyMap<string, ReadonlyMap<number, AnyContract>>, ConfigError> =>
  validateConfig(() => {
    const byType = new Map<string, Map<number, AnyContract>>()
    for (const contract of contracts) {
      for (const c of chainOf(contract)) {
        const versions = byType.get(c.type) ?? new Map<number, AnyContract>()
        const seen = versions.get(c.version)
        if (seen !== undefined && seen !== c) {
          throw new ConfigError({
            reason: `${c.type}@${c.version} is defined twice, as two different contracts`,
          })
        }
        versions.set(c.version, c)
        byType.set(c.type, versions)
      }
    }
    return byType
  })

const ascending = (versions: ReadonlyMap<number, AnyContract>) =>
  [...versions.values()].sort((a, b) => a.version - b.version)

/**
 * Checks a module's contracts. With `old` (the module as released), every
 * version both define is compared with itself (a change in place), and each
 * type's newest old version with its newest new one. Without it, each type's
 * consecutive versions in the one module are compared.
 */
export const checkContracts = (
  input: { readonly old?: Iterable<AnyContract>; readonly new: Iterable<AnyContract> },
  options: CheckOptions = {},
): Effect.Effect<CheckResult, ConfigError> =>
  Effect.gen(function* () {
    const next = yield* contractsByType(input.new)
    const pairs: Array<readonly [AnyContract, AnyContract]> = []
    const notes: Array<string> = []
    if (input.old === undefined) {
      for (const versions of next.values()) {
        const list = ascending(versions)
        for (let i = 1; i < list.length; i++) pairs.push([list[i - 1]!, list[i]!])
      }
    } else {
      const old = yield* contractsByType(input.old)
      for (const [type, oldVersions] of old) {
        const newVersions = next.get(type)
        if (newVersions === undefined) {
          notes.push(
            `${type} is no longer defined: its consumers get no new messages, its producers' messages still arrive`,
          )
          continue
        }
        for (const [version, oldContract] of oldVersions) {
          const same = newVersions.get(version)
          if (same !== undefined) pairs.push([oldContract, same])
        }
        const newestOld = ascending(oldVersions).at(-1)!
        const newestNew = ascending(newVersions).at(-1)!
        if (newestOld.version !== newestNew.version) pairs.push([newestOld, newestNew])
      }
    }
    const reports: Array<CompatibilityReport> = []
    for (const [a, b] of pairs) reports.push(yield* checkCompatibility(a, b, options))
    return { compatible: reports.every((r) => r.compatible), reports, notes }
  })
