/**
 * `txbox asyncapi --module ./contracts.ts [--consumer billing=orders.order-placed] [--out asyncapi.json]`:
 * the AsyncAPI 3.0 document of a module's contracts (see contracts/asyncapi.ts), as JSON.
 */
import { writeFileSync } from "node:fs"
import { Effect, Option } from "effect"
import { Command, Flag } from "effect/cli"
import { asyncApiDocument } from "../contracts/asyncapi.ts"
import { loadContracts, valibotConverter } from "./contractModule.ts"
import { UsageError } from "./errors.ts"
import { print } from "./output.ts"

const text = (name: string, description: string) =>
  Flag.String(name).pipe(Flag.withDescription(description), Flag.optional)

const CONSUMER = /^([A-Za-z0-9][A-Za-z0-9._-]*)(?:=(.+))?$/

/** `billing` (every type of the module) or `billing=orders.order-placed,orders.order-paid`. */
export const parseConsumer = (
  value: string,
): { readonly name: string; readonly types?: ReadonlyArray<string> } => {
  const match = CONSUMER.exec(value.trim())
  if (!match) {
    throw new UsageError({
      reason: `--consumer ${JSON.stringify(value)} is not NAME or NAME=type,type (e.g. billing=orders.order-placed)`,
    })
  }
  const types = match[2]
    ?.split(",")
    .map((t) => t.trim())
    .filter((t) => t !== "")
  return types === undefined ? { name: match[1]! } : { name: match[1]!, types }
}

export const command = Command.make(
  "asyncapi",
  {
    module: Flag.String("module").pipe(Flag.withDescription("the module exporting the contracts")),
    consumer: Flag.String("consumer").pipe(
      Flag.withDescription(
        "an inbox consumer and its queue: NAME (every type) or NAME=type,type; repeatable",
      ),
      Flag.atLeast(0),
    ),
    exchange: Flag.String("exchange").pipe(
      Flag.withDescription("the topic exchange (default: txbox.events)"),
      Flag.withDefault("txbox.events"),
    ),
    source: text("source", "the CloudEvents source producers set (default: txbox)"),
    server: text("server", "the broker, e.g. amqp://rabbitmq:5672 (credentials are dropped)"),
    title: text("title", "info.title (default: txbox contracts)"),
    apiVersion: text("api-version", "info.version: your API's version (default: 1.0.0)"),
    out: text("out", "write the document to this file instead of stdout"),
  },
  (flags) =>
    Effect.gen(function* () {
      const consumers = yield* Effect.try({
        try: () => flags.consumer.map(parseConsumer),
        catch: (error) => error as UsageError,
      })
      const get = Option.getOrUndefined
      const toJsonSchema = yield* valibotConverter
      const source = get(flags.source)
      const server = get(flags.server)
      const title = get(flags.title)
      const version = get(flags.apiVersion)
      const document = yield* asyncApiDocument(yield* loadContracts(flags.module), {
        exchange: flags.exchange,
        consumers,
        ...(source === undefined ? {} : { source }),
        ...(server === undefined ? {} : { server }),
        ...(title === undefined ? {} : { title }),
        ...(version === undefined ? {} : { version }),
        ...(toJsonSchema === undefined ? {} : { toJsonSchema }),
      })
      const json = JSON.stringify(document, null, 2)
      const out = get(flags.out)
      if (out === undefined) return yield* print(json)
      yield* Effect.try({
        try: () => writeFileSync(out, `${json}\n`),
        catch: (error) =>
          new UsageError({
            reason: `cannot write ${out}: ${error instanceof Error ? error.message : String(error)}`,
          }),
      })
      const { messages } = document.components as { readonly messages: Record<string, unknown> }
      const n = Object.keys(messages).length
      yield* print(`wrote ${out}: AsyncAPI 3.0.0, ${n} message${n === 1 ? "" : "s"}`)
    }),
).pipe(
  Command.withDescription(
    "Write an AsyncAPI 3.0 document for a module's contracts: channels (exchange routing keys, consumer queues), messages with payload JSON Schema and CloudEvents headers",
  ),
  Command.withShortDescription("AsyncAPI document of a module's contracts"),
)
