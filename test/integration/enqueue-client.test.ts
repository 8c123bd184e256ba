// Outbox.enqueue on a node-postgres client in the caller's own transaction (no Kysely on the
// producer's path): rows commit and roll back with the caller's, keyed rows are numbered, and a
// keyed enqueue on a client outside any transaction is refused with nothing written.
import { afterAll, beforeAll, expect, test } from "bun:test"
import { Effect } from "effect"
import { sql } from "kysely"
import pg from "pg"
import * as Outbox from "../../src/Outbox.ts"
import { Note } from "../fixtures/contracts.ts"
import { type MigratedDatabase, migratedDatabase } from "../support/txbox.ts"

let t: MigratedDatabase
let pool: pg.Pool
beforeAll(async () => {
  t = await migratedDatabase("enqueue_client")
  pool = new pg.Pool({ connectionString: t.url, max: 2 })
})
afterAll(async () => {
  await pool.end()
  await t.close()
})

const rowOf = async (id: string) =>
  (
    await sql<{
      type: string
      payload: unknown
      partition_key: string | null
      partition_seq: string | null
    }>`SELECT type, payload, partition_key, partition_seq FROM txbox.outbox WHERE id = ${id}::uuid`.execute(
      t.db,
    )
  ).rows[0]

/** BEGIN; `body`; COMMIT (or ROLLBACK when `commit` is false), on one pooled client. */
const inTransaction = async <A>(body: (client: pg.PoolClient) => Promise<A>, commit = true): Promise<A> => {
  const client = await pool.connect()
  try {
    await client.query("BEGIN")
    const result = await body(client)
    await client.query(commit ? "COMMIT" : "ROLLBACK")
    return result
  } finally {
    client.release()
  }
}

test("an enqueue on a pg client commits and rolls back with the caller's transaction", async () => {
  const committed = await inTransaction((client) =>
    Effect.runPromise(Outbox.enqueue(client, Note, { note: "kept" })),
  )
  expect(await rowOf(committed.id)).toEqual({
    type: "test.note",
    payload: { note: "kept" },
    partition_key: null,
    partition_seq: null,
  })
  const rolledBack = await inTransaction(
    (client) => Effect.runPromise(Outbox.enqueue(client, Note, { note: "gone" })),
    false,
  )
  expect(await rowOf(rolledBack.id)).toBeUndefined()
})

test("keyed rows on a pg client are numbered in their key's sequence", async () => {
  const key = `k-${crypto.randomUUID()}`
  const first = await inTransaction((client) =>
    Effect.runPromise(
      Outbox.enqueueMany(client, [
        { contract: Note, payload: { note: "1" }, options: { partitionKey: key } },
        { contract: Note, payload: { note: "2" }, options: { partitionKey: key } },
      ]),
    ),
  )
  const third = await inTransaction((client) =>
    Effect.runPromise(Outbox.enqueue(client, Note, { note: "3" }, { partitionKey: key })),
  )
  const seqs = await Promise.all([...first, third].map(async (m) => (await rowOf(m.id))!.partition_seq))
  expect(seqs.map(Number)).toEqual([1, 2, 3])
})

test("a keyed enqueue on a client outside any transaction is refused and writes nothing; an unkeyed one is written", async () => {
  const key = `k-${crypto.randomUUID()}`
  const error = await Effect.runPromise(
    Effect.flip(Outbox.enqueue(pool, Note, { note: "alone" }, { partitionKey: key })),
  )
  expect(error._tag).toBe("StoreError")
  expect(error.message).toContain("SAVEPOINT can only be used in transaction blocks")
  const counters = await sql<{
    n: string
  }>`SELECT count(*) AS n FROM txbox.partition_counters WHERE partition_key = ${key}`.execute(t.db)
  expect(Number(counters.rows[0]!.n)).toBe(0)
  const plain = await Effect.runPromise(Outbox.enqueue(pool, Note, { note: "one-off" }))
  expect((await rowOf(plain.id))?.payload).toEqual({ note: "one-off" })
})

test("an invalid payload on a pg client is a ValidationError and nothing is written", async () => {
  const error = await inTransaction((client) =>
    Effect.runPromise(Effect.flip(Outbox.enqueue(client, Note, { note: 42 } as never))),
  )
  expect(error._tag).toBe("ValidationError")
})

test("an enqueue on a schema without 0013's outbox_wake() fails saying to run `txbox migrate`, and writes nothing", async () => {
  const behind = await migratedDatabase("enqueue_behind")
  const behindPool = new pg.Pool({ connectionString: behind.url, max: 1 })
  try {
    await sql`DROP FUNCTION txbox.outbox_wake()`.execute(behind.db)
    const client = await behindPool.connect()
    try {
      await client.query("BEGIN")
      // A fresh database and schema: its first enqueue asks outbox_wake() whether to wake a relay.
      const failure = await Effect.runPromise(
        Outbox.enqueue(client, Note, { note: "early" }).pipe(Effect.flip),
      )
      await client.query("ROLLBACK")
      expect(failure._tag).toBe("StoreError")
      expect(failure.message).toContain("outbox_wake")
      expect(failure.message).toContain("run `txbox migrate`")
      expect(failure.message.match(/txbox migrate/g)).toHaveLength(1)
    } finally {
      client.release()
    }
    const rows = await sql<{ n: string }>`SELECT count(*) AS n FROM txbox.outbox`.execute(behind.db)
    expect(rows.rows[0]!.n).toBe("0")
  } finally {
    await behindPool.end()
    await behind.close()
  }
})
