/**
 * Drivers are optional peer dependencies: an app installs the one it uses, and
 * each store imports its driver only when its layer is built, so importing
 * `txbox/pg` never loads `postgres`, and a missing driver is a `ConfigError`
 * that says what to install instead of a module-resolution stack trace.
 */
import { Effect } from "effect"
import { ConfigError } from "./Errors.ts"

/** A driver package: its npm name, the entry that needs it, and how to load it. */
export interface DriverPackage<M> {
  /** The npm name, as in `npm i <name>`. */
  readonly name: string
  /** The txbox entry that needs it (for the message). */
  readonly entry: string
  /**
   * The dynamic `import()`, written out at the call site so that bundlers and
   * `deno publish` see the specifier.
   */
  readonly load: () => Promise<M>
}

const notFound = (cause: unknown): boolean => {
  const code = (cause as { code?: unknown } | undefined)?.code
  const message = cause instanceof Error ? cause.message : String(cause)
  return (
    code === "ERR_MODULE_NOT_FOUND" ||
    code === "MODULE_NOT_FOUND" ||
    /cannot find (module|package)|could not resolve|not found in import map|module not found/i.test(message)
  )
}

/** The message for a driver that would not load; names the package to install either way. */
export const missingDriverMessage = (driver: { name: string; entry: string }, cause: unknown): string => {
  const detail = cause instanceof Error ? cause.message : String(cause)
  return notFound(cause)
    ? `${driver.entry} needs the "${driver.name}" package, which is not installed: npm i ${driver.name} (bun add ${driver.name}, deno add npm:${driver.name})`
    : `${driver.entry} could not load "${driver.name}" (npm i ${driver.name} installs it): ${detail}`
}

/** Loads a driver once per call; fails with a `ConfigError` that names the package to install. */
export const loadDriver = <M>(driver: DriverPackage<M>): Effect.Effect<M, ConfigError> =>
  Effect.tryPromise({
    try: () => driver.load(),
    catch: (cause) => new ConfigError({ reason: missingDriverMessage(driver, cause) }),
  })

/** The default export of a CommonJS driver (pg, postgres) as ESM and Bun/Deno hand it over. */
export const defaultExport = <M>(module: { readonly default?: M } & object): M =>
  (module.default ?? module) as M
