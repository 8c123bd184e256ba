/**
 * `layerConfig`: a store's or transport's settings read through Effect's
 * `Config` instead of given as values, URLs as `Redacted`.
 */
import { Config, Effect, Layer, Redacted } from "effect"
import { ConfigError, redactUrls } from "./Errors.ts"

/** A URL as text, whether given plainly or `Redacted` (what `Config.Redacted("DATABASE_URL")` gives). */
export const urlText = (url: string | Redacted.Redacted<string>): string =>
  Redacted.isRedacted(url) ? Redacted.value(url) : url

/**
 * Reads `config` (each field a `Config`, or one `Config` of the whole), then
 * builds `layer` from it. A setting that is missing or malformed fails the
 * layer with txbox's `ConfigError`, naming it.
 */
export const fromConfig = <C, A, E>(
  config: Config.Wrap<C>,
  layer: (config: C) => Layer.Layer<A, E>,
): Layer.Layer<A, E | ConfigError> =>
  Layer.unwrap(
    Config.unwrap(config).pipe(
      Effect.mapError((error) => new ConfigError({ reason: `configuration: ${redactUrls(error.message)}` })),
      Effect.map(layer),
    ),
  )
