// The producers' wake-up check (the outbox's statement trigger, migration 0011) reads index ends:
// whatever the outbox holds, an INSERT never scans the table, also when PostgreSQL plans the
// trigger's statements generically (as plpgsql may after a few calls).
import { afterAll, beforeAll, expect, test } from "bun:test"
import { Effect } from "effect"
import { sql } from "kysely"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import * as Outbox from "../../src/Outbox.ts"
import { type MigratedDatabase, migratedDatabase } from "../support/txbox.ts"

const Ping = defineEvent({ type: "probe.ping", version: 1, schema: v.object({ n: v.number() }) })

let t: MigratedDatabase
beforeAll(async () => {
  t = await migratedDatabase("outbox-notify")
})
afterAll(async () => {
  await t.close()
})

/** Sequential scans of the outbox this session has not reported yet (its own counters: no reporting delay). */
// biome-ignore lint/suspicious/noExplicitAny: a transaction of the test's Kysely
const seqScansInTransaction = async (trx: any) =>
  Number(
    (
      await sql<{ n: string }>`
        SELECT seq_scan AS n FROM pg_stat_xact_user_tables WHERE schemaname = 'txbox' AND relname = 'outbox'`.execute(
        trx,
      )
    ).rows[0]?.n ?? 0,
  )

test("an enqueue while no relay is warm reads two index ends, never the table, however many sent rows it keeps", async () => {
  // 20,000 rows sent a while ago (kept for retention), none pending: every check runs both probes.
  await sql`
    INSERT INTO txbox.outbox (id, type, version, payload, status, published_at, visible_at)
    SELECT gen_random_uuid(), 'probe.ping', 1, '{"n":0}', 'sent', now() - interval '1 minute', now() - interval '1 minute'
    FROM generate_series(1, 20000)`.execute(t.db)
  await sql`ANALYZE txbox.outbox`.execute(t.db)
  // One connection for the whole test, planning every statement generically: the plan plpgsql
  // may settle on, which 0007's parameter made a sequential scan.
  await t.db.connection().execute(async (db) => {
    await sql`SET plan_cache_mode = force_generic_plan`.execute(db)
    let scans = 0
    for (let n = 0; n < 20; n++) {
      await db.transaction().execute(async (trx) => {
        const before = await seqScansInTransaction(trx)
        const { id } = await Effect.runPromise(Outbox.enqueue(trx, Ping, { n }))
        // The INSERT's statement trigger has run: count what it read.
        scans += (await seqScansInTransaction(trx)) - before
        // Marked sent a while ago at once, so the next check finds no warm relay and nothing due.
        await sql`UPDATE txbox.outbox SET status = 'sent', published_at = now() - interval '1 minute' WHERE id = ${id}`.execute(
          trx,
        )
      })
    }
    expect(scans).toBe(0)
  })
})
