// The end-to-end smoke scenario shared by the runtime suites: enqueue in the caller's transaction →
// relay to RabbitMQ → inbox handler, on real PostgreSQL and RabbitMQ. Plain JavaScript, importing
// no driver, so that every runtime loads it as it is, and a fresh project that installed one driver
// runs it: each suite passes in txbox's modules the way that runtime gets them (Node: the built
// package by its name; Deno: the npm package, or the JSR entry through an import map; Bun: the
// sources) and the app side (its own Kysely, and an admin connection) built on its driver.
import assert from "node:assert/strict"
import { randomBytes, randomUUID } from "node:crypto"
import { Effect, Layer } from "effect"
import { Kysely, PostgresDialect, sql } from "kysely"
import * as v from "valibot"

/** @param {"TXBOX_TEST_DATABASE_URL" | "TXBOX_TEST_AMQP_URL"} name */
const fromEnv = (name) => {
  const value = process.env[name]
  if (!value) {
    throw new Error(
      `${name} is not set: run through \`bun scripts/with-services.ts\` (npm run test:runtimes)`,
    )
  }
  return value
}

// A scenario takes a second or two; one still running after this is a hang (a pool that never
// ends, say), reported as a failure instead of holding the suite until CI's own limit.
const SCENARIO_DEADLINE_MS = 120_000

/** `work`, or a failure naming `what` once SCENARIO_DEADLINE_MS passed without it settling. */
const withinDeadline = async (what, work) => {
  let timer
  const deadline = new Promise((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`${what} did not finish within ${SCENARIO_DEADLINE_MS} ms`)),
      SCENARIO_DEADLINE_MS,
    )
  })
  try {
    return await Promise.race([work, deadline])
  } finally {
    clearTimeout(timer)
  }
}

const unique = (prefix) => `${prefix}_${Date.now().toString(36)}_${randomBytes(4).toString("hex")}`

/** Polls `check` until it returns true; fails naming `what` after `timeoutMs`. */
const eventually = async (what, check, timeoutMs = 30_000) => {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (await check()) return
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for: ${what}`)
}

/**
 * The app side on node-postgres: its own Kysely, and one-off admin statements.
 * @param {any} pg the `pg` module as the runtime imports it
 */
export const pgApp = (pg) => ({
  kysely: (url) => {
    const pool = new pg.Pool({ connectionString: url, max: 2 })
    // As node-postgres asks of every app: an idle client whose backend goes away (here: the test's
    // DROP DATABASE … WITH (FORCE) racing the pool's own shutdown) emits 'error' on the pool, and
    // unheard that ends the process (seen once in ~40 runs).
    pool.on("error", () => {})
    return new Kysely({ dialect: new PostgresDialect({ pool }) })
  },
  admin: async (server, statement) => {
    const client = new pg.Client({ connectionString: server })
    await client.connect()
    try {
      await client.query(statement)
    } finally {
      await client.end()
    }
  },
})

/**
 * The app side on postgres.js, its Kysely on txbox's `PostgresJsDialect`.
 * @param {any} postgres the `postgres` module's default export
 * @param {any} PostgresJsDialect from `txbox/postgres-js`
 */
export const postgresJsApp = (postgres, PostgresJsDialect) => ({
  kysely: (url) =>
    new Kysely({
      dialect: new PostgresJsDialect({ postgres: postgres(url, { max: 2, onnotice: () => {} }) }),
    }),
  admin: async (server, statement) => {
    const client = postgres(server, { max: 1, onnotice: () => {} })
    try {
      await client.unsafe(statement)
    } finally {
      await client.end()
    }
  },
})

/**
 * Runs `body` against a database of its own, created on the test server and migrated through the
 * package's own `migrate`, with an `orders`/`invoices` pair as the service's tables. The database is
 * dropped after, with its connections cut.
 */
const withDatabase = async (modules, app, body) => {
  const server = fromEnv("TXBOX_TEST_DATABASE_URL")
  const name = unique("txbox_smoke")
  await app.admin(server, `CREATE DATABASE "${name}"`)
  const url = new URL(server)
  url.pathname = `/${name}`
  const db = app.kysely(url.href)
  try {
    const { applied } = await Effect.runPromise(modules.migrate(db))
    assert.ok(applied.length > 0, "migrate applied the schema to an empty database")
    await sql`CREATE TABLE orders (id uuid PRIMARY KEY, total numeric NOT NULL)`.execute(db)
    await sql`CREATE TABLE invoices (order_id uuid PRIMARY KEY, total numeric NOT NULL)`.execute(db)
    return await body({ url: url.href, db })
  } finally {
    await db.destroy()
    await app.admin(server, `DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`)
  }
}

const orderPlaced = (modules) =>
  modules.txbox.defineEvent({
    type: "smoke.order-placed",
    version: 1,
    schema: v.object({ orderId: v.pipe(v.string(), v.uuid()), total: v.number() }),
  })

/** What the database says happened to one order's event: counted from the tables, not from txbox. */
const assertDelivered = async (db, { orderId, messageId, consumer }) => {
  await eventually("the inbox handler wrote the invoice", async () => {
    const { rows } = await sql`SELECT count(*)::int AS n FROM invoices`.execute(db)
    return rows[0].n === 1
  })
  const invoices = await sql`SELECT order_id, total::float8 AS total FROM invoices`.execute(db)
  assert.deepEqual(invoices.rows, [{ order_id: orderId, total: 42.5 }])
  await eventually("the relay marked the outbox row sent", async () => {
    const { rows } = await sql`SELECT status FROM txbox.outbox WHERE id = ${messageId}`.execute(db)
    return rows[0]?.status === "sent"
  })
  const inbox = await sql`SELECT message_id, consumer, status FROM txbox.inbox`.execute(db)
  assert.deepEqual(inbox.rows, [{ message_id: messageId, consumer, status: "processed" }])
}

const transport = (modules) =>
  modules.amqp.AmqpTransport.layer({ url: fromEnv("TXBOX_TEST_AMQP_URL"), exchange: unique("smoke") })

/**
 * The order and its event in one of the service's own Kysely transactions, in this process.
 * @returns {Promise<{ id: string }>} the outbox row written
 */
const writeHere = ({ modules, db, orderId }) =>
  db.transaction().execute(async (trx) => {
    await trx.insertInto("orders").values({ id: orderId, total: 42.5 }).execute()
    return Effect.runPromise(
      modules.txbox.Outbox.enqueue(
        trx,
        orderPlaced(modules),
        { orderId, total: 42.5 },
        { partitionKey: orderId },
      ),
    )
  })

/**
 * The Effect API: `Inbox.make` and `Relay.make` in one scope over the store `store({ url, db })`
 * gives and `AmqpTransport.layer`, `Outbox.enqueue` inside the service's own Kysely transaction —
 * here, or wherever `write` runs it (an edge worker) — writing order `orderId`, total 42.5, event
 * type "smoke.order-placed" v1.
 * @param {{ txbox: any, amqp: any, migrate: any }} modules
 * @param {{ kysely: (url: string) => any, admin: (server: string, statement: string) => Promise<void> }} app
 * @param {(target: { url: string, db: any }) => any} store the store layer
 * @param {(target: { modules: any, url: string, db: any, orderId: string }) => Promise<{ id: string }>} [write]
 */
export const smokeEffect = (modules, app, store, write = writeHere) =>
  withinDeadline(
    "the Effect API scenario",
    withDatabase(modules, app, async ({ url, db }) => {
      const { Inbox, Relay } = modules.txbox
      const OrderPlaced = orderPlaced(modules)
      const consumer = unique("smoke-effect")
      const orderId = randomUUID()
      const infra = Layer.mergeAll(store({ url, db }), transport(modules))
      const program = Effect.gen(function* () {
        // The inbox first: its queue must be bound before the relay publishes, or the event is unroutable.
        yield* Inbox.make({
          consumer,
          handlers: [
            Inbox.handler(OrderPlaced, ({ payload, trx }) =>
              Effect.promise(() =>
                trx
                  .insertInto("invoices")
                  .values({ order_id: payload.orderId, total: payload.total })
                  .execute(),
              ),
            ),
          ],
        })
        yield* Relay.make({ pollInterval: "100 millis" })
        const written = yield* Effect.promise(() => write({ modules, url, db, orderId }))
        // Checked while the scope is open: closing it stops the relay and the inbox.
        yield* Effect.promise(() => assertDelivered(db, { orderId, messageId: written.id, consumer }))
      })
      await Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(infra)))
    }),
  )

/**
 * The Promise facade (`txbox/promise`): `createTxbox`, `start()`, `close()`.
 * @param {{ txbox: any, amqp: any, promise: any, migrate: any }} modules
 * @param {{ kysely: (url: string) => any, admin: (server: string, statement: string) => Promise<void> }} app
 * @param {(target: { url: string, db: any }) => any} store the store layer
 */
export const smokePromise = (modules, app, store) =>
  withinDeadline(
    "the Promise facade scenario",
    withDatabase(modules, app, async ({ url, db }) => {
      const OrderPlaced = orderPlaced(modules)
      const consumer = unique("smoke-promise")
      const orderId = randomUUID()
      const txbox = modules.promise.createTxbox({
        database: store({ url, db }),
        transport: transport(modules),
      })
      try {
        const inbox = txbox.inbox({
          consumer,
          handlers: [
            modules.promise.on(OrderPlaced, async ({ payload, trx }) => {
              await trx
                .insertInto("invoices")
                .values({ order_id: payload.orderId, total: payload.total })
                .execute()
            }),
          ],
        })
        await inbox.start()
        await txbox.relay({ pollInterval: "100 millis" }).start()
        const written = await db.transaction().execute(async (trx) => {
          await trx.insertInto("orders").values({ id: orderId, total: 42.5 }).execute()
          return txbox.enqueue(trx, OrderPlaced, { orderId, total: 42.5 }, { partitionKey: orderId })
        })
        await assertDelivered(db, { orderId, messageId: written.id, consumer })
      } finally {
        await txbox.close()
      }
    }),
  )
