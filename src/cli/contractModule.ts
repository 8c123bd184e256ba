/**
 * The contracts a module exports, for `txbox contracts check` and `txbox
 * asyncapi`: the module is imported (`import()`), and every exported value
 * that is a contract — or an array or default-exported object of them — is
 * taken, with the versions its upcast chain names.
 *
 * A `.ts` module loads under Bun and Deno as it is, and under Node from
 * 22.18 on (type stripping: erasable TypeScript only, `.ts` in relative
 * imports); on older Node, point at the compiled `.js`.
 */
import { resolve } from "node:path"
import { pathToFileURL } from "node:url"
import { Effect } from "effect"
import type { AnyContract } from "../Contract.ts"
import type { JsonSchemaConverter } from "../contracts/jsonSchema.ts"
import { UsageError } from "./errors.ts"

const isContract = (value: unknown): value is AnyContract => {
  if (value === null || typeof value !== "object") return false
  const c = value as Partial<AnyContract>
  return (
    typeof c.type === "string" &&
    typeof c.version === "number" &&
    typeof (c.schema as { "~standard"?: { validate?: unknown } } | undefined)?.["~standard"]?.validate ===
      "function"
  )
}

const contractsIn = (value: unknown): ReadonlyArray<AnyContract> => {
  if (isContract(value)) return [value]
  if (Array.isArray(value)) return value.filter(isContract)
  return []
}

const describe = (error: unknown) => (error instanceof Error ? error.message : String(error))

/** Imports `path` (relative to the working directory) and returns the contracts it exports. */
export const loadContracts = (path: string): Effect.Effect<ReadonlyArray<AnyContract>, UsageError> =>
  Effect.gen(function* () {
    const url = pathToFileURL(resolve(path)).href
    const module = yield* Effect.tryPromise({
      try: () => import(url) as Promise<Record<string, unknown>>,
      catch: (error) =>
        new UsageError({
          reason:
            `cannot load the contract module ${path}: ${describe(error)}` +
            (path.endsWith(".ts") && typeof process.versions.bun !== "string"
              ? " (a .ts module needs Bun, Deno or Node ≥ 22.18; or compile it and pass the .js)"
              : ""),
        }),
    })
    const found = new Set<AnyContract>()
    for (const [name, value] of Object.entries(module)) {
      for (const c of contractsIn(value)) found.add(c)
      // A default export may be an object of contracts: `export default { OrderPlaced, OrderPaid }`.
      if (name === "default" && value !== null && typeof value === "object" && !Array.isArray(value)) {
        for (const inner of Object.values(value)) for (const c of contractsIn(inner)) found.add(c)
      }
    }
    if (found.size === 0) {
      return yield* new UsageError({
        reason: `${path} exports no contracts (export the values defineEvent returns)`,
      })
    }
    return [...found]
  })

/**
 * JSON Schema for plain valibot schemas through `@valibot/to-json-schema`,
 * when it is installed (txbox does not depend on it); other schemas need
 * Standard JSON Schema or a contract-level `jsonSchema`.
 */
export const valibotConverter: Effect.Effect<JsonSchemaConverter | undefined> = Effect.promise(async () => {
  try {
    const { toJsonSchema } = await import("@valibot/to-json-schema")
    return (contract: AnyContract) =>
      contract.schema["~standard"].vendor === "valibot"
        ? // biome-ignore lint/suspicious/noExplicitAny: the vendor says it is a valibot schema
          (toJsonSchema(contract.schema as any, { typeMode: "input" }) as Record<string, unknown>)
        : undefined
  } catch {
    return undefined
  }
})
