// A relay process for the soak, wired as in the README quickstart with the library's defaults.
// env: DB_URL, AMQP_URL (one URL, or a cluster's, comma-separated), EXCHANGE, DRIVER (unset = the library's default driver),
// RELAY_WORKERS (unset = the library's default), RELAY_SOURCE (wal: the relay reads the WAL, WalLog on DB_URL)
// SIGTERM stops it gracefully and exits 0; the orchestrator also SIGKILLs it as a fault.
import { Effect, Layer } from "effect"
import { AmqpTransport } from "../../src/amqp.ts"
import { Relay } from "../../src/index.ts"
import { WalLog } from "../../src/pg.ts"
import { announce, brokerUrls, required, runUntilSigterm, storeLayer } from "./child.ts"

const wal = process.env.RELAY_SOURCE === "wal"
const infra = Layer.mergeAll(
  storeLayer(),
  wal ? WalLog.layer({ url: required("DB_URL") }) : Layer.empty,
  // The exchange is named per run only to isolate runs sharing a broker; it changes no behaviour.
  AmqpTransport.layer({ ...brokerUrls(), exchange: required("EXCHANGE") }),
)

// No options at all: lease (30 s), poll interval, batch size, retries and outage backoff are the
// defaults, because the soak's point is that the default configuration rides out the faults. Only
// the per-key order run asks for more workers than the default one.
const workers = process.env.RELAY_WORKERS === undefined ? undefined : Number(process.env.RELAY_WORKERS)
const program = Effect.scoped(
  Effect.gen(function* () {
    yield* Relay.make({
      ...(workers === undefined ? {} : { workers }),
      ...(wal ? { source: "wal" as const } : {}),
    })
    announce("relay started")
    return yield* Effect.never
  }),
).pipe(Effect.provide(infra))

await runUntilSigterm("relay", program)
