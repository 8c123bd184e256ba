/**
 * Config validation in one place: every check names the field it rejects, and
 * every failure is a `ConfigError` (never a plain Error from a parser). Layers
 * call `validateConfig` once, when they are built.
 */
import { Duration, Effect } from "effect"
import { ConfigError } from "../Errors.ts"

/** Thrown by the checks below and caught only by `validateConfig`. */
const reject = (field: string, problem: string, value: unknown): never => {
  throw new ConfigError({ reason: `${field} ${problem}, got ${show(value)}` })
}

const show = (value: unknown): string => {
  if (typeof value === "string") return JSON.stringify(value)
  if (typeof value === "bigint") return `${value}n`
  try {
    return JSON.stringify(value) ?? String(value)
  } catch {
    return String(value)
  }
}

/** What a check threw, as a `ConfigError`: anything else (a TypeError on a malformed value) is wrapped. */
export const toConfigError = (error: unknown): ConfigError =>
  error instanceof ConfigError
    ? error
    : new ConfigError({ reason: `invalid configuration: ${String(error)}` })

/** Runs the checks in `resolve`; a rejected field becomes the Effect's typed `ConfigError`. */
export const validateConfig = <A>(resolve: () => A): Effect.Effect<A, ConfigError> =>
  Effect.try({ try: resolve, catch: toConfigError })

/** A duration option in milliseconds: `value ?? fallback`, which must parse and lie in [minMs, maxMs]. */
export const millis = (
  field: string,
  value: Duration.Input | undefined,
  fallback: Duration.Input,
  bounds: { readonly minMs?: number; readonly maxMs?: number } = {},
): number => {
  const input = value ?? fallback
  const parsed = Duration.fromInput(input)
  if (parsed._tag === "None")
    return reject(field, 'must be a duration (e.g. "5 seconds" or a number of ms)', input)
  const ms = Duration.toMillis(parsed.value)
  if (!Number.isFinite(ms)) return reject(field, "must be finite", input)
  const min = bounds.minMs ?? 0
  if (ms < min) return reject(field, `must be at least ${min} ms`, input)
  if (bounds.maxMs !== undefined && ms > bounds.maxMs)
    return reject(field, `must be at most ${bounds.maxMs} ms`, input)
  return ms
}

/** An integer option: `value ?? fallback`, in [min, max]. */
export const integer = (
  field: string,
  value: number | undefined,
  fallback: number,
  min: number,
  max: number,
) => {
  const n = value ?? fallback
  if (typeof n !== "number" || !Number.isInteger(n) || n < min || n > max) {
    return reject(field, `must be an integer in ${min}..${max}`, n)
  }
  return n
}

/** A number option: `value ?? fallback`, at least `min`. */
export const atLeast = (field: string, value: number | undefined, fallback: number, min: number): number => {
  const n = value ?? fallback
  if (typeof n !== "number" || !Number.isFinite(n) || n < min)
    return reject(field, `must be a number >= ${min}`, n)
  return n
}

/** A boolean option. */
export const flag = (field: string, value: boolean | undefined, fallback: boolean): boolean => {
  const b = value ?? fallback
  if (typeof b !== "boolean") return reject(field, "must be true or false", b)
  return b
}

/** One of `choices`. */
export const oneOf = <const T extends string>(
  field: string,
  value: T | undefined,
  fallback: T,
  choices: ReadonlyArray<T>,
): T => {
  const v = value ?? fallback
  if (!choices.includes(v))
    return reject(field, `must be one of ${choices.map((c) => JSON.stringify(c)).join(", ")}`, v)
  return v
}

/** A free-form check: `ok` or the field is rejected with `problem`. */
export const check = (ok: boolean, field: string, problem: string, value: unknown): void => {
  if (!ok) reject(field, problem, value)
}
