// Destroying a Kysely on txbox's PostgresJsDialect while a transaction still holds a connection:
// postgres.js 3.4's own end() never settles when a reserved connection comes back after it began
// (upstream #925), which hung `txbox.close()` on the postgres.js store about one run in ten (a
// relay's transaction finishing after the shutdown interrupted it).
import { describe, expect, test } from "bun:test"
import { Effect, Layer, ManagedRuntime } from "effect"
import { Kysely, sql } from "kysely"
import postgres from "postgres"
import { Database } from "../../src/ports/Database.ts"
import { PostgresJsDialect } from "../../src/storage/drivers/postgres-js/dialect.ts"
import * as PostgresJsStore from "../../src/storage/drivers/postgres-js/PostgresJsStore.ts"
import { createTestDatabase } from "../support/db.ts"

const HUNG_AFTER_MS = 8_000

/** "ended" when `destroy` settles, "hung" when it has not after HUNG_AFTER_MS. */
const settles = (destroy: Promise<void>): Promise<string> =>
  Promise.race([
    destroy.then(() => "ended"),
    new Promise<string>((resolve) => setTimeout(() => resolve("hung"), HUNG_AFTER_MS).unref()),
  ])

const ledgerCount = async (url: string): Promise<number> => {
  const admin = postgres(url, { max: 1, onnotice: () => {} })
  try {
    const rows = await admin<{ n: number }[]>`SELECT count(*)::int AS n FROM ledger`
    return rows[0]!.n
  } finally {
    await admin.end({ timeout: 5 })
  }
}

/** A transaction that writes one row, waits `ms`, writes another and commits; `begun` once it holds its connection. */
const slowTransaction = (db: Kysely<unknown>, ms: number) => {
  let begun!: () => void
  const holding = new Promise<void>((resolve) => {
    begun = resolve
  })
  const done = db.transaction().execute(async (trx) => {
    await sql`INSERT INTO ledger VALUES (1)`.execute(trx)
    begun()
    await Bun.sleep(ms)
    await sql`INSERT INTO ledger VALUES (2)`.execute(trx)
  })
  return { holding, done }
}

/** A Kysely on PostgresJsDialect over a pool of 2, with an empty `ledger` table. */
const ledgerDb = async (url: string): Promise<Kysely<unknown>> => {
  const db = new Kysely<unknown>({
    dialect: new PostgresJsDialect({ postgres: postgres(url, { max: 2, onnotice: () => {} }) }),
  })
  await sql`CREATE TABLE ledger (n int)`.execute(db)
  return db
}

describe("PostgresJsDialect: destroy while a transaction holds a connection", () => {
  test("the transaction finishes and commits, then the pool ends; nothing new starts meanwhile", async () => {
    const t = await createTestDatabase("pgjs_destroy_busy")
    try {
      const db = await ledgerDb(t.url)
      const busy = slowTransaction(db, 300)
      await busy.holding
      const destroyed = settles(db.destroy())
      await Bun.sleep(20) // Kysely calls the driver's destroy a few ticks later
      // Asked after the destroy began: refused at once, with a reason.
      const late = await sql`SELECT 1`.execute(db).then(
        () => "ran",
        (error: Error) => error.message,
      )
      expect(late).toContain("destroyed")
      await busy.done
      expect(await destroyed).toBe("ended")
      expect(await ledgerCount(t.url)).toBe(2)
    } finally {
      await t.drop()
    }
  })

  test("a transaction that never hands its connection back holds the destroy up for a bounded time only", async () => {
    const t = await createTestDatabase("pgjs_destroy_stuck")
    try {
      const db = await ledgerDb(t.url)
      const connection = db.connection()
      let holding!: () => void
      const held = new Promise<void>((resolve) => {
        holding = resolve
      })
      let letGo!: () => void
      const stuck = connection.execute(async (conn) => {
        await sql`SELECT 1`.execute(conn)
        holding()
        await new Promise<void>((resolve) => {
          letGo = resolve
        })
      })
      await held
      const started = Date.now()
      // Waits its 10 s for the connection, then ends the pool with a 2 s deadline.
      await db.destroy()
      expect(Date.now() - started).toBeLessThan(20_000)
      letGo()
      await stuck.catch(() => undefined)
    } finally {
      await t.drop()
    }
  }, 30_000)

  test("the postgres.js store's scope closes while a transaction of it still runs: it commits, and the close ends", async () => {
    const t = await createTestDatabase("pgjs_store_close_busy")
    const runtime = ManagedRuntime.make(
      Layer.orDie(PostgresJsStore.layer({ url: t.url, poolSize: 2, listen: false })),
    )
    try {
      const { db } = await runtime.runPromise(
        Effect.gen(function* () {
          return yield* Database
        }),
      )
      await sql`CREATE TABLE ledger (n int)`.execute(db)
      const busy = slowTransaction(db as Kysely<unknown>, 300)
      await busy.holding
      const closed = settles(runtime.dispose())
      await busy.done
      expect(await closed).toBe("ended")
      expect(await ledgerCount(t.url)).toBe(2)
    } finally {
      await runtime.dispose()
      await t.drop()
    }
  })
})
