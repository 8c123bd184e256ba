/**
 * txbox, end to end, in one process:
 *
 *   orders service ──(order + OrderPlaced, one transaction)──▶ outbox ──relay──▶ broker
 *   broker ──(duplicates, lost acks)──▶ billing inbox ──(inbox row + invoice, one transaction)──▶ invoices
 *
 * The orders service places N orders; about 1 in 10 rolls back on purpose
 * (payment declined), taking its event with it. The relay publishes what
 * committed; halfway through the orders it is stopped and a new one takes
 * over. The broker delivers some messages twice and loses some acks, so the
 * billing consumer sees duplicates. At the end the database must show exactly
 * one invoice per committed order, none for a rolled-back one, and an empty
 * outbox: `exactly once: yes` (exit 0), otherwise `no` (exit 1).
 *
 * Run it:   npm run demo                       PGlite + the in-memory broker, no server needed
 *           npm run demo -- --orders 10000
 *           DATABASE_URL=postgres://… AMQP_URL=amqp://… npm run demo
 *                                              PostgreSQL and RabbitMQ instead (each URL on its own
 *                                              works too). The demo works in schemas `demo_shop` and
 *                                              `demo_txbox`, dropped at start, and purges its queue
 *                                              `txbox.demo-billing` on exchange `txbox.demo`.
 * Exit codes: 0 exactly once, 1 not, 2 bad arguments or an unreachable database or broker.
 *
 * In an application the imports below read `from "txbox"`, `from "txbox/pglite"`, and so on.
 */
import { parseArgs } from "node:util"
import { Cause, Data, Effect, Exit, Fiber, Layer, Logger, Schedule } from "effect"
import { type Kysely, sql, type Transaction } from "kysely"
import * as v from "valibot"
import {
  ConfigError,
  Database,
  defineEvent,
  Inbox,
  Outbox,
  Relay,
  StoreError,
  Transport,
  TransportError,
  type TransportShape,
  TxboxSchema,
  type TxboxStore,
} from "../src/index.ts"
import { migrate, PgliteStore } from "../src/pglite.ts"
import { MemoryTransport } from "../src/testing.ts"

// ── The contract, shared by the orders and billing services ───────────────────────────────────────

const OrderPlaced = defineEvent({
  type: "orders.order-placed",
  version: 1,
  schema: v.object({ orderId: v.pipe(v.string(), v.uuid()), totalCents: v.number() }),
})

// ── Options ──────────────────────────────────────────────────────────────────────────────────────

const SHOP = "demo_shop" // the services' own tables
const TXBOX = "demo_txbox" // txbox's outbox and inbox
const CONSUMER = "demo-billing"
const ROLLBACK_RATE = 0.1
const DUPLICATE_RATE = 0.2
const LOST_ACK_RATE = 0.05
const DEADLINE_MS = 120_000

/** The command line was wrong: say how to use it, exit 2. */
class UsageError {
  readonly message: string
  constructor(message: string) {
    this.message = message
  }
}

/** One of the demo's own statements failed; `what` says which. */
class QueryFailed extends Data.TaggedError("QueryFailed")<{
  readonly what: string
  readonly cause: unknown
}> {}

const parseOptions = (): { readonly orders: number } => {
  try {
    const { values } = parseArgs({ options: { orders: { type: "string", default: "2000" } } })
    const orders = Number(values.orders)
    if (!Number.isInteger(orders) || orders < 1 || orders > 1_000_000) throw new Error("--orders")
    return { orders }
  } catch {
    throw new UsageError("usage: bun demo/demo.ts [--orders N]   (N a whole number from 1 to 1000000)")
  }
}

// ── Where it runs: PGlite and the in-memory broker unless URLs say otherwise ────────────────────

interface Backend {
  readonly layer: Layer.Layer<TxboxStore | Transport, ConfigError | StoreError | TransportError>
  readonly label: string
  /** Clears what an earlier, interrupted run may have left on a real broker. */
  readonly purge: Effect.Effect<void>
}

const backend = async (): Promise<Backend> => {
  const databaseUrl = process.env.DATABASE_URL
  const amqpUrl = process.env.AMQP_URL

  // Drivers load only when asked for, so the embedded demo never touches postgres.js or amqplib.
  const database = databaseUrl
    ? (await import("../src/pg.ts")).PgStore.layer({
        url: databaseUrl,
        schema: TXBOX,
        connectTimeoutSeconds: 5,
      })
    : PgliteStore.layer({ schema: TXBOX })

  if (!amqpUrl) {
    const broker = MemoryTransport.layer({ duplicateRate: DUPLICATE_RATE, lostAckRate: LOST_ACK_RATE })
    return {
      layer: Layer.mergeAll(database, broker),
      label: `${databaseUrl ? "PostgreSQL" : "PGlite (in memory)"} + in-memory broker (${percent(DUPLICATE_RATE)} duplicate deliveries, ${percent(LOST_ACK_RATE)} lost acks)`,
      purge: Effect.void,
    }
  }
  const { AmqpTransport, queueName } = await import("../src/amqp.ts")
  const rabbit = Layer.effect(
    Transport,
    Effect.map(Transport, (transport) => replaying(transport, DUPLICATE_RATE)),
  ).pipe(Layer.provide(AmqpTransport.layer({ url: amqpUrl, exchange: "txbox.demo", failFast: true })))
  return {
    layer: Layer.mergeAll(database, rabbit),
    label: `${databaseUrl ? "PostgreSQL" : "PGlite (in memory)"} + RabbitMQ (${percent(DUPLICATE_RATE)} of deliveries replayed)`,
    purge: Effect.promise(async () => {
      const amqp = (await import("amqplib")).default
      const connection = await amqp.connect(amqpUrl)
      const channel = await connection.createChannel()
      await channel.purgeQueue(queueName(CONSUMER)).catch(() => undefined) // absent on a first run
      await connection.close().catch(() => undefined)
    }).pipe(Effect.ignore),
  }
}

/**
 * RabbitMQ redelivers only after real faults (a lost connection, a crash before the ack). To show
 * the inbox at work anyway, hand some deliveries to the consumer a second time, as a lost ack would.
 */
const replaying = (transport: TransportShape, rate: number): TransportShape => ({
  ...transport,
  subscribe: (options, handle) =>
    transport.subscribe(options, (delivery) =>
      Effect.tap(handle(delivery), (decision) =>
        decision._tag === "Ack" && Math.random() < rate
          ? handle({ ...delivery, redelivered: true })
          : Effect.void,
      ),
    ),
})

// ── The two services' tables ─────────────────────────────────────────────────────────────────────

interface Shop {
  orders: { id: string; total_cents: number }
  // No UNIQUE on order_id, on purpose: the inbox, not a constraint, is what keeps it at one.
  invoices: { order_id: string; amount_cents: number }
}
// biome-ignore lint/suspicious/noExplicitAny: the store's Kysely describes no tables of its own
const shop = (db: Kysely<any> | Transaction<any>) => (db as Kysely<Shop>).withSchema(SHOP)

const setUp = (db: Kysely<unknown>) =>
  Effect.gen(function* () {
    yield* query("set up the demo schemas", async () => {
      await sql`DROP SCHEMA IF EXISTS demo_shop CASCADE`.execute(db)
      await sql`DROP SCHEMA IF EXISTS demo_txbox CASCADE`.execute(db)
      await sql`CREATE SCHEMA demo_shop`.execute(db)
      await sql`CREATE TABLE demo_shop.orders (id uuid PRIMARY KEY, total_cents int NOT NULL)`.execute(db)
      await sql`CREATE TABLE demo_shop.invoices (
        id bigserial PRIMARY KEY, order_id uuid NOT NULL, amount_cents int NOT NULL)`.execute(db)
    })
    yield* migrate(db, { schema: TXBOX })
  })

// ── The orders service: the order and its event commit (or roll back) together ─────────────────

/** Payment declined after the event was written: the rollback takes the order and the event away. */
class Declined extends Data.TaggedError("Declined") {}

/**
 * Places one order; true when it committed, false when it rolled back. `Outbox.transaction` opens
 * the transaction and commits it, the event's row going to the database with the COMMIT.
 */
const placeOrder = (db: Kysely<unknown>) =>
  Outbox.transaction(db, (trx) =>
    Effect.gen(function* () {
      const order = { id: crypto.randomUUID(), total_cents: 1000 + Math.floor(Math.random() * 49_000) }
      yield* Effect.tryPromise(() => shop(trx).insertInto("orders").values(order).execute())
      yield* Outbox.enqueue(trx, OrderPlaced, { orderId: order.id, totalCents: order.total_cents })
      if (Math.random() < ROLLBACK_RATE) return yield* new Declined()
      return true
    }),
  ).pipe(
    Effect.provideService(TxboxSchema, TXBOX),
    Effect.catchTag("Declined", () => Effect.succeed(false)),
    Effect.mapError((cause) => new QueryFailed({ what: "place an order", cause })),
  )

// ── The billing service: one invoice per OrderPlaced, written in the inbox's transaction ────────

const billing = Inbox.handler(OrderPlaced, ({ payload, trx }) =>
  Effect.promise(() =>
    shop(trx)
      .insertInto("invoices")
      .values({ order_id: payload.orderId, amount_cents: payload.totalCents })
      .execute(),
  ),
)

// ── The run ──────────────────────────────────────────────────────────────────────────────────────

const run = (orders: number, label: string, purge: Effect.Effect<void>) =>
  Effect.gen(function* () {
    const { db } = yield* Database
    yield* setUp(db)
    yield* purge
    const inbox = yield* Inbox.make({ consumer: CONSUMER, handlers: [billing] })
    let relay = yield* Effect.forkChild(Relay.run())

    const counts = { placed: 0, rolledBack: 0 }
    const progress = yield* Effect.forkChild(
      Effect.repeat(
        Effect.flatMap(inbox.stats, (s) => Effect.sync(() => drawBar(orders, counts, s))),
        Schedule.spaced("100 millis"),
      ),
    )

    for (let i = 0; i < orders; i++) {
      // PGlite answers without a trip through the event loop, so a tight loop of transactions would
      // keep the relay and the consumer waiting until it ended. A service handling requests yields
      // between them; so does this one.
      yield* Effect.yieldNow
      if (i === Math.floor(orders / 2)) {
        // Stop the relay (it finishes the batch in flight) and start a new one: nothing is lost.
        yield* Fiber.interrupt(relay)
        relay = yield* Effect.forkChild(Relay.run())
      }
      if (yield* placeOrder(db)) counts.placed++
      else counts.rolledBack++
    }

    const settled = yield* waitUntilSettled(db, counts.placed, inbox.stats)
    yield* Fiber.interrupt(progress)
    drawBar(orders, counts, yield* inbox.stats)
    endBar()
    yield* Fiber.interrupt(relay)
    return yield* report(db, orders, counts, yield* inbox.stats, settled, label)
  })

/**
 * Done when the outbox is empty, every committed order is invoiced (or its message dead), and no
 * delivery has arrived for half a second: a late duplicate gets its chance to (wrongly) apply.
 */
const waitUntilSettled = (db: Kysely<unknown>, committed: number, stats: Effect.Effect<Inbox.InboxStats>) =>
  Effect.gen(function* () {
    const deadline = Date.now() + DEADLINE_MS
    let lastDelivered = -1
    let quietSince = Date.now()
    while (Date.now() < deadline) {
      const delivered = deliveredOf(yield* stats)
      if (delivered !== lastDelivered) {
        lastDelivered = delivered
        quietSince = Date.now()
      }
      const c = yield* query("check progress", async () => {
        const { rows } = await sql<{ pending: unknown; invoiced: unknown; dead: unknown }>`
          SELECT (SELECT count(*) FROM demo_txbox.outbox WHERE status = 'pending') AS pending,
                 (SELECT count(DISTINCT order_id) FROM demo_shop.invoices) AS invoiced,
                 (SELECT count(*) FROM demo_txbox.inbox WHERE status = 'dead') AS dead`.execute(db)
        return {
          pending: Number(rows[0]?.pending),
          handled: Number(rows[0]?.invoiced) + Number(rows[0]?.dead),
        }
      })
      if (c.pending === 0 && c.handled >= committed && Date.now() - quietSince > 500) return true
      yield* Effect.sleep("100 millis")
    }
    return false
  })

// ── The verdict, from the database ───────────────────────────────────────────────────────────────

const readCounts = (db: Kysely<unknown>) =>
  query("count rows", async () => {
    const n = async (q: ReturnType<typeof sql<{ n: unknown }>>) =>
      Number((await q.execute(db)).rows[0]?.n ?? 0)
    return {
      orders: await n(sql`SELECT count(*) AS n FROM demo_shop.orders`),
      invoices: await n(sql`SELECT count(*) AS n FROM demo_shop.invoices`),
      published: await n(sql`SELECT count(*) AS n FROM demo_txbox.outbox WHERE status = 'sent'`),
      pending: await n(sql`SELECT count(*) AS n FROM demo_txbox.outbox WHERE status = 'pending'`),
      dead: await n(sql`
        SELECT (SELECT count(*) FROM demo_txbox.outbox WHERE status = 'dead')
             + (SELECT count(*) FROM demo_txbox.inbox WHERE status = 'dead') AS n`),
      // Committed orders with no invoice, or with more than one.
      notOnce: await n(sql`
        SELECT count(*) AS n FROM demo_shop.orders o
        LEFT JOIN (SELECT order_id, count(*) AS k FROM demo_shop.invoices GROUP BY order_id) i ON i.order_id = o.id
        WHERE i.k IS DISTINCT FROM 1`),
      // Invoices whose order is not in the database: a rolled-back order that was billed anyway.
      orphans: await n(sql`
        SELECT count(*) AS n FROM demo_shop.invoices i
        WHERE NOT EXISTS (SELECT 1 FROM demo_shop.orders o WHERE o.id = i.order_id)`),
    }
  })

const report = (
  db: Kysely<unknown>,
  orders: number,
  counts: { readonly placed: number; readonly rolledBack: number },
  stats: Inbox.InboxStats,
  settled: boolean,
  label: string,
) =>
  Effect.gen(function* () {
    const c = yield* readCounts(db)
    const delivered = deliveredOf(stats)
    const rows: Array<[string, number, string?]> = [
      ["orders placed", orders],
      ["rolled back", counts.rolledBack, "payment declined: order and event gone together"],
      ["published", c.published, "relay restarted once, halfway"],
      ["delivered", delivered, `${stats.duplicates} of them duplicates`],
      ["applied", c.invoices, "invoices written by the billing inbox"],
      ["dead", c.dead],
    ]
    console.log(`\ntxbox demo on ${label}\n`)
    for (const [name, value, note] of rows) {
      console.log(`  ${name.padEnd(14)}${String(value).padStart(8)}${note ? `   ${note}` : ""}`)
    }
    const problems = [
      c.orders !== counts.placed && `${c.orders} orders in the database, ${counts.placed} committed`,
      c.notOnce > 0 && `${c.notOnce} committed orders without exactly one invoice`,
      c.orphans > 0 && `${c.orphans} invoices for orders that never committed`,
      c.pending > 0 && `${c.pending} outbox rows still pending`,
      c.dead > 0 && `${c.dead} dead messages`,
      !settled && `not settled within ${DEADLINE_MS / 1000} s`,
    ].filter((p): p is string => typeof p === "string")
    console.log("")
    for (const p of problems) console.log(`  ✗ ${p}`)
    console.log(`exactly once: ${problems.length === 0 ? "yes" : "no"}`)
    return problems.length === 0
  })

// ── Small helpers ────────────────────────────────────────────────────────────────────────────────

const query = <A>(what: string, f: () => Promise<A>) =>
  Effect.tryPromise({ try: f, catch: (cause) => new QueryFailed({ what, cause }) })

const deliveredOf = (s: Inbox.InboxStats) => s.processed + s.duplicates + s.retried + s.dead

const percent = (rate: number) => `${Math.round(rate * 100)} %`

let barShown = false

const drawBar = (
  orders: number,
  counts: { readonly placed: number; readonly rolledBack: number },
  s: Inbox.InboxStats,
) => {
  const width = 30
  const done = Math.min(1, (s.processed + counts.rolledBack) / orders)
  const filled = Math.round(done * width)
  barShown = true
  process.stderr.write(
    `\r[${"#".repeat(filled)}${"-".repeat(width - filled)}] ${String(Math.floor(done * 100)).padStart(3)} %` +
      `  placed ${counts.placed + counts.rolledBack}/${orders} · delivered ${deliveredOf(s)} · applied ${s.processed}  `,
  )
}

const endBar = () => {
  if (barShown) process.stderr.write("\n")
  barShown = false
}

/** One line, no credentials: the URLs' passwords are cut out of whatever a driver said. */
const oneLine = (text: string) => {
  let line = text.split("\n")[0] ?? ""
  for (const url of [process.env.DATABASE_URL, process.env.AMQP_URL]) {
    const password = url && URL.canParse(url) ? decodeURIComponent(new URL(url).password) : ""
    if (password) line = line.replaceAll(password, "***")
  }
  return line.replace(/([a-z][a-z0-9+.-]*:\/\/)[^@\s/]+@/gi, "$1***@")
}

const messageOf = (error: unknown): string => {
  if (!(error instanceof Error)) return String(error)
  // A refused connection to a name with several addresses can be an AggregateError with no message.
  const code = (error as { code?: unknown }).code
  return error.message || (typeof code === "string" ? code : error.name)
}

const describeFailure = (error: unknown): string => {
  const database = process.env.DATABASE_URL ? "PostgreSQL (DATABASE_URL)" : "PGlite"
  if (error instanceof QueryFailed) return `${database}: cannot ${error.what}: ${messageOf(error.cause)}`
  if (error instanceof StoreError) return `${database}: ${error.message}`
  if (error instanceof TransportError) return `RabbitMQ (AMQP_URL): ${error.message}`
  if (error instanceof ConfigError) return `configuration: ${error.message}`
  return messageOf(error)
}

// ── Entry point ──────────────────────────────────────────────────────────────────────────────────

const main = async (): Promise<number> => {
  let setup: { readonly orders: number; readonly backend: Backend }
  try {
    setup = { ...parseOptions(), backend: await backend() }
  } catch (error) {
    console.error(`demo: ${oneLine(error instanceof UsageError ? error.message : describeFailure(error))}`)
    return 2
  }
  const { orders, backend: b } = setup
  const exit = await Effect.runPromiseExit(
    run(orders, b.label, b.purge).pipe(
      Effect.scoped,
      Effect.provide(b.layer),
      // txbox's warnings (an outage, a retry) go to stderr with the progress bar; stdout keeps the table.
      Effect.provideService(Logger.LogToStderr, true),
    ),
  )
  if (Exit.isSuccess(exit)) return exit.value ? 0 : 1
  const failure = Cause.findError(exit.cause)
  const error = failure._tag === "Success" ? failure.success : Cause.squash(exit.cause)
  endBar()
  console.error(`demo: ${oneLine(describeFailure(error))}`)
  const environmental =
    error instanceof QueryFailed ||
    error instanceof StoreError ||
    error instanceof TransportError ||
    error instanceof ConfigError
  return environmental ? 2 : 1
}

process.exit(await main())
