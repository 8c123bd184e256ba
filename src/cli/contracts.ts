/**
 * `txbox contracts check`: is this module's contracts safe to deploy next to
 * the released one? Compares through JSON Schema (see
 * contracts/compatibility.ts) and exits 1 when a change breaks old producers
 * with no upcast to cover it, or changes a released version in place. For a
 * service's CI: `txbox contracts check --old ./released/contracts.ts --new ./src/contracts.ts`.
 */
import { Effect, Option } from "effect"
import { Command, Flag } from "effect/cli"
import { type CheckResult, type CompatibilityReport, checkContracts } from "../contracts/compatibility.ts"
import { loadContracts, valibotConverter } from "./contractModule.ts"
import { CheckFailedError, UsageError } from "./errors.ts"
import { jsonFlag } from "./options.ts"
import { print, printJson } from "./output.ts"

const modulePath = (name: string, description: string) =>
  Flag.String(name).pipe(Flag.withDescription(description), Flag.optional)

const headline = (r: CompatibilityReport): string => {
  const pair =
    r.oldVersion === r.newVersion
      ? `${r.type} @${r.oldVersion} (same version, old and new module)`
      : `${r.type} @${r.oldVersion} → @${r.newVersion}`
  if (!r.compatible) return `${pair}: INCOMPATIBLE`
  const broken = r.breaksOldProducers.length > 0
  return `${pair}: compatible${broken && r.upcast ? ` through the upcast from @${r.oldVersion}` : ""}`
}

/** The report for people: one block per comparison, the findings indented under what they break. */
export const render = (result: CheckResult): string => {
  const blocks = result.reports.map((r) => {
    const lines = [headline(r)]
    const section = (title: string, findings: CompatibilityReport["breaksOldProducers"]) => {
      if (findings.length === 0) return
      lines.push(`  ${title}:`)
      for (const f of findings) lines.push(`    ${f.path}: ${f.change}`)
    }
    section(
      `breaks old producers (an @${r.oldVersion} message fails @${r.newVersion}'s schema${r.upcast ? "; the upcast converts it first" : ""})`,
      r.breaksOldProducers,
    )
    section(
      `breaks old consumers (an @${r.newVersion} message fails @${r.oldVersion}'s schema)`,
      r.breaksOldConsumers,
    )
    for (const note of r.notes) lines.push(`  note: ${note}`)
    return lines.join("\n")
  })
  for (const note of result.notes) blocks.push(`note: ${note}`)
  const bad = result.reports.filter((r) => !r.compatible).length
  const n = result.reports.length
  blocks.push(
    n === 0
      ? "nothing to compare: no type has two versions"
      : `${n} comparison${n === 1 ? "" : "s"}: ${bad === 0 ? "all compatible" : `${bad} incompatible`}`,
  )
  return blocks.join("\n\n")
}

const check = Command.make(
  "check",
  {
    old: modulePath(
      "old",
      "the contract module as released (e.g. from the last tag); omit to compare versions within one module",
    ),
    new: modulePath("new", "the contract module as it is now"),
    module: modulePath("module", "same as --new"),
    json: jsonFlag,
  },
  (flags) =>
    Effect.gen(function* () {
      const old = Option.getOrUndefined(flags.old)
      const current = Option.getOrUndefined(flags.new) ?? Option.getOrUndefined(flags.module)
      if (current === undefined) {
        return yield* new UsageError({ reason: "no contract module: pass --new PATH (or --module PATH)" })
      }
      if (Option.isSome(flags.new) && Option.isSome(flags.module)) {
        return yield* new UsageError({ reason: "--new and --module name the same module: pass one" })
      }
      const toJsonSchema = yield* valibotConverter
      const result = yield* checkContracts(
        {
          new: yield* loadContracts(current),
          ...(old === undefined ? {} : { old: yield* loadContracts(old) }),
        },
        toJsonSchema === undefined ? {} : { toJsonSchema },
      )
      yield* flags.json ? printJson(result) : print(render(result))
      if (!result.compatible) {
        const bad = result.reports.filter((r) => !r.compatible).map((r) => `${r.type}@${r.newVersion}`)
        return yield* new CheckFailedError({ reason: `incompatible: ${bad.join(", ")}` })
      }
    }),
).pipe(
  Command.withDescription(
    "Compare contract versions through their JSON Schema: what breaks old producers or old consumers; exit 1 when a break has no upcast",
  ),
  Command.withShortDescription("Check a contract change for compatibility"),
)

export const command = Command.make("contracts").pipe(
  Command.withDescription("Event contracts across services: compatibility between versions"),
  Command.withShortDescription("Check contract compatibility"),
  Command.withSubcommands([check]),
)
