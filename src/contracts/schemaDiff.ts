/**
 * What a JSON Schema change breaks, read structurally: `narrowings(a, b)` lists
 * the ways a value valid under `a` may be refused by `b`. With `a` the old
 * schema and `b` the new one, that is what breaks old producers (their
 * messages reach new consumers); the other way round, what breaks old
 * consumers. Each finding is worded as a change from old to new.
 *
 * It reads the subset converters emit — `type`, `const`/`enum`, `properties`,
 * `required`, `additionalProperties`, `items`, `anyOf`/`oneOf`, local `$ref`,
 * bounds (`minimum`, `maxLength`, …), `format`, `pattern`, `multipleOf`. It
 * does not prove inclusion in general (`allOf`, `not`, `if`, `patternProperties`,
 * tuples are not read), so a change there goes unreported.
 */
import type { JsonSchemaObject as JsonSchema } from "./jsonSchema.ts"

/** One way a change refuses a value the other side accepted. `path` is `(payload)` or `field.sub[]`. */
export interface Finding {
  /** Where in the payload: `(payload)` for the root, else `field.sub[]`. */
  readonly path: string
  /** The change, worded from old to new (e.g. `maxLength changed from none to 20`). */
  readonly change: string
}

/** Which side's values are at stake: old producers' (a = old) or what old consumers accept (a = new). */
export type Direction = "producers" | "consumers"

type Schema = JsonSchema | boolean

interface Context {
  readonly direction: Direction
  readonly rootA: Schema
  readonly rootB: Schema
  readonly depth: number
}

const MAX_DEPTH = 64

const isObject = (s: unknown): s is JsonSchema => typeof s === "object" && s !== null && !Array.isArray(s)

/** Follows local `$ref`s (`#/$defs/x`, `#/definitions/x`) within the schema's own document. */
const deref = (schema: Schema, root: Schema): Schema => {
  let current = schema
  for (let hops = 0; hops < MAX_DEPTH && isObject(current) && typeof current.$ref === "string"; hops++) {
    const ref = current.$ref as string
    if (!ref.startsWith("#")) return true // a remote reference is not read: treat as anything
    let target: unknown = root
    for (const part of ref
      .slice(1)
      .split("/")
      .filter((p) => p !== "")) {
      const key = decodeURIComponent(part).replaceAll("~1", "/").replaceAll("~0", "~")
      target = isObject(target) ? target[key] : undefined
    }
    if (!isObject(target) && typeof target !== "boolean") return true
    current = target
  }
  return current
}

const jsonType = (value: unknown): string => {
  if (value === null) return "null"
  if (Array.isArray(value)) return "array"
  if (typeof value === "number") return Number.isInteger(value) ? "integer" : "number"
  return typeof value
}

/** The JSON types a (non-union) schema allows; undefined = any. */
const typesOf = (s: Schema): ReadonlyArray<string> | undefined => {
  if (s === false) return []
  if (s === true) return undefined
  if (typeof s.type === "string") return [s.type]
  if (Array.isArray(s.type)) return s.type as Array<string>
  if (s.const !== undefined) return [jsonType(s.const)]
  if (Array.isArray(s.enum)) return [...new Set(s.enum.map(jsonType))]
  if (isObject(s.properties) || Array.isArray(s.required)) return ["object"]
  if (s.items !== undefined) return ["array"]
  return undefined
}

const covers = (types: ReadonlyArray<string> | undefined, t: string): boolean =>
  types === undefined || types.includes(t) || (t === "integer" && types.includes("number"))

/** A union's members, nested unions flattened; a plain schema is its own one member. */
const variantsOf = (s: Schema, root: Schema, depth = 0): ReadonlyArray<Schema> => {
  const resolved = deref(s, root)
  if (!isObject(resolved) || depth > MAX_DEPTH) return [resolved]
  const members = resolved.anyOf ?? resolved.oneOf
  if (!Array.isArray(members)) return [resolved]
  return members.flatMap((m: Schema) => variantsOf(m, root, depth + 1))
}

const typeName = (types: ReadonlyArray<string> | undefined) =>
  types === undefined ? "any" : types.length === 0 ? "nothing" : types.join(" | ")

const list = (values: ReadonlyArray<unknown>) => values.map((v) => JSON.stringify(v)).join(", ")

/** Old and new values of something the finding compares, from `a`/`b` and the direction. */
const oldNew = <T>(ctx: Context, a: T, b: T): readonly [T, T] =>
  ctx.direction === "producers" ? [a, b] : [b, a]

const at = (path: string, key: string) => (path === "" ? key : `${path}.${key}`)

const LOWER = ["minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"] as const
const UPPER = ["maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"] as const
const EXACT = ["format", "pattern", "multipleOf"] as const

const show = (value: unknown) => (value === undefined ? "none" : JSON.stringify(value))

/** Bounds and formats: `b` stricter than `a` somewhere. */
const constraintFindings = (a: JsonSchema, b: JsonSchema, path: string, ctx: Context): Array<Finding> => {
  const out: Array<Finding> = []
  const changed = (keyword: string) => {
    const [o, n] = oldNew(ctx, a[keyword], b[keyword])
    out.push({ path, change: `${keyword} changed from ${show(o)} to ${show(n)}` })
  }
  for (const k of LOWER) {
    const bv = b[k]
    const av = a[k]
    if (typeof bv === "number" && (typeof av !== "number" || av < bv)) changed(k)
  }
  for (const k of UPPER) {
    const bv = b[k]
    const av = a[k]
    if (typeof bv === "number" && (typeof av !== "number" || av > bv)) changed(k)
  }
  for (const k of EXACT) if (b[k] !== undefined && a[k] !== b[k]) changed(k)
  if (b.uniqueItems === true && a.uniqueItems !== true) changed("uniqueItems")
  return out
}

const valuesOf = (s: JsonSchema): ReadonlyArray<unknown> | undefined =>
  s.const !== undefined ? [s.const] : Array.isArray(s.enum) ? s.enum : undefined

const enumFindings = (a: JsonSchema, b: JsonSchema, path: string, ctx: Context): Array<Finding> => {
  const inB = valuesOf(b)
  if (inB === undefined) return []
  const inA = valuesOf(a)
  const keys = new Set(inB.map((v) => JSON.stringify(v)))
  if (inA === undefined) {
    const change =
      ctx.direction === "producers"
        ? `now restricted to ${list(inB)}`
        : `no longer restricted to ${list(inB)}`
    return [{ path, change }]
  }
  const missing = inA.filter((v) => !keys.has(JSON.stringify(v)))
  if (missing.length === 0) return []
  const change =
    ctx.direction === "producers"
      ? `enum narrowed: ${list(missing)} no longer accepted`
      : `enum widened: ${list(missing)} added`
  return [{ path, change }]
}

const objectFindings = (a: JsonSchema, b: JsonSchema, path: string, ctx: Context): Array<Finding> => {
  const out: Array<Finding> = []
  const propsA = isObject(a.properties) ? a.properties : {}
  const propsB = isObject(b.properties) ? b.properties : {}
  const requiredA = new Set(Array.isArray(a.required) ? (a.required as Array<string>) : [])
  const requiredB = Array.isArray(b.required) ? (b.required as Array<string>) : []
  const producers = ctx.direction === "producers"
  for (const field of requiredB) {
    if (requiredA.has(field)) continue
    const known = field in propsA
    const change = producers
      ? known
        ? "optional field became required"
        : "required field added"
      : known
        ? "required field became optional"
        : "required field removed"
    out.push({ path: at(path, field), change })
  }
  const closedB = b.additionalProperties === false
  for (const field of Object.keys(propsA)) {
    if (field in propsB) {
      out.push(...narrowings(propsA[field] as Schema, propsB[field] as Schema, at(path, field), ctx))
    } else if (closedB) {
      const change = producers
        ? "field removed, and unknown fields are refused"
        : "field added, but the old schema refuses unknown fields"
      out.push({ path: at(path, field), change })
    } else if (isObject(b.additionalProperties)) {
      out.push(...narrowings(propsA[field] as Schema, b.additionalProperties, at(path, field), ctx))
    }
  }
  if (closedB && a.additionalProperties !== false) {
    const change = producers ? "unknown fields are now refused" : "unknown fields are now allowed"
    out.push({ path, change })
  }
  if (isObject(a.additionalProperties) && isObject(b.additionalProperties)) {
    out.push(...narrowings(a.additionalProperties, b.additionalProperties, at(path, "*"), ctx))
  }
  return out
}

/** Two member schemas of compatible types: every keyword of `b` that `a` does not already satisfy. */
const memberFindings = (a: Schema, b: Schema, path: string, ctx: Context): Array<Finding> => {
  if (!isObject(a) || !isObject(b)) return []
  const out = [...enumFindings(a, b, path, ctx), ...constraintFindings(a, b, path, ctx)]
  const typesA = typesOf(a)
  if (covers(typesA, "object") || isObject(a.properties)) out.push(...objectFindings(a, b, path, ctx))
  if (a.items !== undefined && b.items !== undefined && !Array.isArray(a.items) && !Array.isArray(b.items)) {
    out.push(...narrowings(a.items as Schema, b.items as Schema, `${path}[]`, ctx))
  }
  return out
}

/** The ways a value valid under `a` may be refused by `b`. */
export const narrowings = (aIn: Schema, bIn: Schema, path: string, ctx: Context): Array<Finding> => {
  if (ctx.depth > MAX_DEPTH) return []
  const inner = { ...ctx, depth: ctx.depth + 1 }
  const membersA = variantsOf(aIn, ctx.rootA)
  const membersB = variantsOf(bIn, ctx.rootB)
  const out: Array<Finding> = []
  const lost: Array<string> = []
  const allA = new Set<string>()
  for (const memberA of membersA) {
    const typesA = typesOf(memberA)
    for (const t of typesA ?? ["any"]) allA.add(t)
    // Members of b that take every type of this member of a.
    const candidates = membersB.filter((memberB) => {
      const typesB = typesOf(memberB)
      return typesA === undefined ? typesB === undefined : typesA.every((t) => covers(typesB, t))
    })
    if (candidates.length === 0) {
      const anyB = membersB.map(typesOf)
      for (const t of typesA ?? ["any"]) {
        if (t === "any" ? !anyB.includes(undefined) : !anyB.some((types) => covers(types, t))) lost.push(t)
      }
      continue
    }
    // Fits if one candidate takes it whole; else report the closest one's findings.
    let best: Array<Finding> | undefined
    for (const memberB of candidates) {
      const found = memberFindings(memberA, memberB, path, inner)
      if (best === undefined || found.length < best.length) best = found
      if (found.length === 0) break
    }
    out.push(...(best ?? []))
  }
  if (lost.length > 0) {
    const typesB = new Set(membersB.flatMap((m) => typesOf(m) ?? ["any"]))
    const lostSet = [...new Set(lost)]
    const [o, n] = oldNew(ctx, typeName([...allA]), typeName([...typesB]))
    const disjoint = lostSet.length === allA.size
    const change = disjoint
      ? `type changed from ${o} to ${n}`
      : ctx.direction === "producers"
        ? `no longer accepts ${typeName(lostSet)}`
        : `now also accepts ${typeName(lostSet)}`
    out.unshift({ path, change })
  }
  const seen = new Set<string>()
  return out.filter((f) => {
    const key = `${f.path}\n${f.change}`
    if (seen.has(key)) return false
    seen.add(key)
    return true
  })
}

const named = (findings: ReadonlyArray<Finding>): Array<Finding> =>
  findings.map((f) => (f.path === "" ? { ...f, path: "(payload)" } : f))

/** What a change from `oldSchema` to `newSchema` breaks, each side's findings worded old → new. */
export const diffSchemas = (
  oldSchema: JsonSchema,
  newSchema: JsonSchema,
): { readonly breaksOldProducers: Array<Finding>; readonly breaksOldConsumers: Array<Finding> } => ({
  breaksOldProducers: named(
    narrowings(oldSchema, newSchema, "", {
      direction: "producers",
      rootA: oldSchema,
      rootB: newSchema,
      depth: 0,
    }),
  ),
  breaksOldConsumers: named(
    narrowings(newSchema, oldSchema, "", {
      direction: "consumers",
      rootA: newSchema,
      rootB: oldSchema,
      depth: 0,
    }),
  ),
})
