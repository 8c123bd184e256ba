// An inbox consumer process for the soak: its handlers write one `effects` row per applied event,
// in the inbox's transaction. Default options, except the hook that makes a lost ack on demand.
// env: DB_URL, AMQP_URL (one URL, or a cluster's, comma-separated), EXCHANGE, CONSUMER, TYPES (the event types it handles, comma-separated:
//   its queue is bound to those only), DRIVER (unset = default), MODE (idempotent |
//   store-then-process; unset = the library's default, idempotent), LOST_ACK_FRACTION (0..1: the
//   share of deliveries after whose commit the process SIGKILLs itself, before the ack),
//   HANDLER_FAILURE_FRACTION (0..1, default 0.05: the share of handler runs that fail and are retried).
// SIGUSR2 arms one lost ack: the process SIGKILLs itself right after its next commit.
// SIGTERM stops it gracefully and exits 0.
import { Effect, Layer } from "effect"
import { AmqpTransport } from "../../src/amqp.ts"
import { type Delivery, Inbox } from "../../src/index.ts"
import { announce, brokerUrls, logLine, required, runUntilSigterm, storeLayer } from "./child.ts"
import { CONTRACTS, type SoakType } from "./contract.ts"

const consumer = required("CONSUMER")
const types = required("TYPES").split(",")
for (const type of types) if (!(type in CONTRACTS)) throw new Error(`TYPES: unknown event type ${type}`)
const mode = process.env.MODE
if (mode !== undefined && mode !== "idempotent" && mode !== "store-then-process") {
  throw new Error(`MODE must be idempotent or store-then-process, got ${mode}`)
}
const lostAckFraction = Number(process.env.LOST_ACK_FRACTION ?? "0")
// The share of handler runs that fail (and are retried): a flaky downstream, the usual kind.
const failureFraction = Number(process.env.HANDLER_FAILURE_FRACTION ?? "0.05")

let armed = false
process.on("SIGUSR2", () => {
  armed = true
  logLine("lost-ack armed: SIGKILL after the next commit")
})

// Runs after the inbox transaction committed and before the broker ack: dying here is exactly a
// lost ack, and the broker must redeliver a message whose effect is already in the table.
const afterCommit = (delivery: Delivery) =>
  Effect.sync(() => {
    if (armed || (lostAckFraction > 0 && Math.random() < lostAckFraction)) {
      logLine(`lost-ack: SIGKILL after the commit of ${delivery.messageId}, before its ack`)
      process.kill(process.pid, "SIGKILL")
    }
  })

const infra = Layer.mergeAll(
  storeLayer(),
  AmqpTransport.layer({ ...brokerUrls(), exchange: required("EXCHANGE") }),
)

const program = Effect.scoped(
  Effect.gen(function* () {
    yield* Inbox.make({
      consumer,
      ...(mode === undefined ? {} : { mode }),
      handlers: types.map((type) =>
        Inbox.handler(CONTRACTS[type as SoakType], ({ payload, envelope, trx }) =>
          Effect.tryPromise(() => {
            // One line per handler run, so that the report can trace a lost, duplicated or late
            // message through the consumers' logs (did a handler ever see it, how often, on which
            // attempt, where in its key, and whether this run failed on purpose).
            const fails = Math.random() < failureFraction
            const at = envelope.position
            logLine(
              `handle ${envelope.id} attempt ${envelope.attempt}` +
                (at === undefined
                  ? ""
                  : ` key ${envelope.partitionKey} seq ${at.seq} after ${at.after ?? "-"}`) +
                (fails ? " (fails: injected)" : ""),
            )
            if (fails) throw new Error("injected handler failure (retried)")
            return trx
              .insertInto("effects")
              .values({
                order_id: payload.orderId,
                type,
                consumer,
                message_id: envelope.id,
                pid: process.pid,
              })
              .execute()
          }),
        ),
      ),
      afterCommit,
    })
    // Ready once the queue is declared and bound (or, when the broker is away at start, once its
    // subscription was handed to the background): publishes from now on reach it.
    announce("consumer started")
    return yield* Effect.never
  }),
).pipe(Effect.provide(infra))

await runUntilSigterm(`consumer ${consumer}`, program)
