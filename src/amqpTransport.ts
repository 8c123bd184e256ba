/**
 * The `AmqpTransport` namespace of `txbox/amqp`: the transport's `make` and
 * `layer`, and `layerConfig`, which reads the same settings through Effect's
 * `Config` (the broker URLs as `Redacted`).
 */
import type { Config, Layer, Redacted } from "effect"
import type { ConfigError, TransportError } from "./Errors.ts"
import { fromConfig, urlText } from "./layerConfig.ts"
import type { Transport } from "./ports/Transport.ts"
import { layer } from "./transport/amqp/AmqpTransport.ts"
import type { AmqpTransportConfig, AmqpTransportOptions } from "./transport/amqp/config.ts"

export * from "./transport/amqp/AmqpTransport.ts"

/** `AmqpTransportConfig` with each URL as a string or a `Redacted`. */
export type AmqpTransportSettings = AmqpTransportOptions &
  (
    | {
        /** Broker URL, `amqp://user:pass@host:5672/vhost` (or `amqps://`); a `Redacted` keeps it out of logs. */
        readonly url: string | Redacted.Redacted<string>
        readonly urls?: undefined
      }
    | {
        /** A cluster's node URLs (see `AmqpTransportConfig`), e.g. `Config.Array(Schema.RedactedFromValue(Schema.String), "AMQP_URLS")` reads a comma-separated list. */
        readonly urls: ReadonlyArray<string | Redacted.Redacted<string>>
        readonly url?: undefined
      }
  )

/** The plain config of `settings`: URLs as text. */
const plain = (settings: AmqpTransportSettings): AmqpTransportConfig =>
  settings.urls === undefined
    ? { ...settings, url: urlText(settings.url) }
    : { ...settings, urls: settings.urls.map(urlText) }

/**
 * `layer`, its settings read through Effect's `Config`:
 * `AmqpTransport.layerConfig({ url: Config.Redacted("AMQP_URL") })`.
 */
export const layerConfig = (
  config: Config.Wrap<AmqpTransportSettings>,
): Layer.Layer<Transport, TransportError | ConfigError> =>
  fromConfig(config, (settings: AmqpTransportSettings) => layer(plain(settings)))
