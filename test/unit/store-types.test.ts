// The SQL stores are written with Kysely's typed builder over `TxboxDatabase`: a misspelt table,
// column or status must not compile. `typeErrors` is never called; `tsc -p . --noEmit` (the
// repo's check) type-checks it, and each `@ts-expect-error` fails the check if its line compiles.
import { describe, expect, test } from "bun:test"
import { Layer } from "effect"
import {
  DummyDriver,
  Kysely,
  PostgresAdapter,
  PostgresIntrospector,
  PostgresQueryCompiler,
  sql,
} from "kysely"
import type { InboxRow } from "../../src/ports/InboxStore.ts"
import type { TxboxDatabase } from "../../src/ports/tables.ts"
import * as SqlInboxStore from "../../src/storage/sql/SqlInboxStore.ts"
import * as SqlOutboxStore from "../../src/storage/sql/SqlOutboxStore.ts"

const compileOnly = (): Kysely<TxboxDatabase> =>
  new Kysely<TxboxDatabase>({
    dialect: {
      createAdapter: () => new PostgresAdapter(),
      createDriver: () => new DummyDriver(),
      createIntrospector: (db) => new PostgresIntrospector(db),
      createQueryCompiler: () => new PostgresQueryCompiler(),
    },
  })

const token = "0191e1a4-7f6e-7a3c-9b1d-2f4e6a8c0b1d"
const row: InboxRow = {
  key: "k",
  consumer: "c",
  type: "t",
  version: null,
  payload: null,
  raw: "not json",
  headers: {},
  partitionKey: null,
  tenantId: "acme",
  attempts: 1,
  lastError: "bad",
}

export const typeErrors = (db: Kysely<TxboxDatabase>) => [
  // The right names compile.
  db
    .updateTable("outbox")
    .set({ visible_at: sql`now()` })
    .where("status", "=", sql.lit("pending" as const)),
  // @ts-expect-error no column "statuss"
  db.selectFrom("outbox").select("id").where("statuss", "=", "pending"),
  // @ts-expect-error no column "visible": it is visible_at
  db.updateTable("outbox").set({ visible: sql`now()` }),
  // @ts-expect-error an outbox status is pending, sent or dead
  db.selectFrom("outbox").select("id").where("status", "=", "processed"),
  db
    .selectFrom("outbox")
    .select("id")
    // @ts-expect-error a literal status is checked too (the stores compare status with literals)
    .where("status", "=", sql.lit("pendingg" as const)),
  // @ts-expect-error no table "outboxes"
  db.selectFrom("outboxes").select("id"),
  // @ts-expect-error the inbox is keyed by message_id, not id
  db.selectFrom("inbox").select("id"),
  // @ts-expect-error attempts is a number
  db.updateTable("inbox").set({ attempts: "1" }),
  // @ts-expect-error an aliased table's columns are checked as well
  db.updateTable("outbox as o").returning("o.lock"),
]

describe("SQL stores", () => {
  test("both are layers", () => {
    expect(Layer.isLayer(SqlOutboxStore.layer)).toBe(true)
    expect(Layer.isLayer(SqlInboxStore.layer)).toBe(true)
  })

  test("claims compare status with a literal, which a generic plan can match to the partial index", () => {
    // A bound 'pending' ($n) would leave postgres.js's prepared claim with a sequential scan and a
    // sort once PostgreSQL switches it to a generic plan: the partial index cannot be proven to apply.
    const db = compileOnly().withSchema("txbox")
    const outbox = SqlOutboxStore.claimQuery(db, { limit: 10, token, leaseMs: 30_000, sinceMs: 3000 })
    const inbox = SqlInboxStore.claimQuery(db, {
      consumer: "c",
      limit: 10,
      token,
      leaseMs: 30_000,
      sinceMs: 3000,
    })
    for (const query of [outbox, inbox]) {
      expect(query.sql).toContain(`"status" = 'pending'`)
      expect(query.sql).toMatch(/for update (of "w" )?skip locked/)
      expect(query.parameters).not.toContain("pending")
    }
  })

  test("statements are compiled once and bind the same text and parameters as a fresh compile", () => {
    const db = compileOnly().withSchema("tenant_a")
    const outbox = SqlOutboxStore.statements(db, "tenant_a")
    const inbox = SqlInboxStore.statements(db)
    const verdicts = SqlOutboxStore.markVerdicts([{ id: token, verdict: { _tag: "Done" } }])
    const rows = SqlInboxStore.storedRows([row])
    const processed = { ...row, headers: "{}", bound: "1000" }
    const failures = SqlInboxStore.markFailures([{ key: "k", verdict: { _tag: "Dead", error: "x" } }])
    const pairs = [
      [
        () => outbox.claim({ limit: 7, token, leaseMs: 9, sinceMs: 3000 }),
        SqlOutboxStore.claimQuery(db, { limit: 7, token, leaseMs: 9, sinceMs: 3000 }),
      ],
      [() => outbox.mark({ token, verdicts }), SqlOutboxStore.markQuery(db, { token, verdicts })],
      [
        () => outbox.release({ token, ids: '["a"]' }),
        SqlOutboxStore.releaseQuery(db, { token, ids: '["a"]' }),
      ],
      [() => outbox.releaseByToken({ token }), SqlOutboxStore.releaseQuery(db, { token, ids: null })],
      [
        () => outbox.extend({ token, leaseMs: 9, ids: '["a"]' }),
        SqlOutboxStore.extendQuery(db, { token, leaseMs: 9, ids: '["a"]' }),
      ],
      [
        () => outbox.extendByToken({ token, leaseMs: 9 }),
        SqlOutboxStore.extendQuery(db, { token, leaseMs: 9, ids: null }),
      ],
      [() => outbox.lag(), SqlOutboxStore.lagQuery(db)],
      [() => inbox.insertProcessed(processed), SqlInboxStore.insertProcessedQuery(db, processed)],
      [
        () => inbox.extend({ consumer: "c", token, leaseMs: 9, keys: '["k"]' }),
        SqlInboxStore.extendQuery(db, { consumer: "c", token, leaseMs: 9, keys: '["k"]' }),
      ],
      [
        () => inbox.extendByToken({ consumer: "c", token, leaseMs: 9 }),
        SqlInboxStore.extendQuery(db, { consumer: "c", token, leaseMs: 9, keys: null }),
      ],
      [() => inbox.insertPending({ rows }), SqlInboxStore.insertRowsQuery(db, "pending", { rows })],
      [() => inbox.insertDead({ rows }), SqlInboxStore.insertRowsQuery(db, "dead", { rows })],
      [
        () => inbox.claim.block.heads({ consumer: "c", limit: 7, token, leaseMs: 9, sinceMs: 5 }),
        SqlInboxStore.claimQuery(db, { consumer: "c", limit: 7, token, leaseMs: 9, sinceMs: 5 }),
      ],
      [
        () => inbox.claim.skip.chains({ consumer: "c", limit: 7, token, leaseMs: 9, sinceMs: 5 }),
        SqlInboxStore.claimQuery(db, { consumer: "c", limit: 7, token, leaseMs: 9, sinceMs: 5 }, true, true),
      ],
      [
        () => inbox.releaseSome({ consumer: "c", token, keys: "[]" }),
        SqlInboxStore.releaseSomeQuery(db, { consumer: "c", token, keys: "[]" }),
      ],
      [
        () => inbox.release({ consumer: "c", token }),
        SqlInboxStore.releaseQuery(db, { consumer: "c", token }),
      ],
      [() => inbox.unpark({ consumer: "c" }), SqlInboxStore.unparkQuery(db, { consumer: "c" })],
      [
        () => inbox.park({ consumer: "c", waitedMs: 7 }),
        SqlInboxStore.parkQuery(db, { consumer: "c", waitedMs: 7 }),
      ],
      [
        () => inbox.markProcessed({ consumer: "c", key: "k", token, attempts: 3, bound: null }),
        SqlInboxStore.markProcessedQuery(db, { consumer: "c", key: "k", token, attempts: 3, bound: null }),
      ],
      [
        () => inbox.mark({ consumer: "c", token, failures }),
        SqlInboxStore.markQuery(db, { consumer: "c", token, failures }),
      ],
    ] as const
    for (const [run, fresh] of pairs) {
      const prepared = run()
      // The same operation node on every call: compiled once, not per call.
      expect(run().query).toBe(prepared.query)
      expect(prepared.sql).toContain(`"tenant_a".`)
      expect({ sql: prepared.sql, parameters: prepared.parameters }).toEqual({
        sql: fresh.sql,
        parameters: fresh.parameters,
      })
    }
  })
})
