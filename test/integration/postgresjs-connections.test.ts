// The postgres.js store when one connection of its pool closes: only statements on that connection
// fail. A COMMIT still running on another connection gets its answer, so a transaction that
// committed is never reported as failed (a producer retrying on that error would enqueue twice).
import { describe, expect, test } from "bun:test"
import { Effect, Layer, ManagedRuntime } from "effect"
import { sql } from "kysely"
import postgres from "postgres"
import { Database } from "../../src/ports/Database.ts"
import * as PostgresJsStore from "../../src/storage/drivers/postgres-js/PostgresJsStore.ts"
import { createTestDatabase } from "../support/db.ts"

// The COMMIT of a transaction that wrote to `ledger` runs this long (a deferred trigger sleeps),
// longer than the 3 s after which the store used to fail every unanswered statement of its pool.
const COMMIT_SECONDS = 4

const outcome = (work: Promise<unknown>): Promise<string> =>
  work.then(
    () => "committed",
    (error: { code?: string; message?: string }) => `failed: ${error.code ?? error.message}`,
  )

describe("postgres.js store: a connection of the pool closes while another commits", () => {
  test("the slow COMMIT on the healthy connection is answered and reported committed; the closed connection's transaction fails", async () => {
    const t = await createTestDatabase("pgjs_other_conn_closed")
    const admin = postgres(t.url, { max: 1, onnotice: () => {} })
    const runtime = ManagedRuntime.make(
      Layer.orDie(PostgresJsStore.layer({ url: t.url, poolSize: 3, listen: false })),
    )
    try {
      await admin.unsafe(`
        CREATE TABLE ledger (n int);
        CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
          $$ BEGIN PERFORM pg_sleep(${COMMIT_SECONDS}); RETURN NULL; END $$;
        CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON ledger
          DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();`)
      const { db } = await runtime.runPromise(
        Effect.gen(function* () {
          return yield* Database
        }),
      )
      let inserted!: () => void
      const insertedNow = new Promise<void>((resolve) => {
        inserted = resolve
      })
      const started = Date.now()
      const slow = outcome(
        db.transaction().execute(async (trx) => {
          await sql`INSERT INTO ledger VALUES (1)`.execute(trx)
          inserted()
        }),
      )
      await insertedNow
      await Bun.sleep(300) // the COMMIT is on the wire, its trigger sleeping
      const killed = outcome(
        db.transaction().execute(async (trx) => {
          const pid = (await sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`.execute(trx)).rows[0]!.pid
          await admin`SELECT pg_terminate_backend(${pid})`
          await Bun.sleep(300)
          await sql`SELECT 1`.execute(trx)
        }),
      )
      expect(await killed).toMatch(/^failed: /)
      expect(await slow).toBe("committed")
      expect(Date.now() - started).toBeGreaterThanOrEqual(COMMIT_SECONDS * 1000 - 500)
      expect((await admin`SELECT n FROM ledger`).map((r) => r.n)).toEqual([1])
      // The store goes on: a new transaction commits.
      expect(await outcome(db.transaction().execute((trx) => sql`SELECT 1`.execute(trx)))).toBe("committed")
    } finally {
      await runtime.dispose()
      await admin.end()
      await t.drop()
    }
  }, 60_000)
})
