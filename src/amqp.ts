/**
 * `txbox/amqp`: the RabbitMQ transport (amqplib). Provide
 * `AmqpTransport.layer({ url })` (or `{ urls }`, a cluster's nodes) wherever
 * the `Transport` port is needed.
 */
export type { AmqpTransportSettings } from "./amqpTransport.ts"
/** The RabbitMQ transport: `AmqpTransport.layer({ url })` provides the `Transport` port; `layerConfig` reads its settings through `Config`. */
export * as AmqpTransport from "./amqpTransport.ts"
export type {
  AmqpTransportConfig,
  AmqpTransportOptions,
  BrokerUrls,
  ReconnectPolicy,
} from "./transport/amqp/config.ts"
export { delayQueueName, queueName } from "./transport/amqp/subscriber.ts"
export {
  type ConsumerTopology,
  type DeclaredTopology,
  type DeclareTopologyOptions,
  declareTopology,
} from "./transport/amqp/topology.ts"
export { decodeDelivery, encodeMessage, Headers as AmqpHeaders } from "./transport/amqp/wire.ts"
