// How far back a relay's claim looks (storage/sql/claimWindow.ts, issue #26): between full claims a
// claim looks back RECENT_MS only, which keeps it off the old dead entries of `outbox_due` while a
// long snapshot holds them there; a row due long before (a long transaction's, a late look's) is
// taken by the next full claim. On real PostgreSQL, with each driver, read through the store.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect, ManagedRuntime } from "effect"
import { sql } from "kysely"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import * as Outbox from "../../src/Outbox.ts"
import { InboxStore } from "../../src/ports/InboxStore.ts"
import { OutboxStore } from "../../src/ports/OutboxStore.ts"
import { FULL_EVERY_MS } from "../../src/storage/sql/claimWindow.ts"
import { type Driver, type MigratedDatabase, migratedDatabase, storeLayer } from "../support/txbox.ts"

const Ping = defineEvent({ type: "window.ping", version: 1, schema: v.object({ n: v.number() }) })

let t: MigratedDatabase
beforeAll(async () => {
  t = await migratedDatabase("claim_window")
})
afterAll(async () => {
  await t.close()
})

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

describe.each(["pg", "postgres.js"] as const)("%s", (driver: Driver) => {
  test("a row due an hour ago is left to the next full claim, within a second; nothing is lost", async () => {
    await sql`DELETE FROM txbox.outbox`.execute(t.db)
    const store = ManagedRuntime.make(storeLayer(t.url, { driver }))
    const claimAndMark = async () => {
      const claimed = await store.runPromise(Effect.flatMap(OutboxStore, (s) => s.claim(10, 30_000)))
      await store.runPromise(
        Effect.flatMap(OutboxStore, (s) =>
          s.mark(
            claimed.token,
            claimed.rows.map((r) => ({ id: r.id, verdict: { _tag: "Done" } as const })),
          ),
        ),
      )
      return claimed.rows.map((r) => r.id)
    }
    try {
      // The first claim looks at every row (none yet). It began after fullAt (the bounded claim's
      // check below is sure) and before returnedAt (the next full claim's wait is sure: the first
      // call also connects the pool).
      const fullAt = performance.now()
      expect(await claimAndMark()).toEqual([])
      const returnedAt = performance.now()
      const old = crypto.randomUUID()
      await sql`INSERT INTO txbox.outbox (id, type, version, payload, visible_at)
        VALUES (${old}, 'window.ping', 1, '{"n":0}', now() - interval '1 hour')`.execute(t.db)
      const fresh = await t.db
        .transaction()
        .execute((trx) => Effect.runPromise(Outbox.enqueue(trx, Ping, { n: 1 })))
      const bounded = await claimAndMark()
      const elapsed = performance.now() - fullAt
      // Within a second of the full claim, a claim looks back three seconds: the fresh row only.
      // (A machine that stalled past the second made it a full claim: both rows, which proves less.)
      if (elapsed < FULL_EVERY_MS) expect(bounded).toEqual([fresh.id])
      else expect(bounded.sort()).toEqual([fresh.id, old].sort())
      if (elapsed < FULL_EVERY_MS) {
        await sleep(returnedAt + FULL_EVERY_MS + 50 - performance.now())
        expect(await claimAndMark()).toEqual([old])
      }
      const left = await sql<{
        n: string
      }>`SELECT count(*)::text AS n FROM txbox.outbox WHERE status <> 'sent'`.execute(t.db)
      expect(left.rows[0]!.n).toBe("0")
    } finally {
      await store.dispose()
    }
  })

  // The inbox's claim (store-then-process rows, ordered rows, retries) looks back the same way: a
  // long snapshot leaves every row processed since it began as a dead entry in `inbox_due`.
  test("the inbox's claim too: a row due an hour ago waits for the next full claim, within a second", async () => {
    const consumer = `window-${driver}`
    const store = ManagedRuntime.make(storeLayer(t.url, { driver }))
    const claimed = async () =>
      (await store.runPromise(Effect.flatMap(InboxStore, (s) => s.claim(consumer, 10, 30_000)))).rows.map(
        (r) => r.key,
      )
    const insert = (id: string, due: string) =>
      sql`INSERT INTO txbox.inbox (message_id, consumer, type, version, payload, status, visible_at)
        VALUES (${id}, ${consumer}, 'window.ping', 1, '{"n":0}', 'pending', now() - ${due}::interval)`.execute(
        t.db,
      )
    try {
      const fullAt = performance.now()
      expect(await claimed()).toEqual([])
      const returnedAt = performance.now()
      const old = crypto.randomUUID()
      const fresh = crypto.randomUUID()
      await insert(old, "1 hour")
      await insert(fresh, "0 seconds")
      const bounded = await claimed()
      const elapsed = performance.now() - fullAt
      if (elapsed < FULL_EVERY_MS) {
        expect(bounded).toEqual([fresh])
        await sleep(returnedAt + FULL_EVERY_MS + 50 - performance.now())
        expect(await claimed()).toEqual([old])
      } else expect(bounded.sort()).toEqual([fresh, old].sort())
      // Both were taken (leased), none is left due.
      const due = await sql<{ n: string }>`SELECT count(*)::text AS n FROM txbox.inbox
        WHERE consumer = ${consumer} AND status = 'pending' AND visible_at <= now()`.execute(t.db)
      expect(due.rows[0]!.n).toBe("0")
    } finally {
      await store.dispose()
    }
  })
})
