/**
 * The `AmqpTransport` namespace of `txbox/amqp`: the transport's `make` and
 * `layer`, and `layerConfig`, which reads the same settings through Effect's
 * `Config` (the broker URL as a `Redacted`).
 */
import type { Config, Layer, Redacted } from "effect"
import type { ConfigError, TransportError } from "./Errors.ts"
import { fromConfig, urlText } from "./layerConfig.ts"
import type { Transport } from "./ports/Transport.ts"
import { layer } from "./transport/amqp/AmqpTransport.ts"
import type { AmqpTransportConfig } from "./transport/amqp/config.ts"

export * from "./transport/amqp/AmqpTransport.ts"

/** `AmqpTransportConfig` with the URL as a string or a `Redacted`. */
export interface AmqpTransportSettings extends Omit<AmqpTransportConfig, "url"> {
  /** Broker URL, `amqp://user:pass@host:5672/vhost` (or `amqps://`); a `Redacted` keeps it out of logs. */
  readonly url: string | Redacted.Redacted<string>
}

/**
 * `layer`, its settings read through Effect's `Config`:
 * `AmqpTransport.layerConfig({ url: Config.Redacted("AMQP_URL") })`.
 */
export const layerConfig = (
  config: Config.Wrap<AmqpTransportSettings>,
): Layer.Layer<Transport, TransportError | ConfigError> =>
  fromConfig(config, (settings: AmqpTransportSettings) => layer({ ...settings, url: urlText(settings.url) }))
