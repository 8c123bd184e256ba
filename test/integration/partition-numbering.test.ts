// Per-key numbers assigned at enqueue (the producer half of ordered delivery), on real PostgreSQL
// with each driver: they follow commit order, not ids or start times, with no gap and no repeat.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect, Layer } from "effect"
import { type Kysely, sql } from "kysely"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import { uuidv7 } from "../../src/core/uuid.ts"
import * as Outbox from "../../src/Outbox.ts"
import { Database } from "../../src/ports/Database.ts"
import { type MigratedDatabase, migratedDatabase, runtimeOf, storeLayer } from "../support/txbox.ts"

const Step = defineEvent({ type: "numbering.step", version: 1, schema: v.object({ label: v.string() }) })

let t: MigratedDatabase
beforeAll(async () => {
  t = await migratedDatabase("numbering")
})
afterAll(async () => {
  await t.close()
})

const positionsOf = async (key: string) =>
  (
    await sql<{ id: string; epoch: string; seq: string; label: string; occurred_at: Date }>`
      SELECT id, partition_epoch AS epoch, partition_seq AS seq, payload->>'label' AS label, occurred_at
      FROM txbox.outbox WHERE partition_key = ${key} ORDER BY partition_seq`.execute(t.db)
  ).rows

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

for (const driver of ["pg", "postgres.js"] as const) {
  describe(`partition numbers with ${driver}`, () => {
    const withDb = async <A>(use: (db: Kysely<unknown>) => Promise<A>): Promise<A> => {
      const runtime = runtimeOf(Layer.orDie(storeLayer(t.url, { driver, poolSize: 12 })))
      try {
        const { db } = await runtime.runPromise(
          Effect.gen(function* () {
            return yield* Database
          }),
        )
        return await use(db)
      } finally {
        await runtime.dispose()
      }
    }
    const enqueue = (trx: Kysely<unknown>, key: string, label: string, messageId?: string) =>
      Effect.runPromise(
        Outbox.enqueue(trx, Step, { label }, { partitionKey: key, ...(messageId ? { messageId } : {}) }),
      )

    test("a transaction that started first but committed second gets the second number", async () => {
      const key = `order-${uuidv7()}`
      await withDb(async (db) => {
        let bCommitted!: () => void
        const bDone = new Promise<void>((resolve) => {
          bCommitted = resolve
        })
        // A starts first and takes its id (UUIDv7, time-ordered) first, then waits for B to commit.
        const earlyId = uuidv7()
        const a = db.transaction().execute(async (trx) => {
          await sql`SELECT 1`.execute(trx) // the transaction is open: occurred_at = its start
          await bDone
          await enqueue(trx, key, "A", earlyId)
        })
        await sleep(50)
        await db.transaction().execute(async (trx) => {
          await enqueue(trx, key, "B")
        })
        bCommitted()
        await a
      })
      const rows = await positionsOf(key)
      expect(rows.map((r) => [r.label, Number(r.seq)])).toEqual([
        ["B", 1],
        ["A", 2],
      ])
      // Neither the id nor occurred_at gives that order.
      const [b, a] = rows
      expect(a!.id < b!.id).toBe(true)
      expect(a!.occurred_at.getTime()).toBeLessThan(b!.occurred_at.getTime())
      expect(a!.epoch).toBe(b!.epoch)
    })

    test("concurrent writers of overlapping keys: numbers 1..n per key in commit order; rollbacks leave no gap", async () => {
      const keys = Array.from({ length: 3 }, (_, i) => `k${i}-${uuidv7()}`)
      const committedOrder = new Map<string, string[]>(keys.map((k) => [k, []]))
      await withDb(async (db) => {
        await Promise.all(
          Array.from({ length: 30 }, async (_, n) => {
            const label = `t${n}`
            // Each writes two of the keys, listed in its own order, in one call: the library locks
            // them sorted, so overlapping writers cannot deadlock.
            const mine = keys.filter((_, i) => (n + i) % 3 !== 0).sort(() => Math.random() - 0.5)
            const rollback = n % 5 === 4
            try {
              await db.transaction().execute(async (trx) => {
                await sleep(Math.random() * 20)
                await Effect.runPromise(
                  Outbox.enqueueMany(
                    trx,
                    mine.map((key) => ({
                      contract: Step,
                      payload: { label },
                      options: { partitionKey: key },
                    })),
                  ),
                )
                await sleep(Math.random() * 20)
                if (rollback) throw new Error("rolled back on purpose")
              })
            } catch (error) {
              if (!rollback) throw error
              return
            }
            // Same-key transactions wait for each other from their enqueue to their commit, so the
            // order in which commits return is the commit order.
            for (const key of mine) committedOrder.get(key)!.push(label)
          }),
        )
      })
      for (const key of keys) {
        const rows = await positionsOf(key)
        expect(rows.map((r) => Number(r.seq))).toEqual(rows.map((_, i) => i + 1))
        expect(rows.map((r) => r.label)).toEqual(committedOrder.get(key)!)
        expect(rows.some((r) => r.label.endsWith("4") || r.label.endsWith("9"))).toBe(false)
      }
    })

    test("Outbox.transaction writers among writers in their own transactions: numbers 1..n per key, no gap, one commit order across keys", async () => {
      const keys = Array.from({ length: 3 }, (_, i) => `m${i}-${uuidv7()}`)
      const rolledBack = new Set<string>()
      const expected = new Map<string, Set<string>>(keys.map((key) => [key, new Set()]))
      await withDb(async (db) => {
        await Promise.all(
          Array.from({ length: 30 }, async (_, n) => {
            const label = `t${n}`
            const two = keys.filter((_, i) => (n + i) % 3 !== 0).sort(() => Math.random() - 0.5)
            // Some with one key (Outbox.transaction's statement for one keyed row), most with two.
            const mine = n % 4 === 0 ? two.slice(0, 1) : two
            const events = mine.map((key) => ({
              contract: Step,
              payload: { label },
              options: { partitionKey: key },
            }))
            const rollback = n % 5 === 4
            if (rollback) rolledBack.add(label)
            else for (const key of mine) expected.get(key)!.add(label)
            const pause = () => sleep(Math.random() * 20)
            // Every other one in Outbox.transaction: its numbers are taken in its COMMIT's text, on the
            // same counter rows the others lock from their enqueue to their commit.
            const done =
              n % 2 === 0
                ? Effect.runPromise(
                    Outbox.transaction(db, (trx) =>
                      Effect.promise(pause).pipe(
                        Effect.andThen(Outbox.enqueueMany(trx, events)),
                        Effect.andThen(Effect.promise(pause)),
                        Effect.andThen(
                          rollback ? Effect.fail(new Error("rolled back on purpose")) : Effect.void,
                        ),
                      ),
                    ),
                  )
                : db.transaction().execute(async (trx) => {
                    await pause()
                    await Effect.runPromise(Outbox.enqueueMany(trx, events))
                    await pause()
                    if (rollback) throw new Error("rolled back on purpose")
                  })
            await done.catch((error) => {
              if (!rollback) throw error
            })
          }),
        )
      })
      // Commit order is one order: whatever two transactions share a key, they are numbered the same
      // way round on each (the keys' orders together have no cycle). The client cannot see it more
      // closely: a transaction that waited for the counter commits a moment after the one before.
      const after = new Map<string, Set<string>>()
      for (const key of keys) {
        const labels = (await positionsOf(key)).map((r) => r.label)
        expect((await positionsOf(key)).map((r) => Number(r.seq))).toEqual(labels.map((_, i) => i + 1))
        expect(labels.some((label) => rolledBack.has(label))).toBe(false)
        expect([...labels].sort()).toEqual([...expected.get(key)!].sort())
        labels.forEach((label, i) => {
          const set = after.get(label) ?? new Set<string>()
          for (const later of labels.slice(i + 1)) set.add(later)
          after.set(label, set)
        })
      }
      for (const [label, laters] of after)
        for (const later of laters) expect(after.get(later)?.has(label)).not.toBe(true)
    })

    test("several events of one key in one call take consecutive numbers in call order; unkeyed ones none", async () => {
      const key = `batch-${uuidv7()}`
      await withDb(async (db) => {
        await db.transaction().execute((trx) =>
          Effect.runPromise(
            Outbox.enqueueMany(trx, [
              { contract: Step, payload: { label: "first" }, options: { partitionKey: key } },
              { contract: Step, payload: { label: `unkeyed-${key}` } },
              { contract: Step, payload: { label: "second" }, options: { partitionKey: key } },
            ]),
          ),
        )
        // Outside a transaction enqueue opens its own, so numbers and rows commit together.
        await enqueue(db, key, "third")
      })
      expect((await positionsOf(key)).map((r) => [r.label, Number(r.seq)])).toEqual([
        ["first", 1],
        ["second", 2],
        ["third", 3],
      ])
      const unkeyed = await sql<{ epoch: string | null; seq: string | null }>`
        SELECT partition_epoch AS epoch, partition_seq AS seq FROM txbox.outbox WHERE payload->>'label' = ${`unkeyed-${key}`}`.execute(
        t.db,
      )
      expect(unkeyed.rows).toEqual([{ epoch: null, seq: null }])
    })

    test("each message carries the last message before it on every route of its key, across calls and keys", async () => {
      const key = `routes-${uuidv7()}`
      const other = `routes-other-${uuidv7()}`
      const ev = (label: string, partitionKey: string, routingKey?: string) => ({
        contract: Step,
        payload: { label },
        options: { partitionKey, ...(routingKey ? { routingKey } : {}) },
      })
      await withDb(async (db) => {
        await db
          .transaction()
          .execute((trx) =>
            Effect.runPromise(
              Outbox.enqueueMany(trx, [
                ev("a1", key, "a"),
                ev("o1", other, "a"),
                ev("b2", key, "b"),
                ev("a3", key, "a"),
              ]),
            ),
          )
        await db
          .transaction()
          .execute((trx) =>
            Effect.runPromise(Outbox.enqueueMany(trx, [ev("b4", key, "b"), ev("a5", key, "a")])),
          )
      })
      const rows = await sql<{ label: string; seq: string; routes: string }>`
        SELECT payload->>'label' AS label, partition_seq AS seq, headers->>'txbox-partition-routes' AS routes
        FROM txbox.outbox WHERE partition_key IN (${key}, ${other}) ORDER BY partition_key, partition_seq`.execute(
        t.db,
      )
      // The numbers only: enqueue times are the database's clock.
      const seqs = (routes: string) =>
        Object.fromEntries(
          Object.entries(JSON.parse(routes) as Record<string, [number, number]>).map(([r, [n]]) => [r, n]),
        )
      expect(rows.rows.map((r) => [r.label, Number(r.seq), seqs(r.routes)])).toEqual([
        ["a1", 1, {}],
        ["b2", 2, { a: 1 }],
        ["a3", 3, { a: 1, b: 2 }],
        ["b4", 4, { a: 3, b: 2 }],
        ["a5", 5, { a: 3, b: 4 }],
        ["o1", 1, {}],
      ])
    })

    test("Outbox.transaction numbers keyed rows in its COMMIT's text: the same numbers and routes, headers kept, unkeyed rows beside them", async () => {
      const key = `ride-${uuidv7()}`
      const other = `ride-other-${uuidv7()}`
      const ev = (
        label: string,
        partitionKey: string,
        routingKey?: string,
        headers?: Record<string, string>,
      ) => ({
        contract: Step,
        payload: { label },
        options: { partitionKey, ...(routingKey ? { routingKey } : {}), ...(headers ? { headers } : {}) },
      })
      await withDb(async (db) => {
        await Effect.runPromise(
          Outbox.transaction(db, (trx) =>
            Effect.andThen(
              Outbox.enqueue(trx, Step, { label: `ride-unkeyed-${key}` }),
              Outbox.enqueueMany(trx, [
                ev("a1", key, "a"),
                ev("o1", other, "a"),
                ev("b2", key, "b", { tenant: "acme" }),
                ev("a3", key, "a"),
              ]),
            ),
          ),
        )
        // The counter's routes from the COMMIT before, read under its lock.
        await Effect.runPromise(
          Outbox.transaction(db, (trx) => Outbox.enqueueMany(trx, [ev("b4", key, "b"), ev("a5", key, "a")])),
        )
        // One keyed row in a transaction: its own statement, the same answer.
        await Effect.runPromise(
          Outbox.transaction(db, (trx) => Outbox.enqueueMany(trx, [ev("b6", key, "b")])),
        )
      })
      const rows = await sql<{
        label: string
        seq: string
        epoch: string
        routes: string
        tenant: string | null
      }>`
        SELECT payload->>'label' AS label, partition_seq AS seq, partition_epoch AS epoch,
               headers->>'txbox-partition-routes' AS routes, headers->>'tenant' AS tenant
        FROM txbox.outbox WHERE partition_key IN (${key}, ${other}) ORDER BY partition_key, partition_seq`.execute(
        t.db,
      )
      const seqs = (routes: string) =>
        Object.fromEntries(
          Object.entries(JSON.parse(routes) as Record<string, [number, number]>).map(([r, [n]]) => [r, n]),
        )
      expect(rows.rows.map((r) => [r.label, Number(r.seq), seqs(r.routes), r.tenant])).toEqual([
        ["a1", 1, {}, null],
        ["b2", 2, { a: 1 }, "acme"],
        ["a3", 3, { a: 1, b: 2 }, null],
        ["b4", 4, { a: 3, b: 2 }, null],
        ["a5", 5, { a: 3, b: 4 }, null],
        ["b6", 6, { a: 5, b: 4 }, null],
        ["o1", 1, {}, null],
      ])
      // One epoch per key, the counter's; the enqueue times the database's clock, in ms.
      expect(new Set(rows.rows.filter((r) => r.label !== "o1").map((r) => r.epoch)).size).toBe(1)
      const [, at] = Object.values(JSON.parse(rows.rows[5]!.routes) as Record<string, [number, number]>)[0]!
      expect(Math.abs(at - Date.now())).toBeLessThan(60_000)
      const unkeyed = await sql<{ seq: string | null }>`
        SELECT partition_seq AS seq FROM txbox.outbox WHERE payload->>'label' = ${`ride-unkeyed-${key}`}`.execute(
        t.db,
      )
      expect(unkeyed.rows).toEqual([{ seq: null }])
    })
  })
}
