// A producing service in a process of its own (for bench/e2e.ts and bench/cost.ts): business
// transactions on a Kysely over node-postgres (`pg`, txbox's default driver), each `BEGIN; INSERT
// INTO orders …; [Outbox.enqueue …;] COMMIT`, at an offered rate or flat out; mode "hand" is the
// hand-written outbox's transaction instead (support/hand.ts: plain SQL on the same `pg` pool, the
// row into `hand.outbox`). Driven over stdio: prints {"event":"ready"} once connected; a JSON command line
//   {"cmd":"run","run":1,"mode":"enqueue"|"order-only"|"hand","rate":250,"seconds":12.5}
// ("enqueue": the order and Outbox.enqueue in `Outbox.transaction` on the `pg` pool, the event's row
// going with the COMMIT; "enqueue-kysely": the same on a Kysely, as the README's quickstart)
// runs for `seconds` (rate 0 = flat out: CONNECTIONS loops back to back; else transactions started
// on a steady schedule, at most CONNECTIONS in flight, a producer that falls behind catching up as
// fast as it can) and then prints {"event":"done","run":1,"transactions":n,"errors":n,"p50":ms,"p99":ms}
// (transaction times, BEGIN to COMMIT acknowledged). The order row carries the run and the message's
// serial (INDEX + PROCESSES × k, unique across processes and runs): the bench joins it to the
// handler's row and reads both commit times from the database.
//
// env: DB_URL, CONNECTIONS (default 8), INDEX (default 0), PROCESSES (default 1),
//      KEYED ("1": partitionKey = the order id, a key per order: the worst case of the keyed path),
//      BENCH_OWN_TRANSACTION ("1": mode "enqueue" calls Outbox.enqueue in the hand-written producer's
//      own BEGIN … COMMIT instead, a round trip more: what enqueue costs without Outbox.transaction),
//      BENCH_RAW_ENQUEUE ("1", a diagnosis knob: mode "enqueue" sends the row Outbox.enqueue would
//      write as the same SQL text from this process, with no library code and no wake-up check; what
//      the producer's CPU then is splits txbox's statement from txbox's code)
import { Effect } from "effect"
import { CompiledQuery, Kysely, PostgresDialect } from "kysely"
import pg from "pg"
import { uuidv7 } from "../../src/core/uuid.ts"
import * as Outbox from "../../src/Outbox.ts"
import { onCommands } from "./childIo.ts"
import { handTransaction, insertOrder, inTransaction, ORDER_INSERT } from "./hand.ts"
import { makePayload, OrderPlaced } from "./payload.ts"

const env = (name: string, fallback?: string): string => {
  const value = process.env[name] ?? fallback
  if (value === undefined) throw new Error(`${name} is required`)
  return value
}
const emit = (event: Record<string, unknown>) => {
  process.stdout.write(`${JSON.stringify(event)}\n`)
}

const connections = Number(env("CONNECTIONS", "8"))
const index = Number(env("INDEX", "0"))
const processes = Number(env("PROCESSES", "1"))
const keyed = env("KEYED", "0") === "1"
const rawEnqueue = env("BENCH_RAW_ENQUEUE", "0") === "1"
const ownTransaction = env("BENCH_OWN_TRANSACTION", "0") === "1"
// The bare statement numbers no key: with KEYED it would measure a different row, not the same one.
if (rawEnqueue && keyed) throw new Error("BENCH_RAW_ENQUEUE=1 writes unkeyed rows only; unset KEYED")
/** Outbox.enqueue's statement for a row with nothing but defaults beyond these (storage/sql/enqueue.ts's `plain`; keep in step). */
const RAW_ENQUEUE =
  'INSERT INTO "txbox".outbox (id, type, version, payload, headers) VALUES ($1, $2, $3, $4::text::jsonb, $5::text::jsonb)'
const pool = new pg.Pool({ connectionString: env("DB_URL"), max: connections })
// biome-ignore lint/suspicious/noExplicitAny: the bench's own table
const db = new Kysely<any>({ dialect: new PostgresDialect({ pool }) })

interface RunCommand {
  readonly cmd: "run"
  readonly run: number
  readonly mode: "enqueue" | "enqueue-kysely" | "order-only" | "hand"
  /** Transactions per second of this process; 0 = flat out. */
  readonly rate: number
  readonly seconds: number
}

let k = 0
const nextSerial = () => index + processes * k++

const transaction = async (command: RunCommand): Promise<void> => {
  const payload = makePayload(nextSerial())
  if (command.mode === "hand") return handTransaction(pool, payload, command.run)
  if (command.mode === "enqueue") return clientTransaction(payload, command.run)
  const order = CompiledQuery.raw(ORDER_INSERT, [
    payload.orderId,
    payload.customerId,
    payload.total,
    payload.serial,
    command.run,
  ])
  if (command.mode === "order-only") {
    await db.transaction().execute((trx) => trx.executeQuery(order))
    return
  }
  // The order as SQL text through the transaction, the same statement the hand-written producer
  // sends: bench/cost.ts compares what the outbox costs, not Kysely's query builder (bench/builder.ts).
  await Effect.runPromise(
    Outbox.transaction(db, (trx) =>
      Effect.andThen(
        Effect.tryPromise(() => trx.executeQuery(order)),
        Outbox.enqueue(trx, OrderPlaced, payload, keyed ? { partitionKey: payload.orderId } : undefined),
      ),
    ),
  )
}

/**
 * Mode "enqueue": the hand-written producer's transaction (support/hand.ts) in `Outbox.transaction`,
 * with `Outbox.enqueue` in place of its outbox INSERT, so the two differ by the outbox alone.
 */
const clientTransaction = (payload: OrderPlaced, run: number): Promise<void> => {
  const options = keyed ? { partitionKey: payload.orderId } : undefined
  if (!rawEnqueue && !ownTransaction)
    return Effect.runPromise(
      Outbox.transaction(pool, (client) =>
        Effect.andThen(
          Effect.tryPromise(() => insertOrder(client, payload, run)),
          Outbox.enqueue(client, OrderPlaced, payload, options),
        ),
      ),
    ).then(() => undefined)
  return inTransaction(pool, async (client) => {
    await insertOrder(client, payload, run)
    if (rawEnqueue) {
      await client.query(RAW_ENQUEUE, [
        uuidv7(),
        OrderPlaced.type,
        OrderPlaced.version,
        JSON.stringify(payload),
        "{}",
      ])
      return
    }
    await Effect.runPromise(Outbox.enqueue(client, OrderPlaced, payload, options))
  })
}

const percentile = (sorted: ReadonlyArray<number>, q: number) =>
  sorted.length === 0
    ? 0
    : sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((q / 100) * sorted.length) - 1))]!

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

const execute = async (command: RunCommand) => {
  const times: number[] = []
  let errors = 0
  let firstError: string | undefined
  const one = async () => {
    const started = performance.now()
    try {
      await transaction(command)
      times.push(performance.now() - started)
    } catch (error) {
      errors++
      firstError ??= error instanceof Error ? error.message : String(error)
    }
  }
  const started = performance.now()
  const end = started + command.seconds * 1000
  if (command.rate <= 0) {
    await Promise.all(
      Array.from({ length: connections }, async () => {
        while (performance.now() < end) await one()
      }),
    )
  } else {
    const inFlight = new Set<Promise<void>>()
    let issued = 0
    for (let now = performance.now(); now < end; now = performance.now()) {
      const due = Math.floor(((now - started) / 1000) * command.rate)
      while (issued < due && inFlight.size < connections) {
        issued++
        const p: Promise<void> = one().finally(() => inFlight.delete(p))
        inFlight.add(p)
      }
      // Behind and every connection busy: go on when one is free. Else sleep until the next one is
      // due (a 1 ms tick would cost this process a few % of a core at any rate).
      if (issued < due) await Promise.race(inFlight)
      else await sleep(Math.max(1, started + ((issued + 1) / command.rate) * 1000 - performance.now()))
    }
    await Promise.all(inFlight)
  }
  times.sort((a, b) => a - b)
  emit({
    event: "done",
    run: command.run,
    transactions: times.length,
    errors,
    ...(firstError === undefined ? {} : { firstError }),
    p50: percentile(times, 50),
    p99: percentile(times, 99),
    seconds: (performance.now() - started) / 1000,
  })
}

let stopping = false
const stop = async () => {
  if (stopping) return
  stopping = true
  await db.destroy().catch(() => {})
  process.exit(0)
}
let queue = Promise.resolve()
onCommands((line) => {
  if (!line.startsWith("{")) return
  const command = JSON.parse(line) as RunCommand
  queue = queue.then(() => execute(command))
}, stop)
// Connect every pooled connection before saying ready, so the first run does not pay for it.
await Promise.all(
  Array.from({ length: connections }, async () => {
    const client = await pool.connect()
    await sleep(50)
    client.release()
  }),
)
emit({ event: "ready" })
