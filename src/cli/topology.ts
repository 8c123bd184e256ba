/**
 * `txbox topology declare --consumer billing --type orders.order-placed [--type …]`: declares a
 * consumer's RabbitMQ topology ahead of time — exactly what its inbox declares when it subscribes
 * (transport/amqp/topology.ts) — so a producer deployed first publishes into a queue that waits.
 */
import { Effect, Option } from "effect"
import { Command, Flag } from "effect/cli"
import { declareTopology } from "../transport/amqp/topology.ts"
import { UsageError } from "./errors.ts"
import { jsonFlag } from "./options.ts"
import { print, printJson } from "./output.ts"

const describeArguments = (args: Readonly<Record<string, unknown>>): string =>
  Object.entries(args)
    .map(([k, v]) => `${k}=${v === "" ? '""' : String(v)}`)
    .join(" ")

const declare = Command.make(
  "declare",
  {
    url: Flag.String("url").pipe(
      Flag.withDescription(
        "RabbitMQ URL, amqp://user:pass@host:5672/vhost; repeat it for a cluster's nodes (the first that answers declares) (default: $AMQP_URL, comma-separated for several)",
      ),
      Flag.atLeast(0),
    ),
    exchange: Flag.String("exchange").pipe(
      Flag.withDescription("the topic exchange the relay publishes to (default: txbox.events)"),
      Flag.withDefault("txbox.events"),
    ),
    consumer: Flag.String("consumer").pipe(
      Flag.withDescription("the inbox consumer (Inbox.make({ consumer })): its queue is txbox.<consumer>"),
    ),
    type: Flag.String("type").pipe(
      Flag.withDescription("an event type the consumer handles, bound as a routing key; repeatable"),
      Flag.atLeast(1),
    ),
    queueType: Flag.Literals("queue-type", ["quorum", "classic"]).pipe(
      Flag.withDescription("x-queue-type, as the transport's queueType (default: quorum)"),
      Flag.optional,
    ),
    deliveryLimit: Flag.Int("delivery-limit").pipe(
      Flag.withDescription(
        "x-delivery-limit of a quorum queue, as the transport's deliveryLimit (default: 20)",
      ),
      Flag.optional,
    ),
    json: jsonFlag,
  },
  (flags) =>
    Effect.gen(function* () {
      const urls =
        flags.url.length > 0
          ? flags.url
          : (process.env.AMQP_URL ?? "")
              .split(",")
              .map((u) => u.trim())
              .filter((u) => u !== "")
      if (urls.length === 0) {
        return yield* new UsageError({ reason: "no broker URL: pass --url or set AMQP_URL" })
      }
      const queueType = Option.getOrUndefined(flags.queueType)
      const deliveryLimit = Option.getOrUndefined(flags.deliveryLimit)
      const declared = yield* declareTopology({
        ...(urls.length === 1 ? { url: urls[0]! } : { urls }),
        exchange: flags.exchange,
        consumer: flags.consumer,
        types: flags.type,
        ...(queueType === undefined ? {} : { queueType }),
        ...(deliveryLimit === undefined ? {} : { deliveryLimit }),
      })
      if (flags.json) return yield* printJson(declared)
      yield* print(`exchange ${declared.exchange} (topic, durable)`)
      yield* print(
        declared.legacyQueue
          ? `queue ${declared.queue}: exists without txbox's arguments, left as it is (see the README's Operations)`
          : `queue ${declared.queue} (durable): ${describeArguments(declared.queueArguments)}`,
      )
      yield* print(`queue ${declared.deadQueue} (durable): ${describeArguments(declared.deadQueueArguments)}`)
      yield* print(`bound ${declared.queue} to ${declared.exchange}: ${declared.bindings.join(", ")}`)
    }),
).pipe(
  Command.withDescription(
    "Declare a consumer's exchange, queue (with its delivery limit and dead-letter target), dead queue and bindings — exactly what its inbox declares when it subscribes — so the relay can publish before the consumer first runs. Idempotent.",
  ),
  Command.withShortDescription("declare a consumer's queues and bindings ahead of time"),
)

export const command = Command.make("topology").pipe(
  Command.withDescription("RabbitMQ topology: declare a consumer's queues and bindings ahead of time"),
  Command.withSubcommands([declare]),
)
