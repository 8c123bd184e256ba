// On PostgreSQL: Outbox.transaction on a node-postgres pool or client sends its BEGIN in front of
// the body's first statement, in the same write (storage/drivers/pg/beginAhead.ts), whatever that
// statement is. Writes are counted on the connection's socket (a corked batch is one write); what
// must not change is checked on the server: the statement answers as if alone, it is inside the
// transaction (rolled back with it), a failed first statement leaves the connection clean, a named
// statement stays usable.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect, Exit } from "effect"
import { sql } from "kysely"
import pg from "pg"
import * as Outbox from "../../src/Outbox.ts"
import { beginAhead } from "../../src/storage/drivers/pg/beginAhead.ts"
import { Note } from "../fixtures/contracts.ts"
import { countingSocketWrites } from "../support/socketWrites.ts"
import { type MigratedDatabase, migratedDatabase } from "../support/txbox.ts"

let t: MigratedDatabase
let pool: pg.Pool
beforeAll(async () => {
  t = await migratedDatabase("begin_ahead")
  await sql`CREATE TABLE begin_ahead (n int PRIMARY KEY)`.execute(t.db)
  pool = new pg.Pool({ connectionString: t.url, max: 1 })
  // The first transaction on a target asks once whether it takes two statements in one text.
  await Effect.runPromise(Outbox.transaction(pool, () => Effect.void))
})
afterAll(async () => {
  await pool.end()
  await t.close()
})

/** The writes `client`'s connection makes while `body` runs. */
const countingWrites = <A>(client: object, body: () => Promise<A>) =>
  countingSocketWrites((client as { connection: { stream: object } }).connection.stream, body)

const count = async (n: number) =>
  (await sql<{ c: number }>`SELECT count(*)::int AS c FROM begin_ahead WHERE n = ${n}`.execute(t.db)).rows[0]!
    .c

const outboxCount = async (note: string) =>
  (
    await sql<{
      c: number
    }>`SELECT count(*)::int AS c FROM txbox.outbox WHERE payload->>'note' = ${note}`.execute(t.db)
  ).rows[0]!.c

/** The pool's one connection, lent and given back at once: what Outbox.transaction will be lent next. */
const theConnection = async (): Promise<pg.PoolClient> => {
  const client = await pool.connect()
  client.release()
  return client
}

const insert = (client: pg.PoolClient, n: number) =>
  Effect.tryPromise(() => client.query("INSERT INTO begin_ahead (n) VALUES ($1) RETURNING n", [n]))

describe("Outbox.transaction on a node-postgres pool: BEGIN goes ahead of the first statement", () => {
  test("a business write and an event: two writes (BEGIN with the write, the event with COMMIT)", async () => {
    const client = await theConnection()
    const { writes, value } = await countingWrites(client, () =>
      Effect.runPromise(
        Outbox.transaction(pool, (trx) =>
          Effect.gen(function* () {
            const inserted = yield* insert(trx, 1)
            yield* Outbox.enqueue(trx, Note, { note: "ahead-1" })
            return inserted
          }),
        ),
      ),
    )
    expect(writes).toBe(2)
    // The statement answers as if it had gone alone.
    expect(value.command).toBe("INSERT")
    expect(value.rowCount).toBe(1)
    expect(value.rows).toEqual([{ n: 1 }])
    expect(await count(1)).toBe(1)
    expect(await outboxCount("ahead-1")).toBe(1)
  })

  test("an event alone: one write (BEGIN, the event and COMMIT in one text)", async () => {
    const client = await theConnection()
    const { writes } = await countingWrites(client, () =>
      Effect.runPromise(Outbox.transaction(pool, (trx) => Outbox.enqueue(trx, Note, { note: "ahead-2" }))),
    )
    expect(writes).toBe(1)
    expect(await outboxCount("ahead-2")).toBe(1)
  })

  test("the first statement is in the transaction: the body's failure rolls it back", async () => {
    const exit = await Effect.runPromiseExit(
      Outbox.transaction(pool, (trx) =>
        Effect.andThen(
          insert(trx, 3),
          Effect.andThen(Outbox.enqueue(trx, Note, { note: "ahead-3" }), Effect.fail("no")),
        ),
      ),
    )
    expect(Exit.isFailure(exit)).toBe(true)
    expect(await count(3)).toBe(0)
    expect(await outboxCount("ahead-3")).toBe(0)
  })

  test("a first statement that fails: the body sees its error, nothing commits, the connection is clean after", async () => {
    await Effect.runPromise(Outbox.transaction(pool, (trx) => insert(trx, 4)))
    const exit = await Effect.runPromiseExit(
      Outbox.transaction(pool, (trx) =>
        Effect.andThen(insert(trx, 4), Outbox.enqueue(trx, Note, { note: "ahead-4" })),
      ),
    )
    expect(Exit.isFailure(exit)).toBe(true)
    expect(String(Exit.isFailure(exit) && exit.cause)).toContain("duplicate key")
    expect(await outboxCount("ahead-4")).toBe(0)
    // The pool's only connection: outside any transaction (a write there is seen at once elsewhere).
    const client = await pool.connect()
    try {
      await client.query("INSERT INTO begin_ahead (n) VALUES (5)")
      expect(await count(5)).toBe(1)
    } finally {
      client.release()
    }
  })

  test("two first statements sent at once: both in the transaction, rolled back with it", async () => {
    const exit = await Effect.runPromiseExit(
      Outbox.transaction(pool, (trx) =>
        Effect.andThen(
          Effect.all([insert(trx, 11), insert(trx, 12)], { concurrency: "unbounded" }),
          Effect.fail("no"),
        ),
      ),
    )
    expect(Exit.isFailure(exit)).toBe(true)
    expect((await count(11)) + (await count(12))).toBe(0)
    const both = await Effect.runPromise(
      Outbox.transaction(pool, (trx) =>
        Effect.all([insert(trx, 11), insert(trx, 12)], { concurrency: "unbounded" }),
      ),
    )
    expect(both.map((r) => r.rows)).toEqual([[{ n: 11 }], [{ n: 12 }]])
    expect((await count(11)) + (await count(12))).toBe(2)
  })

  test("the connection lost while the BEGIN waits: the first statement fails, nothing commits, the pool drops it", async () => {
    const pid = await Effect.runPromise(
      Outbox.transaction(pool, (trx) =>
        Effect.tryPromise(
          async () => (await trx.query("SELECT pg_backend_pid() AS pid")).rows[0].pid as number,
        ),
      ),
    )
    const exit = await Effect.runPromiseExit(
      Outbox.transaction(pool, (trx) =>
        Effect.gen(function* () {
          // The pool's one connection, lent to this transaction, its BEGIN not sent yet.
          yield* Effect.promise(() => sql`SELECT pg_terminate_backend(${pid}::int)`.execute(t.db))
          yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 50)))
          yield* insert(trx, 7)
          yield* Outbox.enqueue(trx, Note, { note: "ahead-7" })
        }),
      ),
    )
    expect(Exit.isFailure(exit)).toBe(true)
    expect(await count(7)).toBe(0)
    expect(await outboxCount("ahead-7")).toBe(0)
    // A new connection, which carries the next BEGIN as usual.
    await Effect.runPromise(Outbox.transaction(pool, (trx) => insert(trx, 8)))
    expect(await count(8)).toBe(1)
  })

  test("a body that fails before any statement sends nothing at all", async () => {
    const client = await theConnection()
    const { writes, value } = await countingWrites(client, () =>
      Effect.runPromiseExit(Outbox.transaction(pool, () => Effect.fail("early"))),
    )
    expect(Exit.isFailure(value)).toBe(true)
    expect(writes).toBe(0)
    // The next transaction begins as usual.
    await Effect.runPromise(Outbox.transaction(pool, (trx) => insert(trx, 6)))
    expect(await count(6)).toBe(1)
  })
})

describe("beginAhead on a node-postgres client", () => {
  test("a simple-protocol text of two statements still answers two results; a named statement stays usable", async () => {
    const client = await pool.connect()
    try {
      const ahead = beginAhead(client)!
      expect(ahead.pending()).toBe(true)
      const two = (await client.query("SELECT 1 AS one; SELECT 2 AS two")) as unknown as pg.QueryResult[]
      expect(ahead.pending()).toBe(false)
      expect(two.map((r) => r.rows)).toEqual([[{ one: 1 }], [{ two: 2 }]])
      // Inside a transaction: a savepoint needs one.
      await client.query("SAVEPOINT inside")
      await client.query("ROLLBACK")

      // A named statement whose Parse fails: node-postgres must not think it parsed.
      beginAhead(client)
      await expect(client.query({ name: "ahead_named", text: "SELEC 1" })).rejects.toThrow("syntax error")
      await client.query("ROLLBACK")
      expect((await client.query({ name: "ahead_named", text: "SELECT 7 AS seven" })).rows).toEqual([
        { seven: 7 },
      ])
      // Parsed before: bound without a Parse, the BEGIN still goes ahead of it.
      beginAhead(client)
      expect((await client.query({ name: "ahead_named", text: "SELECT 7 AS seven" })).rows).toEqual([
        { seven: 7 },
      ])
      await client.query("SAVEPOINT inside")
      await client.query("ROLLBACK")
    } finally {
      client.release()
    }
  })

  test("nothing for a client busy with a statement, or for anything that is not a node-postgres client", async () => {
    const client = await pool.connect()
    try {
      const running = client.query("SELECT pg_sleep(0.05)")
      expect(beginAhead(client)).toBeUndefined()
      await running
      expect(beginAhead({ query: () => Promise.resolve({ rows: [] }) })).toBeUndefined()
      // Cancelled: the next statement goes alone, outside any transaction.
      beginAhead(client)!.cancel()
      await client.query("SELECT 1")
      await expect(client.query("SAVEPOINT outside")).rejects.toThrow("transaction blocks")
    } finally {
      client.release()
    }
  })
})
