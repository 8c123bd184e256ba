// On PostgreSQL: a transaction on txbox's node-postgres pool sends its BEGIN with its first
// statement when that is one of txbox's own (storage/drivers/pg/beginRides.ts). Seen from the
// server: a statement sent in the same text as BEGIN has the transaction's start as its own
// (`statement_timestamp()` is the client message's time). And what must not change: a failed first
// statement rolls the transaction back, and the connection goes back to the pool clean.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import net from "node:net"
import { Effect, Layer, ManagedRuntime } from "effect"
import { CompiledQuery, type Kysely, sql } from "kysely"
import { Database } from "../../src/ports/Database.ts"
import * as PgStore from "../../src/storage/drivers/pg/PgStore.ts"
import { markOwnText } from "../../src/storage/sql/inline.ts"
import { countingSocketWrites } from "../support/socketWrites.ts"
import { type MigratedDatabase, migratedDatabase } from "../support/txbox.ts"

const SAME = "SELECT transaction_timestamp() = statement_timestamp() AS same, $1::int AS n -- begin-rides"
const INSERT = "INSERT INTO begin_rides (n) VALUES ($1::int) RETURNING n -- begin-rides"
markOwnText(SAME)
markOwnText(INSERT)

let t: MigratedDatabase
// biome-ignore lint/suspicious/noExplicitAny: the test's own table
let db: Kysely<any>
let runtime: ManagedRuntime.ManagedRuntime<Database, unknown>
beforeAll(async () => {
  t = await migratedDatabase("begin_rides")
  await sql`CREATE TABLE begin_rides (n int PRIMARY KEY)`.execute(t.db)
  runtime = ManagedRuntime.make(
    Layer.effect(Database, PgStore.make({ url: t.url, listen: false, poolSize: 1 })),
  ) as never
  db = (
    await runtime.runPromise(
      Effect.gen(function* () {
        return yield* Database
      }),
    )
  ).db as never
})
afterAll(async () => {
  await runtime?.dispose()
  await t.close()
})

// biome-ignore lint/suspicious/noExplicitAny: the test's own statements
const same = async (trx: Kysely<any>, text: string) =>
  (await trx.executeQuery<{ same: boolean }>(CompiledQuery.raw(text, [1]))).rows[0]!.same

describe("node-postgres: a transaction's BEGIN rides its first statement", () => {
  test("txbox's own first statement runs in the round trip that began the transaction", async () => {
    expect(await db.transaction().execute((trx) => same(trx, SAME))).toBe(true)
  })

  test("any other first statement goes as it is, with a BEGIN of its own in front of it in the same write", async () => {
    const other = "SELECT transaction_timestamp() = statement_timestamp() AS same, $1::int AS n -- not own"
    // Not written into the statement: the BEGIN is a message of its own (its own statement time).
    expect(await db.transaction().execute((trx) => same(trx, other))).toBe(false)
    const { writes } = await countingSocketWrites(net.Socket.prototype, () =>
      db.transaction().execute((trx) => trx.executeQuery(CompiledQuery.raw(`${other} -- counted`, [2]))),
    )
    // BEGIN with the statement, then COMMIT: two writes, where a BEGIN alone made three.
    expect(writes).toBe(2)
    // In the transaction: rolled back with it.
    const rolledBack = await db
      .transaction()
      .execute(async (trx) => {
        await trx.executeQuery(
          CompiledQuery.raw("INSERT INTO begin_rides (n) VALUES ($1::int) -- not own", [9]),
        )
        await trx.executeQuery(CompiledQuery.raw("SELECT 1/0"))
      })
      .then(
        () => "committed",
        () => "rolled back",
      )
    expect(rolledBack).toBe("rolled back")
    const nine = await sql<{ c: number }>`SELECT count(*)::int AS c FROM begin_rides WHERE n = 9`.execute(
      t.db,
    )
    expect(nine.rows[0]!.c).toBe(0)
  })

  test("a first statement that fails rolls the transaction back; the pool's one connection is clean after", async () => {
    await db.executeQuery(CompiledQuery.raw(INSERT, [1]))
    const failed = await db
      .transaction()
      .execute(async (trx) => {
        await trx.executeQuery(CompiledQuery.raw(INSERT, [1]))
      })
      .then(
        () => undefined,
        (error: { code?: string }) => error.code,
      )
    expect(failed).toBe("23505")
    // Committed together, or not at all: the second statement fails, the first goes with it.
    const rolledBack = await db
      .transaction()
      .execute(async (trx) => {
        await trx.executeQuery(CompiledQuery.raw(INSERT, [2]))
        await trx.executeQuery(CompiledQuery.raw(INSERT, [1]))
      })
      .then(
        () => "committed",
        () => "rolled back",
      )
    expect(rolledBack).toBe("rolled back")
    const rows = await sql<{ n: number }>`SELECT n FROM begin_rides ORDER BY n`.execute(t.db)
    expect(rows.rows.map((r) => r.n)).toEqual([1])
    // The pool's only connection is in no transaction: a statement outside one is its own.
    const outside = await db.executeQuery<{ open: boolean }>(
      CompiledQuery.raw(
        "SELECT now() <> statement_timestamp() OR pg_current_xact_id_if_assigned() IS NOT NULL AS open",
      ),
    )
    expect(outside.rows[0]!.open).toBe(false)
    expect(await db.transaction().execute((trx) => same(trx, SAME))).toBe(true)
  })

  test("a transaction that sent nothing ends without a word; the next one begins as usual", async () => {
    await db.transaction().execute(async () => undefined)
    const n = await db
      .transaction()
      .execute(
        async (trx) => (await trx.executeQuery<{ n: number }>(CompiledQuery.raw(INSERT, [3]))).rows[0]!.n,
      )
    expect(n).toBe(3)
  })
})
