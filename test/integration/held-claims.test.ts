// Held claims (the node-postgres store's default, `holdClaims`): the relay's claim locks its rows in
// a transaction and the mark commits them sent in the same one: one row write per message. What
// must still hold, on a real PostgreSQL, read from the table: other claims skip held rows; a relay
// whose connection dies, or that stays silent past its lease, hands its rows back; a release hands
// them back at once; a claim that found nothing leaves no transaction open.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect, Layer, ManagedRuntime } from "effect"
import { sql } from "kysely"
import pg from "pg"
import { uuidv7 } from "../../src/core/uuid.ts"
import { OutboxStore } from "../../src/ports/OutboxStore.ts"
import * as PgStore from "../../src/storage/drivers/pg/PgStore.ts"
import * as PostgresJsStore from "../../src/storage/drivers/postgres-js/PostgresJsStore.ts"
import { MARK_WAIT_MS } from "../../src/storage/sql/heldClaims.ts"
import { type MigratedDatabase, migratedDatabase } from "../support/txbox.ts"

let t: MigratedDatabase
beforeAll(async () => {
  t = await migratedDatabase("held_claims")
})
afterAll(async () => {
  await t.close()
})

const seed = async (n: number): Promise<string[]> => {
  const ids = Array.from({ length: n }, () => uuidv7())
  for (const id of ids)
    await sql`INSERT INTO txbox.outbox (id, type, version, payload, visible_at)
      VALUES (${id}::uuid, 'test.event', 1, '{}'::jsonb, now() - interval '1 second')`.execute(t.db)
  return ids
}

const rowsOf = async (ids: ReadonlyArray<string>) =>
  (
    await sql<{
      id: string
      status: string
      lock_token: string | null
      attempts: number
      visible_at: Date
    }>`SELECT id::text, status, lock_token::text, attempts, visible_at FROM txbox.outbox
       WHERE id = ANY(${ids}::uuid[]) ORDER BY id`.execute(t.db)
  ).rows

const idleInTransaction = async () =>
  Number(
    (
      await sql<{ n: string }>`SELECT count(*) AS n FROM pg_stat_activity
        WHERE datname = current_database() AND state LIKE 'idle in transaction%'`.execute(t.db)
    ).rows[0]!.n,
  )

/** An error text with what a literal must escape. */
const ODD = `nacked: it's a \\ back'slash, "quoted", \n and ünïcode`

const stores = {
  pg: (url: string) => PgStore.layer({ url, listen: false }),
  "postgres.js": (url: string) => PostgresJsStore.layer({ url, listen: false, holdClaims: true }),
} as const

for (const [driver, layerOf] of Object.entries(stores)) {
  describe(`held claims (${driver})`, () => {
    const open = () => ManagedRuntime.make(Layer.orDie(layerOf(t.url)))
    const claimOn = (runtime: ReturnType<typeof open>, limit: number, leaseMs = 30_000) =>
      runtime.runPromise(OutboxStore.use((s) => s.claim(limit, leaseMs)))

    test("a claim writes nothing, other claims skip its rows, and the mark commits them sent", async () => {
      const a = open()
      const b = open()
      try {
        const ids = await seed(3)
        const before = await rowsOf(ids)
        const claim = await claimOn(a, 100)
        const mine = claim.rows.map((r) => r.id).filter((id) => ids.includes(id))
        expect(mine.sort()).toEqual([...ids].sort())
        // Nothing written: no token, no lease on the rows.
        expect(await rowsOf(ids)).toEqual(before)
        // Another relay's claim skips them.
        const other = await claimOn(b, 100)
        expect(other.rows.filter((r) => ids.includes(r.id))).toHaveLength(0)
        const updated = await a.runPromise(
          OutboxStore.use((s) =>
            s.mark(
              claim.token,
              claim.rows.map((r) => ({ id: r.id, verdict: { _tag: "Done" } as const })),
            ),
          ),
        )
        expect(updated).toBe(claim.rows.length)
        expect((await rowsOf(ids)).map((r) => r.status)).toEqual(["sent", "sent", "sent"])
        expect(await idleInTransaction()).toBe(0)
      } finally {
        await a.dispose()
        await b.dispose()
      }
    })

    test("per-row verdicts: a retry comes due after its delay with an attempt spent, a dead row is dead", async () => {
      const a = open()
      try {
        const ids = await seed(3)
        const claim = await claimOn(a, 100)
        const verdicts = {
          [ids[0]!]: { _tag: "Done" } as const,
          [ids[1]!]: { _tag: "Retry", delayMs: 60_000, spendsAttempt: true, error: ODD } as const,
          [ids[2]!]: { _tag: "Dead", error: "too large" } as const,
        }
        await a.runPromise(
          OutboxStore.use((s) =>
            s.mark(
              claim.token,
              claim.rows
                .filter((r) => ids.includes(r.id))
                .map((r) => ({ id: r.id, verdict: verdicts[r.id]! })),
            ),
          ),
        )
        const rows = await rowsOf(ids)
        expect(rows.map((r) => [r.status, r.attempts])).toEqual([
          ["sent", 0],
          ["pending", 1],
          ["dead", 1],
        ])
        expect(rows[1]!.visible_at.getTime()).toBeGreaterThan(Date.now() + 30_000)
        // Written into the statement as a literal (pg sessions): quotes and backslashes as they were.
        const errors = await sql<{ last_error: string | null }>`SELECT last_error FROM txbox.outbox
          WHERE id = ${ids[1]!}::uuid`.execute(t.db)
        expect(errors.rows[0]!.last_error).toBe(ODD)
      } finally {
        await a.dispose()
      }
    })

    test("release hands the rows back at once; a claim that found nothing leaves no transaction open", async () => {
      const a = open()
      const b = open()
      try {
        const ids = await seed(2)
        const claim = await claimOn(a, 100)
        expect(claim.rows.length).toBeGreaterThanOrEqual(2)
        await a.runPromise(OutboxStore.use((s) => s.release(claim.token)))
        const again = await claimOn(b, 100)
        expect(
          again.rows
            .map((r) => r.id)
            .filter((id) => ids.includes(id))
            .sort(),
        ).toEqual([...ids].sort())
        await b.runPromise(OutboxStore.use((s) => s.release(again.token)))
        await sql`UPDATE txbox.outbox SET status = 'sent' WHERE status = 'pending'`.execute(t.db)
        const empty = await claimOn(a, 100)
        expect(empty.rows).toHaveLength(0)
        expect(await idleInTransaction()).toBe(0)
      } finally {
        await a.dispose()
        await b.dispose()
      }
    })

    test("a relay whose connection dies hands its rows back at once; its mark fails, and again finds nothing to mark", async () => {
      const a = open()
      const b = open()
      try {
        const ids = await seed(2)
        const claim = await claimOn(a, 100)
        // The held transaction's backend, killed as a crashed relay's would be.
        await sql`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE datname = current_database() AND state LIKE 'idle in transaction%'`.execute(t.db)
        const taken = await claimOn(b, 100)
        expect(
          taken.rows
            .map((r) => r.id)
            .filter((id) => ids.includes(id))
            .sort(),
        ).toEqual([...ids].sort())
        // The same mark run again, as the relay's retry of a failed mark runs it: the claim is gone
        // with its transaction, so nothing is marked (0), and no TypeError of ours either.
        const [marked, again] = await a.runPromise(
          Effect.flatMap(Effect.service(OutboxStore), (s) => {
            const mark = s.mark(
              claim.token,
              claim.rows.map((r) => ({ id: r.id, verdict: { _tag: "Done" } as const })),
            )
            return Effect.all([Effect.flip(mark), mark])
          }),
        )
        expect(marked._tag).toBe("StoreError")
        expect(again).toBe(0)
        expect((await rowsOf(ids)).map((r) => r.status)).toEqual(["pending", "pending"])
        await b.runPromise(OutboxStore.use((s) => s.release(taken.token)))
      } finally {
        await a.dispose()
        await b.dispose()
      }
    })

    test("a relay silent past its lease is cut off by the server and its rows come back; extend keeps them", async () => {
      const a = open()
      const b = open()
      try {
        await sql`UPDATE txbox.outbox SET status = 'sent' WHERE status = 'pending'`.execute(t.db)
        const ids = await seed(2)
        const kept = await claimOn(a, 100, 1000)
        // Extended (a statement in the transaction) every 300 ms for 1.5 s: still held.
        for (let i = 0; i < 5; i++) {
          await Bun.sleep(300)
          await a.runPromise(OutboxStore.use((s) => s.extend(kept.token, 1000)))
        }
        expect((await claimOn(b, 100)).rows).toHaveLength(0)
        // Silent past the lease: the server ends the session and the rows are free.
        await Bun.sleep(1600)
        const taken = await claimOn(b, 100)
        expect(taken.rows.map((r) => r.id).sort()).toEqual([...ids].sort())
        await b.runPromise(OutboxStore.use((s) => s.release(taken.token)))
      } finally {
        await a.dispose()
        await b.dispose()
      }
    })
  })
}

/** The database's clock, ms. */
const dbClock = async () =>
  Number(
    (
      await sql<{ ms: string }>`SELECT (extract(epoch FROM clock_timestamp()) * 1000)::text AS ms`.execute(
        t.db,
      )
    ).rows[0]!.ms,
  )

/** Each row's `published_at`, ms. */
const publishedAt = async (ids: ReadonlyArray<string>) =>
  (
    await sql<{ ms: string }>`SELECT (extract(epoch FROM published_at) * 1000)::text AS ms FROM txbox.outbox
      WHERE id = ANY(${ids}::uuid[])`.execute(t.db)
  ).rows.map((r) => Number(r.ms))

// node-postgres sessions: a batch's mark waits for the relay's next look and goes in its round trip.
describe("held claims (pg): the mark rides with the next claim", () => {
  const open = () => ManagedRuntime.make(Layer.orDie(stores.pg(t.url)))
  const done = (claim: { rows: ReadonlyArray<{ id: string }> }) =>
    claim.rows.map((r) => ({ id: r.id, verdict: { _tag: "Done" } as const }))
  // Round trips of held-claim scripts (a claim's `BEGIN;…`, a mark's `…;COMMIT`), counted at the driver.
  const scripts: string[] = []
  const query = pg.Client.prototype.query
  beforeAll(() => {
    pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
      const text = args[0]
      if (typeof text === "string" && /^BEGIN;|;COMMIT/.test(text)) scripts.push(text)
      return (query as (...a: unknown[]) => unknown).apply(this, args)
    } as typeof query
  })
  afterAll(() => {
    pg.Client.prototype.query = query
  })

  test("one round trip commits the last batch and claims the next; a mark no claim follows goes alone within MARK_WAIT_MS", async () => {
    const a = open()
    try {
      await sql`UPDATE txbox.outbox SET status = 'sent' WHERE status = 'pending'`.execute(t.db)
      const first = await seed(3)
      const claimA = await a.runPromise(OutboxStore.use((s) => s.claim(100, 30_000)))
      expect(claimA.rows.map((r) => r.id).sort()).toEqual([...first].sort())
      const claimedBy = await dbClock()
      const markA = a.runPromise(OutboxStore.use((s) => s.mark(claimA.token, done(claimA))))
      await Bun.sleep(MARK_WAIT_MS / 3)
      // Waiting for the next look: not written yet.
      expect((await rowsOf(first)).map((r) => r.status)).toEqual(["pending", "pending", "pending"])
      const second = await seed(2)
      const before = scripts.length
      const claimB = await a.runPromise(OutboxStore.use((s) => s.claim(100, 30_000)))
      expect(await markA).toBe(3)
      expect(scripts.length - before).toBe(1)
      expect(scripts.at(-1)).toMatch(/;COMMIT;BEGIN;/)
      expect((await rowsOf(first)).map((r) => r.status)).toEqual(["sent", "sent", "sent"])
      // Stamped when marked, not when claimed: producers and relays read it as "a relay published
      // within 100 ms", and the claim was a wait earlier.
      for (const at of await publishedAt(first))
        expect(at - claimedBy).toBeGreaterThanOrEqual(MARK_WAIT_MS / 3 - 2)
      expect(claimB.rows.map((r) => r.id).sort()).toEqual([...second].sort())
      // No claim after it: the mark goes alone once it has waited MARK_WAIT_MS.
      const started = performance.now()
      expect(await a.runPromise(OutboxStore.use((s) => s.mark(claimB.token, done(claimB))))).toBe(2)
      expect(performance.now() - started).toBeGreaterThanOrEqual(MARK_WAIT_MS - 5)
      expect((await rowsOf(second)).map((r) => r.status)).toEqual(["sent", "sent"])
      expect(await idleInTransaction()).toBe(0)
    } finally {
      await a.dispose()
    }
  })

  test("a mark whose claim is followed by another goes at once: the relay's next look waits for it", async () => {
    const a = open()
    try {
      await sql`UPDATE txbox.outbox SET status = 'sent' WHERE status = 'pending'`.execute(t.db)
      const ids = await seed(2)
      const claimA = await a.runPromise(OutboxStore.use((s) => s.claim(1, 30_000)))
      const claimB = await a.runPromise(OutboxStore.use((s) => s.claim(1, 30_000)))
      const before = scripts.length
      expect(await a.runPromise(OutboxStore.use((s) => s.mark(claimA.token, done(claimA))))).toBe(1)
      expect(scripts.length - before).toBe(1)
      expect(scripts.at(-1)).not.toMatch(/BEGIN/)
      await a.runPromise(OutboxStore.use((s) => s.release(claimB.token)))
      expect((await rowsOf(ids)).map((r) => r.status).sort()).toEqual(["pending", "sent"])
    } finally {
      await a.dispose()
    }
  })

  test("the claim that carries a mark reads the last publish before it: another relay's, not its own", async () => {
    const a = open()
    const b = open()
    try {
      await sql`UPDATE txbox.outbox SET status = 'sent', published_at = now() - interval '1 hour'
        WHERE status = 'pending' OR published_at IS NULL`.execute(t.db)
      await seed(2)
      const claimA = await a.runPromise(OutboxStore.use((s) => s.claim(1, 30_000)))
      const claimB = await b.runPromise(OutboxStore.use((s) => s.claim(1, 30_000)))
      // b publishes (its mark goes with its next claim, which finds nothing).
      const markB = b.runPromise(OutboxStore.use((s) => s.mark(claimB.token, done(claimB))))
      await b.runPromise(OutboxStore.use((s) => s.claim(1, 30_000)))
      expect(await markB).toBe(1)
      const markA = a.runPromise(OutboxStore.use((s) => s.mark(claimA.token, done(claimA))))
      const next = await a.runPromise(OutboxStore.use((s) => s.claim(1, 30_000)))
      expect(await markA).toBe(1)
      // Read ahead of a's own mark in the same round trip: b's publish, a moment ago.
      expect(next.lastPublished?.by).not.toBe("self")
      expect(next.lastPublished?.agoMs).toBeGreaterThanOrEqual(0)
      expect(next.lastPublished?.agoMs).toBeLessThan(1000)
    } finally {
      await a.dispose()
      await b.dispose()
    }
  })

  test("a store closing with a mark waiting sends it before it closes", async () => {
    const a = open()
    await sql`UPDATE txbox.outbox SET status = 'sent' WHERE status = 'pending'`.execute(t.db)
    const ids = await seed(2)
    const claim = await a.runPromise(OutboxStore.use((s) => s.claim(100, 30_000)))
    // Its caller goes with the runtime (a relay's drain would have waited for it); the write does not.
    const marked = a
      .runPromise(OutboxStore.use((s) => s.mark(claim.token, done(claim))))
      .catch(() => "interrupted")
    await Bun.sleep(1)
    await a.dispose()
    expect(await marked).toBe("interrupted")
    expect((await rowsOf(ids)).map((r) => r.status)).toEqual(["sent", "sent"])
    expect(await idleInTransaction()).toBe(0)
  })
})

describe("held claims on a schema behind this version", () => {
  test("a claim on a schema without migration 0020's functions fails saying to run `txbox migrate`, and claims nothing", async () => {
    const behind = await migratedDatabase("held_claims_behind")
    const runtime = ManagedRuntime.make(Layer.orDie(PgStore.layer({ url: behind.url, listen: false })))
    try {
      await sql`INSERT INTO txbox.outbox (id, type, version, payload, visible_at)
        VALUES (${uuidv7()}::uuid, 'test.event', 1, '{}'::jsonb, now() - interval '1 second')`.execute(
        behind.db,
      )
      await sql`DROP FUNCTION txbox.outbox_claim_held(integer, text, double precision)`.execute(behind.db)
      const failure = await runtime.runPromise(OutboxStore.use((s) => s.claim(10, 30_000)).pipe(Effect.flip))
      expect(failure._tag).toBe("StoreError")
      expect(failure.message).toContain("outbox_claim_held")
      expect(failure.message).toContain("run `txbox migrate`")
      expect(failure.retryable).toBe(false)
      // Nothing claimed, nothing left open.
      const rows = await sql<{ status: string }>`SELECT status FROM txbox.outbox`.execute(behind.db)
      expect(rows.rows.map((r) => r.status)).toEqual(["pending"])
    } finally {
      await runtime.dispose()
      await behind.close()
    }
  })
})
