// Outbox.transaction on real PostgreSQL: the transaction txbox opens and commits, with the outbox rows
// of the enqueue calls in it written in the COMMIT's round trip. On a node-postgres pool and client
// and on a Kysely over postgres.js (PGlite, which takes one statement per call, in pglite.test.ts).
// Counts come from the tables; round trips from the statements the client was given.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect, Exit, Fiber } from "effect"
import { sql } from "kysely"
import pg from "pg"
import { StoreError } from "../../src/Errors.ts"
import * as Outbox from "../../src/Outbox.ts"
import type { SqlClient } from "../../src/ports/OutboxWriter.ts"
import { Note } from "../fixtures/contracts.ts"
import { type MigratedDatabase, migratedDatabase } from "../support/txbox.ts"

let t: MigratedDatabase
let pool: pg.Pool
beforeAll(async () => {
  t = await migratedDatabase("outbox_tx")
  pool = new pg.Pool({ connectionString: t.url, max: 2 })
})
afterAll(async () => {
  await pool.end()
  await t.close()
})

const outboxRow = async (id: string) =>
  (
    await sql<{
      type: string
      version: number
      payload: unknown
      headers: unknown
      status: string
    }>`SELECT type, version, payload, headers, status FROM txbox.outbox WHERE id = ${id}::uuid`.execute(t.db)
  ).rows[0]

const orderExists = async (id: string) =>
  (await sql<{ n: number }>`SELECT count(*)::int AS n FROM orders WHERE id = ${id}::uuid`.execute(t.db))
    .rows[0]!.n === 1

const insertOrder = (client: SqlClient, id: string) =>
  Effect.tryPromise(() => client.query("INSERT INTO orders (id, total) VALUES ($1, 10)", [id]))

/** A client that records every text it is asked to run: one entry per round trip. */
const recording = (client: pg.PoolClient) => {
  const texts: string[] = []
  const wrapped: SqlClient = {
    // biome-ignore lint/suspicious/noExplicitAny: node-postgres's own signature
    query: (text: string, values?: any[]) => {
      texts.push(text)
      return client.query(text, values)
    },
  }
  return { texts, client: wrapped }
}

describe("Outbox.transaction on a node-postgres pool", () => {
  test("the order and its event commit together; the row is written only with the COMMIT", async () => {
    const orderId = crypto.randomUUID()
    let seenInside: unknown = "not looked"
    const message = await Effect.runPromise(
      Outbox.transaction(pool, (client) =>
        Effect.gen(function* () {
          yield* insertOrder(client, orderId)
          const enqueued = yield* Outbox.enqueue(client, Note, { note: "it's a \\ 'quoted' note" })
          // Inside the transaction, on its own connection: not written yet.
          seenInside = (yield* Effect.tryPromise(() =>
            client.query("SELECT 1 FROM txbox.outbox WHERE id = $1", [enqueued.id]),
          )).rows[0]
          return enqueued
        }),
      ),
    )
    expect(seenInside).toBeUndefined()
    expect(await orderExists(orderId)).toBe(true)
    expect(await outboxRow(message.id)).toEqual({
      type: "test.note",
      version: 1,
      payload: { note: "it's a \\ 'quoted' note" },
      headers: {},
      status: "pending",
    })
    expect(pool.idleCount).toBe(pool.totalCount)
  })

  test("the body's failure rolls back the order and the event, and is the error the caller sees", async () => {
    const orderId = crypto.randomUUID()
    let id = ""
    const exit = await Effect.runPromiseExit(
      Outbox.transaction(pool, (client) =>
        Effect.gen(function* () {
          yield* insertOrder(client, orderId)
          id = (yield* Outbox.enqueue(client, Note, { note: "never" })).id
          return yield* Effect.fail("out of stock" as const)
        }),
      ),
    )
    expect(exit).toEqual(Exit.fail("out of stock"))
    expect(await orderExists(orderId)).toBe(false)
    expect(await outboxRow(id)).toBeUndefined()
  })

  test("a row the database refuses fails the commit as a StoreError, and nothing is committed", async () => {
    const messageId = crypto.randomUUID()
    await Effect.runPromise(
      Outbox.transaction(pool, (client) => Outbox.enqueue(client, Note, { note: "first" }, { messageId })),
    )
    const orderId = crypto.randomUUID()
    const exit = await Effect.runPromiseExit(
      Outbox.transaction(pool, (client) =>
        Effect.andThen(
          insertOrder(client, orderId),
          Outbox.enqueue(client, Note, { note: "again" }, { messageId }),
        ),
      ),
    )
    expect(Exit.isFailure(exit)).toBe(true)
    const error = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
    expect(error?._tag).toBe("Fail")
    const failure = (error as { error: unknown }).error
    expect(failure).toBeInstanceOf(StoreError)
    expect((failure as StoreError).reason).toBe("constraint")
    expect((failure as StoreError).operation).toBe("Outbox.transaction commit")
    expect(await orderExists(orderId)).toBe(false)
    expect(((await outboxRow(messageId)) as { payload: unknown }).payload).toEqual({ note: "first" })
    expect(pool.idleCount).toBe(pool.totalCount)
  })

  test("a body that caught a failed statement commits nothing, with or without events (StoreError aborted)", async () => {
    for (const enqueueToo of [false, true]) {
      const orderId = crypto.randomUUID()
      const exit = await Effect.runPromiseExit(
        Outbox.transaction(pool, (client) =>
          Effect.gen(function* () {
            yield* insertOrder(client, orderId)
            yield* Effect.ignore(Effect.tryPromise(() => client.query("SELECT * FROM no_such_table")))
            if (enqueueToo) yield* Outbox.enqueue(client, Note, { note: "after a caught failure" })
          }),
        ),
      )
      const failure = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: unknown }).error : undefined
      expect(failure).toBeInstanceOf(StoreError)
      expect((failure as StoreError).reason).toBe("aborted")
      expect(await orderExists(orderId)).toBe(false)
    }
  })

  test("interrupted in its body, the transaction rolls back and the connection goes back to the pool", async () => {
    const orderId = crypto.randomUUID()
    const fiber = Effect.runFork(
      Outbox.transaction(pool, (client) =>
        Effect.andThen(
          Effect.andThen(insertOrder(client, orderId), Outbox.enqueue(client, Note, { note: "interrupted" })),
          Effect.never,
        ),
      ),
    )
    await Bun.sleep(300)
    await Effect.runPromise(Fiber.interrupt(fiber))
    const deadline = Date.now() + 5_000
    while (pool.idleCount !== pool.totalCount && Date.now() < deadline) await Bun.sleep(20)
    expect(pool.idleCount).toBe(pool.totalCount)
    expect(await orderExists(orderId)).toBe(false)
  })
})

describe("Outbox.transaction when the connection is lost", () => {
  test("killed before the COMMIT: a connection StoreError, nothing committed, the pool drops that connection", async () => {
    const orderId = crypto.randomUUID()
    let id = ""
    let killed = 0
    const exit = await Effect.runPromiseExit(
      Outbox.transaction(pool, (client) =>
        Effect.gen(function* () {
          yield* insertOrder(client, orderId)
          id = (yield* Outbox.enqueue(client, Note, { note: "lost with its connection" })).id
          const pid = (yield* Effect.tryPromise(() => client.query("SELECT pg_backend_pid() AS pid"))).rows[0]
            .pid
          // Another session ends this one's backend: the INSERT + COMMIT that follows finds no server.
          yield* Effect.promise(() => sql`SELECT pg_terminate_backend(${pid}::int)`.execute(t.db))
          killed = pid
        }),
      ),
    )
    expect(killed).toBeGreaterThan(0)
    const failure = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: unknown }).error : undefined
    expect(failure).toBeInstanceOf(StoreError)
    expect((failure as StoreError).reason).toBe("connection")
    expect(await orderExists(orderId)).toBe(false)
    expect(await outboxRow(id)).toBeUndefined()
    // The next transaction gets a live connection.
    const next = await Effect.runPromise(
      Outbox.transaction(pool, (client) => Outbox.enqueue(client, Note, { note: "after the loss" })),
    )
    expect(((await outboxRow(next.id)) as { payload: unknown }).payload).toEqual({ note: "after the loss" })
  })
})

describe("Outbox.transaction on a client", () => {
  test("BEGIN, the business write, then the events with the COMMIT: three round trips, not four", async () => {
    const pooled = await pool.connect()
    try {
      const { texts, client } = recording(pooled)
      // The first transaction on a target asks once whether it takes two statements in one text.
      await Effect.runPromise(Outbox.transaction(client, () => Effect.void))
      texts.length = 0
      const orderId = crypto.randomUUID()
      const [one, two] = await Effect.runPromise(
        Outbox.transaction(client, (trx) =>
          Effect.andThen(
            insertOrder(trx, orderId),
            Outbox.enqueueMany(trx, [
              { contract: Note, payload: { note: "one" } },
              { contract: Note, payload: { note: "two" }, options: { headers: { tenant: "acme" } } },
            ]),
          ),
        ),
      )
      expect(texts.length).toBe(3)
      expect(texts[0]).toBe("BEGIN")
      expect(texts[2]).toContain('INSERT INTO "txbox".outbox')
      expect(texts[2]).toEndWith("COMMIT")
      expect(await orderExists(orderId)).toBe(true)
      expect(((await outboxRow(one!.id)) as { payload: unknown }).payload).toEqual({ note: "one" })
      expect(((await outboxRow(two!.id)) as { headers: unknown }).headers).toEqual({ tenant: "acme" })
    } finally {
      pooled.release()
    }
  })

  test("keyed events are numbered in their key's sequence with the COMMIT: two round trips (BEGIN, then the number, the row and COMMIT in one text)", async () => {
    const key = `k-${crypto.randomUUID()}`
    const ids: string[] = []
    const pooled = await pool.connect()
    try {
      const { texts, client } = recording(pooled)
      for (let i = 1; i <= 3; i++) {
        texts.length = 0
        const m = await Effect.runPromise(
          Outbox.transaction(client, (trx) =>
            Outbox.enqueue(trx, Note, { note: `${i}` }, { partitionKey: key }),
          ),
        )
        ids.push(m.id)
      }
      // The last transaction's texts (the first on the client also asked its one question).
      expect(texts.length).toBe(2)
      expect(texts[0]).toBe("BEGIN")
      expect(texts[1]).toContain("partition_counters")
      expect(texts[1]).toContain('INSERT INTO "txbox".outbox')
      expect(texts[1]).toEndWith("COMMIT")
    } finally {
      pooled.release()
    }
    const seqs = await sql<{
      partition_seq: string
    }>`SELECT partition_seq FROM txbox.outbox WHERE partition_key = ${key} ORDER BY partition_seq`.execute(
      t.db,
    )
    expect(seqs.rows.map((r) => Number(r.partition_seq))).toEqual([1, 2, 3])
  })
})

describe("Outbox.transaction on a Kysely (postgres.js)", () => {
  test("commits the business write and the events; a keyed one does not open a transaction of its own", async () => {
    const orderId = crypto.randomUUID()
    const key = `k-${crypto.randomUUID()}`
    const [plain, keyed] = await Effect.runPromise(
      Outbox.transaction(t.db, (trx) =>
        Effect.gen(function* () {
          yield* Effect.tryPromise(() => trx.insertInto("orders").values({ id: orderId, total: 5 }).execute())
          const a = yield* Outbox.enqueue(trx, Note, { note: "plain" })
          const b = yield* Outbox.enqueue(trx, Note, { note: "keyed" }, { partitionKey: key })
          return [a, b] as const
        }),
      ),
    )
    expect(await orderExists(orderId)).toBe(true)
    expect(((await outboxRow(plain.id)) as { payload: unknown }).payload).toEqual({ note: "plain" })
    expect(((await outboxRow(keyed.id)) as { payload: unknown }).payload).toEqual({ note: "keyed" })
  })

  test("interrupted in its body, the transaction rolls back: nothing committed, the connection free", async () => {
    const orderId = crypto.randomUUID()
    const fiber = Effect.runFork(
      Outbox.transaction(t.db, (trx) =>
        Effect.gen(function* () {
          yield* Effect.tryPromise(() => trx.insertInto("orders").values({ id: orderId, total: 5 }).execute())
          yield* Outbox.enqueue(trx, Note, { note: "interrupted" })
          return yield* Effect.never
        }),
      ),
    )
    await Bun.sleep(300)
    await Effect.runPromise(Fiber.interrupt(fiber))
    expect(await orderExists(orderId)).toBe(false)
    // The connection went back: the next transaction on the same Kysely commits.
    const next = await Effect.runPromise(
      Outbox.transaction(t.db, (trx) => Outbox.enqueue(trx, Note, { note: "next" })),
    )
    expect(((await outboxRow(next.id)) as { payload: unknown }).payload).toEqual({ note: "next" })
  })

  test("the body's failure rolls both back", async () => {
    const orderId = crypto.randomUUID()
    let id = ""
    const exit = await Effect.runPromiseExit(
      Outbox.transaction(t.db, (trx) =>
        Effect.gen(function* () {
          yield* Effect.tryPromise(() => trx.insertInto("orders").values({ id: orderId, total: 5 }).execute())
          id = (yield* Outbox.enqueue(trx, Note, { note: "never" })).id
          return yield* Effect.fail("no")
        }),
      ),
    )
    expect(Exit.isFailure(exit)).toBe(true)
    expect(await orderExists(orderId)).toBe(false)
    expect(await outboxRow(id)).toBeUndefined()
  })
})

test("a committed event wakes an idle relay: the NOTIFY of the check goes out with the COMMIT", async () => {
  // A due row of the last 3 s says a NOTIFY went out already (migration 0017): none may be left.
  await sql`DELETE FROM txbox.outbox WHERE status = 'pending'`.execute(t.db)
  const listener = new pg.Client({ connectionString: t.url })
  await listener.connect()
  try {
    const heard: string[] = []
    listener.on("notification", (n) => heard.push(n.channel))
    await listener.query('LISTEN "txbox.outbox"')
    await Effect.runPromise(
      Outbox.transaction(pool, (client) => Outbox.enqueue(client, Note, { note: "wake" })),
    )
    const deadline = Date.now() + 5_000
    while (heard.length === 0 && Date.now() < deadline) await Bun.sleep(20)
    expect(heard).toContain("txbox.outbox")
  } finally {
    await listener.end()
  }
})
