// The `txbox` command as an operator runs it: a child process against a real PostgreSQL, judged by
// its stdout, stderr and exit code, with every count checked against rows inserted here with SQL.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect } from "effect"
import { sql } from "kysely"
import { migrations } from "../../src/storage/sql/migrations.generated.ts"
import { migrate } from "../../src/storage/sql/migrator.ts"
import { type CliRun, runTxbox } from "../support/cli.ts"
import { createTestDatabase, type TestDatabase } from "../support/db.ts"
import { eventually, type MigratedDatabase, migratedDatabase } from "../support/txbox.ts"

type Run = CliRun

/** `bun src/cli/main.ts ...args`, with no DATABASE_URL inherited unless `env` gives one. */
const txbox = (args: ReadonlyArray<string>, env: Record<string, string> = {}): Promise<Run> =>
  runTxbox(args, { env, unset: ["DATABASE_URL"] })

/** Asserts the failure contract: exit `code`, nothing on stdout, one line on stderr, no stack trace. */
const expectOneLineFailure = (run: Run, code: number): string => {
  expect(run.code).toBe(code)
  expect(run.stdout).toBe("")
  const lines = run.stderr.trimEnd().split("\n")
  expect(lines).toHaveLength(1)
  expect(run.stderr).not.toMatch(/\n\s+at /)
  expect(lines[0]).toStartWith("txbox: ")
  return lines[0]!
}

let t: MigratedDatabase
let schemas = 0
beforeAll(async () => {
  t = await migratedDatabase("cli")
})
afterAll(async () => {
  await t.close()
})

/** A freshly migrated schema of its own for one test, so counts never mix across tests. */
const freshSchema = async (): Promise<string> => {
  const schema = `cli_${++schemas}`
  await Effect.runPromise(migrate(t.db, { schema }))
  return schema
}

/** `--url` and `--schema` for the test database. */
const on = (schema: string) => ["--url", t.url, "--schema", schema]

interface OutboxFixture {
  readonly type: string
  readonly tenant: string | null
  readonly status: "pending" | "sent" | "dead"
  /** visible_at relative to now, in seconds (negative: due that long ago). @default -1 */
  readonly visibleIn?: number
  /** A claim's lock token (a relay holds the row). */
  readonly locked?: boolean
  readonly attempts?: number
  readonly lastError?: string
  /** occurred_at this many seconds ago. @default 0 */
  readonly occurredAgo?: number
  /** published_at this many seconds ago (sent rows). @default 0 */
  readonly publishedAgo?: number
}

const insertOutbox = async (schema: string, rows: ReadonlyArray<OutboxFixture>): Promise<string[]> => {
  const ids: string[] = []
  for (const r of rows) {
    const id = crypto.randomUUID()
    await sql`
      INSERT INTO ${sql.id(schema, "outbox")}
        (id, type, version, payload, tenant_id, status, visible_at, lock_token, attempts, last_error, occurred_at, published_at)
      VALUES (${id}::uuid, ${r.type}, 1, '{}'::jsonb, ${r.tenant}, ${r.status},
        now() + ${r.visibleIn ?? -1}::int * interval '1 second',
        ${r.locked ? crypto.randomUUID() : null}::uuid, ${r.attempts ?? 0}, ${r.lastError ?? null},
        now() - ${r.occurredAgo ?? 0}::int * interval '1 second',
        CASE WHEN ${r.status} = 'sent' THEN now() - ${r.publishedAgo ?? 0}::int * interval '1 second' END)`.execute(
      t.db,
    )
    ids.push(id)
  }
  return ids
}

interface InboxFixture {
  readonly id: string
  readonly consumer: string
  readonly status: "pending" | "processed" | "dead"
  readonly type?: string
  readonly tenant?: string
  readonly attempts?: number
  readonly lastError?: string
  readonly receivedAgo?: number
  readonly processedAgo?: number
}

const insertInbox = async (schema: string, rows: ReadonlyArray<InboxFixture>) => {
  for (const r of rows) {
    await sql`
      INSERT INTO ${sql.id(schema, "inbox")}
        (message_id, consumer, type, version, payload, tenant_id, status, attempts, last_error, received_at, processed_at)
      VALUES (${r.id}, ${r.consumer}, ${r.type ?? "orders.order-placed"}, 1, '{}'::jsonb, ${r.tenant ?? null},
        ${r.status}, ${r.attempts ?? 0}, ${r.lastError ?? null},
        now() - ${r.receivedAgo ?? 0}::int * interval '1 second',
        CASE WHEN ${r.status} = 'processed' THEN now() - ${r.processedAgo ?? 0}::int * interval '1 second' END)`.execute(
      t.db,
    )
  }
}

const outboxRow = async (schema: string, id: string) =>
  (
    await sql<{
      status: string
      attempts: number
      lock_token: string | null
      last_error: string | null
      due: boolean
    }>`
      SELECT status, attempts, lock_token, last_error, visible_at <= now() AS due
      FROM ${sql.id(schema, "outbox")} WHERE id = ${id}::uuid`.execute(t.db)
  ).rows[0]

const countWhere = async (schema: string, table: "outbox" | "inbox", status: string) =>
  Number(
    (
      await sql<{
        n: string
      }>`SELECT count(*) AS n FROM ${sql.id(schema, table)} WHERE status = ${status}`.execute(t.db)
    ).rows[0]!.n,
  )

describe("txbox migrate", () => {
  let fresh: TestDatabase
  beforeAll(async () => {
    fresh = await createTestDatabase("cli_migrate")
  })
  afterAll(async () => {
    await fresh.drop()
  })

  test("--dry-run prints every pending migration's SQL and creates nothing", async () => {
    const run = await txbox(["migrate", "--dry-run", "--url", fresh.url])
    expect(run.code).toBe(0)
    expect(run.stderr).toBe("")
    for (const m of migrations) {
      expect(run.stdout).toContain(`-- ${String(m.version).padStart(4, "0")}_${m.name}`)
    }
    expect(run.stdout).toContain("CREATE TABLE outbox")
    expect(run.stdout).toContain("CREATE TABLE inbox")
    // Nothing applied: status still finds no schema.
    const status = await txbox(["status", "--url", fresh.url])
    expect(expectOneLineFailure(status, 1)).toBe("txbox: schema txbox not found — run `txbox migrate`")
  })

  test("applies the migrations, then finds nothing left to do", async () => {
    const first = await txbox(["migrate"], { DATABASE_URL: fresh.url })
    expect(first.code).toBe(0)
    expect(first.stdout).toContain("applied 0001_outbox")
    expect(first.stdout).toContain("applied 0002_inbox")
    const again = await txbox(["migrate", "--url", fresh.url])
    expect(again.code).toBe(0)
    expect(again.stdout.trim()).toBe("schema txbox is up to date: nothing to apply")
    const dry = await txbox(["migrate", "--dry-run", "--url", fresh.url, "--json"])
    expect(JSON.parse(dry.stdout)).toEqual({ schema: "txbox", dry_run: true, pending: [] })
    const status = await txbox(["status", "--url", fresh.url, "--json"])
    expect(status.code).toBe(0)
  })
})

describe("txbox status", () => {
  test("--json counts match the rows in the tables, per type, tenant and consumer", async () => {
    const schema = await freshSchema()
    const fixtures: OutboxFixture[] = [
      { type: "orders.placed", tenant: "acme", status: "pending", visibleIn: -120 },
      { type: "orders.placed", tenant: "acme", status: "pending", visibleIn: -5 },
      { type: "orders.placed", tenant: "globex", status: "pending", visibleIn: 30, locked: true },
      { type: "orders.placed", tenant: null, status: "pending", visibleIn: 3600, attempts: 2 },
      // An expired lease: locked but due again, so due and not in flight.
      { type: "billing.invoiced", tenant: "acme", status: "pending", visibleIn: -10, locked: true },
      { type: "billing.invoiced", tenant: "globex", status: "dead", attempts: 10, lastError: "unroutable" },
      { type: "billing.invoiced", tenant: null, status: "sent" },
      { type: "orders.placed", tenant: "acme", status: "sent" },
      { type: "orders.placed", tenant: "acme", status: "sent" },
    ]
    await insertOutbox(schema, fixtures)
    await insertInbox(schema, [
      { id: "m1", consumer: "billing", status: "processed" },
      { id: "m2", consumer: "billing", status: "pending", receivedAgo: 300 },
      { id: "m3", consumer: "billing", status: "dead" },
      { id: "m1", consumer: "shipping", status: "processed" },
      { id: "m2", consumer: "shipping", status: "processed" },
    ])

    const run = await txbox(["status", ...on(schema), "--json"])
    expect(run.code).toBe(0)
    expect(run.stderr).toBe("")
    const status = JSON.parse(run.stdout)

    // The expectation is computed from the fixtures, not from the code under test.
    const expected = (rows: ReadonlyArray<OutboxFixture>) => ({
      pending: rows.filter((r) => r.status === "pending").length,
      due: rows.filter((r) => r.status === "pending" && (r.visibleIn ?? -1) <= 0).length,
      in_flight: rows.filter((r) => r.status === "pending" && r.locked && (r.visibleIn ?? -1) > 0).length,
      dead: rows.filter((r) => r.status === "dead").length,
      sent: rows.filter((r) => r.status === "sent").length,
    })
    const { lag_seconds, ...total } = status.outbox.total
    expect(total).toEqual(expected(fixtures))
    expect(total).toEqual({ pending: 5, due: 3, in_flight: 1, dead: 1, sent: 3 })
    // The oldest due row became due 120 s before the insert.
    expect(lag_seconds).toBeGreaterThanOrEqual(120)
    expect(lag_seconds).toBeLessThan(180)

    const types = [...new Set(fixtures.map((f) => f.type))].sort()
    expect(status.outbox.by_type.map((r: { type: string }) => r.type)).toEqual(types)
    for (const row of status.outbox.by_type) {
      const { type, lag_seconds: _, ...counts } = row
      expect(counts).toEqual(expected(fixtures.filter((f) => f.type === type)))
    }
    expect(status.outbox.by_tenant.map((r: { tenant: string | null }) => r.tenant)).toEqual([
      null,
      "acme",
      "globex",
    ])
    for (const row of status.outbox.by_tenant) {
      const { tenant, lag_seconds: _, ...counts } = row
      expect(counts).toEqual(expected(fixtures.filter((f) => f.tenant === tenant)))
    }
    expect(status.outbox.by_tenant[2].lag_seconds).toBeNull() // globex: nothing due

    expect(status.inbox).toHaveLength(2)
    expect(status.inbox[0]).toMatchObject({ consumer: "billing", pending: 1, processed: 1, dead: 1 })
    expect(status.inbox[0].oldest_pending_age_seconds).toBeGreaterThanOrEqual(300)
    expect(status.inbox[1]).toEqual({
      consumer: "shipping",
      pending: 0,
      processed: 2,
      dead: 0,
      oldest_pending_age_seconds: null,
    })
  })

  test("past --exact-up-to, pending and dead rows are counted through their indexes and sent rows estimated", async () => {
    const schema = await freshSchema()
    const fixtures: OutboxFixture[] = [
      { type: "orders.placed", tenant: "acme", status: "pending", visibleIn: -60 },
      { type: "billing.invoiced", tenant: "acme", status: "dead", attempts: 10, lastError: "unroutable" },
      ...Array.from(
        { length: 7 },
        (): OutboxFixture => ({ type: "orders.placed", tenant: "acme", status: "sent" }),
      ),
    ]
    await insertOutbox(schema, fixtures)
    await insertInbox(schema, [
      { id: "m1", consumer: "billing", status: "processed" },
      { id: "m2", consumer: "billing", status: "pending", receivedAgo: 60 },
      { id: "m3", consumer: "billing", status: "dead" },
    ])
    // The statistics the estimate reads (autovacuum's, in a real database).
    await sql`ANALYZE ${sql.id(schema, "outbox")}`.execute(t.db)
    await sql`ANALYZE ${sql.id(schema, "inbox")}`.execute(t.db)

    const run = await txbox(["status", ...on(schema), "--json", "--exact-up-to", "2"])
    expect(run.code).toBe(0)
    const status = JSON.parse(run.stdout)
    expect(status.outbox.estimated).toBe(true)
    const { lag_seconds, ...total } = status.outbox.total
    // Exact for pending and dead; sent from the table's 9 rows less those 2.
    expect(total).toEqual({ pending: 1, due: 1, in_flight: 0, dead: 1, sent: 7 })
    expect(lag_seconds).toBeGreaterThanOrEqual(60)
    // Per type, only what the indexes hold: no sent count, and no sent-only row.
    expect(status.outbox.by_type.map((r: { type: string; sent: unknown }) => [r.type, r.sent])).toEqual([
      ["billing.invoiced", null],
      ["orders.placed", null],
    ])
    expect(status.inbox).toEqual([
      {
        consumer: "billing",
        pending: 1,
        processed: null,
        dead: 1,
        oldest_pending_age_seconds: expect.any(Number),
      },
    ])

    // Under the limit (the default), every count is exact.
    const exact = JSON.parse((await txbox(["status", ...on(schema), "--json"])).stdout)
    expect(exact.outbox.estimated).toBe(false)
    expect(exact.outbox.by_type.find((r: { type: string }) => r.type === "orders.placed").sent).toBe(7)
    expect(exact.inbox[0].processed).toBe(1)

    const text = await txbox(["status", ...on(schema), "--exact-up-to", "2"])
    expect(text.stdout).toMatch(/^all\s+1\s+1\s+0\s+1\s+~7\s+1m \d+s$/m)
    expect(text.stdout).toContain("estimated from the table statistics")
  })

  test("prints a table by default, and works with node-postgres too", async () => {
    const schema = await freshSchema()
    await insertOutbox(schema, [
      { type: "orders.placed", tenant: "acme", status: "pending", visibleIn: -90 },
      { type: "orders.placed", tenant: "acme", status: "dead" },
    ])
    await insertInbox(schema, [{ id: "m1", consumer: "billing", status: "processed" }])
    const run = await txbox(["status", ...on(schema), "--driver", "pg"])
    expect(run.code).toBe(0)
    const lines = run.stdout.split("\n")
    expect(lines[0]).toMatch(/^OUTBOX \(cli_\d+\)\s+PENDING\s+DUE\s+IN FLIGHT\s+DEAD\s+SENT\s+LAG$/)
    expect(lines[1]).toMatch(/^all\s+1\s+1\s+0\s+1\s+0\s+1m \d+s$/)
    expect(run.stdout).toMatch(/^orders\.placed\s+1\s+1\s+0\s+1\s+0\s+1m \d+s$/m)
    expect(run.stdout).toMatch(/^acme\s+1\s+1\s+0\s+1\s+0\s+1m \d+s$/m)
    expect(run.stdout).toMatch(/^billing\s+0\s+1\s+0\s+-$/m)
  })

  test("a schema that does not exist is named, with the command that creates it", async () => {
    const run = await txbox(["status", ...on("nowhere")])
    expect(expectOneLineFailure(run, 1)).toBe("txbox: schema nowhere not found — run `txbox migrate`")
  })
})

describe("txbox dead list", () => {
  let schema: string
  let ids: string[]
  beforeAll(async () => {
    schema = await freshSchema()
    ids = await insertOutbox(schema, [
      {
        type: "billing.invoiced",
        tenant: "globex",
        status: "dead",
        attempts: 10,
        lastError: "unroutable: no queue",
      },
      {
        type: "orders.placed",
        tenant: "acme",
        status: "dead",
        attempts: 3,
        occurredAgo: 3 * 3600,
        lastError: "nack",
      },
      { type: "orders.placed", tenant: "acme", status: "dead", occurredAgo: 10 * 86_400, lastError: "old" },
      { type: "orders.placed", tenant: "acme", status: "pending" },
      { type: "orders.placed", tenant: "acme", status: "sent" },
    ])
    await insertInbox(schema, [
      {
        id: "m1",
        consumer: "billing",
        status: "dead",
        attempts: 5,
        lastError: "TypeError: boom",
        tenant: "acme",
      },
      { id: "m2", consumer: "shipping", status: "dead", attempts: 1, lastError: "invalid payload" },
      { id: "m3", consumer: "billing", status: "processed" },
    ])
  })

  const listed = async (args: ReadonlyArray<string>) => {
    const run = await txbox(["dead", "list", ...on(schema), "--json", ...args])
    expect(run.stderr).toBe("")
    expect(run.code).toBe(0)
    return JSON.parse(run.stdout) as Array<Record<string, unknown>>
  }

  test("lists only dead outbox rows, newest first, with type, tenant, attempts, error and time", async () => {
    const rows = await listed([])
    expect(rows.map((r) => r.id)).toEqual([ids[0], ids[1], ids[2]])
    expect(rows[0]).toMatchObject({
      table: "outbox",
      id: ids[0],
      consumer: null,
      type: "billing.invoiced",
      tenant: "globex",
      attempts: 10,
      last_error: "unroutable: no queue",
    })
    expect(Date.parse(rows[0]!.time as string)).toBeGreaterThan(Date.now() - 60_000)
  })

  test("filters by type, tenant, id, time window and limit", async () => {
    const iso = new Date(Date.now() - 5 * 86_400_000).toISOString()
    const cases: Array<[ReadonlyArray<string>, ReadonlyArray<string | undefined>]> = [
      [
        ["--type", "orders.placed"],
        [ids[1], ids[2]],
      ],
      [["--tenant", "globex"], [ids[0]]],
      [["--id", ids[1]!], [ids[1]]],
      [["--since", "1h"], [ids[0]]],
      [["--since", "7d", "--until", "1h"], [ids[1]]],
      [["--until", iso], [ids[2]]],
      [
        ["--limit", "2"],
        [ids[0], ids[1]],
      ],
    ]
    // Independent read-only runs: in parallel, to keep the suite short.
    const results = await Promise.all(cases.map(([args]) => listed(args)))
    results.forEach((rows, i) => {
      expect({ args: cases[i]![0], ids: rows.map((r) => r.id) }).toEqual({
        args: cases[i]![0],
        ids: [...cases[i]![1]],
      })
    })
  })

  test("--inbox and --consumer list the inbox's dead rows", async () => {
    expect((await listed(["--inbox"])).map((r) => `${r.consumer}/${r.id}`).sort()).toEqual([
      "billing/m1",
      "shipping/m2",
    ])
    const billing = await listed(["--consumer", "billing"])
    expect(billing).toEqual([
      expect.objectContaining({
        table: "inbox",
        id: "m1",
        consumer: "billing",
        tenant: "acme",
        attempts: 5,
        last_error: "TypeError: boom",
      }),
    ])
  })

  test("prints a table by default", async () => {
    const run = await txbox(["dead", "list", ...on(schema), "--type", "billing.invoiced"])
    expect(run.code).toBe(0)
    const [header, row, , footer] = run.stdout.trimEnd().split("\n")
    expect(header).toMatch(/^ID\s+TYPE\s+TENANT\s+ATTEMPTS\s+OCCURRED\s+LAST ERROR$/)
    expect(row).toMatch(
      new RegExp(`^${ids[0]}\\s+billing\\.invoiced\\s+globex\\s+10\\s+\\d{4}-.*Z\\s+unroutable: no queue$`),
    )
    expect(footer).toBe("1 dead outbox row")
  })

  test("a malformed filter is a usage error", async () => {
    const since = await txbox(["dead", "list", ...on(schema), "--since", "yesterday"])
    expect(expectOneLineFailure(since, 2)).toContain('--since "yesterday" is neither a duration')
    const id = await txbox(["dead", "list", ...on(schema), "--id", "42"])
    expect(expectOneLineFailure(id, 2)).toContain('--id "42" is not a uuid')
  })
})

describe("txbox dead redrive", () => {
  test("--dry-run counts the matching rows and changes nothing", async () => {
    const schema = await freshSchema()
    const [dead] = await insertOutbox(schema, [
      { type: "orders.placed", tenant: "acme", status: "dead", attempts: 7, lastError: "nack" },
    ])
    const run = await txbox(["dead", "redrive", ...on(schema), "--dry-run"])
    expect(run.code).toBe(0)
    expect(run.stdout.trim()).toBe("1 dead outbox row would be redriven (dry run: nothing changed)")
    expect(await outboxRow(schema, dead!)).toMatchObject({ status: "dead", attempts: 7, last_error: "nack" })
  })

  test("sets matching dead outbox rows pending, attempts 0, due now, unlocked, last_error kept", async () => {
    const schema = await freshSchema()
    const [target, other] = await insertOutbox(schema, [
      {
        type: "orders.placed",
        tenant: "acme",
        status: "dead",
        attempts: 7,
        lastError: "nack",
        visibleIn: 600,
        locked: true,
      },
      { type: "billing.invoiced", tenant: "acme", status: "dead", attempts: 3, lastError: "unroutable" },
    ])
    const run = await txbox(["dead", "redrive", ...on(schema), "--type", "orders.placed"])
    expect(run.code).toBe(0)
    expect(run.stdout).toStartWith("redrove 1 dead outbox row:")
    expect(await outboxRow(schema, target!)).toEqual({
      status: "pending",
      attempts: 0,
      lock_token: null,
      last_error: "nack",
      due: true,
    })
    // The filter left the other dead row alone.
    expect(await outboxRow(schema, other!)).toMatchObject({ status: "dead", attempts: 3 })
  })

  test("redrives in batches up to --limit, and inbox rows by consumer", async () => {
    const schema = await freshSchema()
    await insertOutbox(
      schema,
      Array.from({ length: 7 }, () => ({
        type: "orders.placed",
        tenant: null,
        status: "dead" as const,
        attempts: 1,
      })),
    )
    const limited = await txbox(["dead", "redrive", ...on(schema), "--limit", "5", "--batch", "2", "--json"])
    expect(JSON.parse(limited.stdout)).toEqual({ table: "outbox", dry_run: false, matched: 7, redriven: 5 })
    expect(await countWhere(schema, "outbox", "dead")).toBe(2)
    expect(await countWhere(schema, "outbox", "pending")).toBe(5)

    await insertInbox(schema, [
      { id: "m1", consumer: "billing", status: "dead", attempts: 5, lastError: "boom" },
      { id: "m1", consumer: "shipping", status: "dead", attempts: 5 },
    ])
    const inbox = await txbox(["dead", "redrive", ...on(schema), "--consumer", "billing"])
    expect(inbox.code).toBe(0)
    expect(inbox.stdout).toStartWith("redrove 1 dead inbox row of consumer billing:")
    const rows = await sql<{ consumer: string; status: string; attempts: number; last_error: string | null }>`
      SELECT consumer, status, attempts, last_error FROM ${sql.id(schema, "inbox")} ORDER BY consumer`.execute(
      t.db,
    )
    expect(rows.rows).toEqual([
      { consumer: "billing", status: "pending", attempts: 0, last_error: "boom" },
      { consumer: "shipping", status: "dead", attempts: 5, last_error: null },
    ])
  })
})

describe("txbox status and dead skip: ordered keys", () => {
  const EPOCH = 1_795_000_000_000
  const seed = async (schema: string) => {
    const row = (id: string, key: string, seq: number, status: string, lastError: string | null = null) =>
      sql`INSERT INTO ${sql.id(schema, "inbox")}
            (message_id, consumer, type, version, payload, partition_key, partition_epoch, partition_seq, status, last_error, received_at)
          VALUES (${id}, 'billing', 'orders.paid', 1, '{}', ${key}, ${EPOCH}, ${seq}, ${status}, ${lastError}, now() - interval '1 minute')`.execute(
        t.db,
      )
    await row("k1", "K", 1, "processed")
    await row("k2", "K", 2, "dead", "TypeError: boom")
    await row("k3", "K", 3, "pending")
    await row("l3", "L", 3, "pending")
    await row("u1", "U", 1, "dead", "no key order") // ordered, but nothing after it
    await sql`INSERT INTO ${sql.id(schema, "inbox")} (message_id, consumer, status) VALUES ('plain', 'billing', 'dead')`.execute(
      t.db,
    )
    await sql`INSERT INTO ${sql.id(schema, "inbox_cursors")} (consumer, partition_key, epoch, last_seq)
              VALUES ('billing', 'K', ${EPOCH}, 1), ('billing', 'L', ${EPOCH}, 1)`.execute(t.db)
  }
  const keysOf = async (schema: string) => {
    const run = await txbox(["status", ...on(schema), "--json"])
    expect(run.code).toBe(0)
    const byKey = new Map<string, { head: string; head_seq: number; next_seq: number; waiting: number }>()
    for (const k of JSON.parse(run.stdout).ordered_keys) byKey.set(k.partition_key, k)
    return byKey
  }

  test("status names each waiting key and what holds it: a dead head, a missing number", async () => {
    const schema = await freshSchema()
    await seed(schema)
    const keys = await keysOf(schema)
    expect(keys.get("K")).toMatchObject({ head: "dead", head_seq: 2, next_seq: 2, waiting: 2 })
    expect(keys.get("L")).toMatchObject({ head: "missing", head_seq: 3, next_seq: 2, waiting: 1 })
    expect(keys.get("U")).toMatchObject({ head: "dead", head_seq: 1, next_seq: 1, waiting: 1 })
    const table = await txbox(["status", ...on(schema)])
    expect(table.stdout).toContain("ORDERED KEY")
    expect(table.stdout).toContain("txbox dead skip --consumer billing --id k2")
    expect(table.stdout).toContain("waiting for #2 (not received)")
  })

  test("status knows a consumer that passes dead messages: its dead head does not block the key", async () => {
    const schema = await freshSchema()
    await seed(schema)
    await sql`INSERT INTO ${sql.id(schema, "inbox_consumers")} (consumer, on_ordered_dead) VALUES ('billing', 'skip')`.execute(
      t.db,
    )
    const keys = await keysOf(schema)
    // K's dead #2 is passed: its head is #3, which runs next. U's only row is dead: nothing waits.
    expect(keys.get("K")).toMatchObject({ head: "pending", head_seq: 3, waiting: 1 })
    expect(keys.has("U")).toBe(false)
    expect(keys.get("L")).toMatchObject({ head: "missing", head_seq: 3 })
  })

  test("dead skip moves the key past its dead head; the dead row stays; a second skip is refused", async () => {
    const schema = await freshSchema()
    await seed(schema)
    const run = await txbox(["dead", "skip", ...on(schema), "--consumer", "billing", "--id", "k2"])
    expect(run.stderr).toBe("")
    expect(run.code).toBe(0)
    expect(run.stdout).toContain("skipped #2 of key K")
    const cursor = await sql<{ last_seq: string }>`
      SELECT last_seq FROM ${sql.id(schema, "inbox_cursors")} WHERE consumer = 'billing' AND partition_key = 'K'`.execute(
      t.db,
    )
    expect(Number(cursor.rows[0]!.last_seq)).toBe(2)
    expect((await keysOf(schema)).get("K")).toMatchObject({ head: "pending", head_seq: 3, next_seq: 3 })
    const status = await sql<{ status: string }>`
      SELECT status FROM ${sql.id(schema, "inbox")} WHERE message_id = 'k2'`.execute(t.db)
    expect(status.rows[0]!.status).toBe("dead")

    const again = await txbox(["dead", "skip", ...on(schema), "--consumer", "billing", "--id", "k2"])
    expect(expectOneLineFailure(again, 1)).toContain("not the next message of key K")
    const plain = await txbox(["dead", "skip", ...on(schema), "--consumer", "billing", "--id", "plain"])
    expect(expectOneLineFailure(plain, 1)).toContain("not ordered")
    const pending = await txbox(["dead", "skip", ...on(schema), "--consumer", "billing", "--id", "k3"])
    expect(expectOneLineFailure(pending, 1)).toContain("pending, not dead")
  })
})

describe("txbox dead skip racing the processor", () => {
  test("a skip that decided while the processor moved the key further never moves the cursor back", async () => {
    const schema = await freshSchema()
    const EPOCH = 1_795_000_000_000
    await sql`INSERT INTO ${sql.id(schema, "inbox")}
                (message_id, consumer, type, version, payload, partition_key, partition_epoch, partition_seq, status, received_at)
              VALUES ('u1', 'billing', 'orders.paid', 1, '{}', 'U', ${EPOCH}, 1, 'dead', now())`.execute(t.db)
    // The processor (onOrderedDead "skip") handled #2 and #3 past the dead #1 and is committing
    // the key's first cursor as the skip reads it: the skip sees no cursor, so #1 is next.
    let skip: ReturnType<typeof txbox> | undefined
    await t.db.transaction().execute(async (trx) => {
      await sql`INSERT INTO ${sql.id(schema, "inbox_cursors")} (consumer, partition_key, epoch, last_seq)
                VALUES ('billing', 'U', ${EPOCH}, 3)`.execute(trx)
      skip = txbox(["dead", "skip", ...on(schema), "--consumer", "billing", "--id", "u1"])
      // Commit once the skip's cursor write waits on this transaction's row.
      await eventually("the skip to wait for the processor's cursor", async () => {
        const waiting = await sql<{ n: string }>`
          SELECT count(*) AS n FROM pg_stat_activity
          WHERE wait_event_type = 'Lock' AND query ILIKE '%inbox_cursors%'`.execute(t.db)
        return Number(waiting.rows[0]!.n) > 0
      })
    })
    const run = await skip!
    expect(run.stderr).toBe("")
    expect(run.code).toBe(0)
    const cursor = await sql<{ last_seq: string }>`
      SELECT last_seq FROM ${sql.id(schema, "inbox_cursors")} WHERE consumer = 'billing' AND partition_key = 'U'`.execute(
      t.db,
    )
    expect(Number(cursor.rows[0]!.last_seq)).toBe(3)
  })
})

describe("txbox purge --idle-keys", () => {
  test("deletes idle partition counters, and cursors idle twice as long with nothing left to handle", async () => {
    const schema = await freshSchema()
    const counters = sql.id(schema, "partition_counters")
    const cursors = sql.id(schema, "inbox_cursors")
    await sql`INSERT INTO ${counters} (partition_key, seq, updated_at) VALUES
      ('idle', 4, now() - interval '40 days'), ('busy', 9, now() - interval '1 day')`.execute(t.db)
    await sql`INSERT INTO ${cursors} (consumer, partition_key, epoch, last_seq, updated_at) VALUES
      ('billing', 'gone', 1, 3, now() - interval '70 days'),
      ('billing', 'waiting', 1, 3, now() - interval '70 days'),
      ('billing', 'recent', 1, 3, now() - interval '40 days')`.execute(t.db)
    await sql`INSERT INTO ${sql.id(schema, "inbox")} (message_id, consumer, partition_key, partition_epoch, partition_seq, status)
              VALUES ('w5', 'billing', 'waiting', 1, 5, 'pending')`.execute(t.db)
    const run = await txbox(["purge", ...on(schema), "--older-than", "8d", "--idle-keys", "30d", "--json"])
    expect(run.stderr).toBe("")
    expect(run.code).toBe(0)
    expect(JSON.parse(run.stdout)).toMatchObject({ partition_counters_deleted: 1, inbox_cursors_deleted: 1 })
    const left = await sql<{ k: string }>`
      SELECT partition_key AS k FROM ${counters} UNION ALL SELECT partition_key FROM ${cursors} ORDER BY 1`.execute(
      t.db,
    )
    expect(left.rows.map((r) => r.k)).toEqual(["busy", "recent", "waiting"])
    // The consumer's horizon (migration 0010): its cursors last moved before the cutoff may be gone.
    const horizon = await sql<{ h: string; cutoff: string }>`
      SELECT cursors_purged_before AS h,
             (extract(epoch FROM now() - interval '60 days') * 1000)::bigint AS cutoff
      FROM ${sql.id(schema, "inbox_consumers")} WHERE consumer = 'billing'`.execute(t.db)
    expect(Math.abs(Number(horizon.rows[0]!.h) - Number(horizon.rows[0]!.cutoff))).toBeLessThan(60_000)
  })

  test("an idle window shorter than the dedupe window is refused", async () => {
    const schema = await freshSchema()
    const run = await txbox(["purge", ...on(schema), "--older-than", "8d", "--idle-keys", "1d"])
    expect(expectOneLineFailure(run, 2)).toContain("refusing --idle-keys 1d")
  })
})

describe("txbox purge", () => {
  const DAY = 86_400

  test("deletes old sent and processed rows in batches, never pending or dead ones", async () => {
    const schema = await freshSchema()
    const old = 10 * DAY
    await insertOutbox(schema, [
      ...Array.from({ length: 5 }, () => ({
        type: "orders.placed",
        tenant: null,
        status: "sent" as const,
        publishedAgo: old,
        occurredAgo: old,
      })),
      { type: "orders.placed", tenant: null, status: "sent", publishedAgo: DAY },
      { type: "orders.placed", tenant: null, status: "pending", occurredAgo: old, visibleIn: -old },
      { type: "orders.placed", tenant: null, status: "dead", occurredAgo: old },
    ])
    await insertInbox(schema, [
      { id: "m1", consumer: "billing", status: "processed", processedAgo: old, receivedAgo: old },
      { id: "m2", consumer: "billing", status: "processed", processedAgo: old, receivedAgo: old },
      { id: "m3", consumer: "billing", status: "processed", processedAgo: DAY },
      { id: "m4", consumer: "billing", status: "pending", receivedAgo: old },
      { id: "m5", consumer: "billing", status: "dead", receivedAgo: old },
    ])
    const run = await txbox(["purge", ...on(schema), "--older-than", "7d", "--batch", "2"])
    expect(run.code).toBe(0)
    expect(run.stderr).toBe("")
    const [outboxLine, inboxLine] = run.stdout.trimEnd().split("\n")
    expect(outboxLine).toMatch(/^outbox: deleted 5 sent rows published before \d{4}-.*Z$/)
    expect(inboxLine).toMatch(/^inbox: deleted 2 processed rows processed before \d{4}-.*Z$/)

    expect(await countWhere(schema, "outbox", "sent")).toBe(1)
    expect(await countWhere(schema, "outbox", "pending")).toBe(1)
    expect(await countWhere(schema, "outbox", "dead")).toBe(1)
    expect(await countWhere(schema, "inbox", "processed")).toBe(1)
    expect(await countWhere(schema, "inbox", "pending")).toBe(1)
    expect(await countWhere(schema, "inbox", "dead")).toBe(1)

    // Nothing old is left: a second run deletes nothing.
    const again = await txbox(["purge", ...on(schema), "--older-than", "7d", "--json"])
    expect(JSON.parse(again.stdout)).toMatchObject({ outbox_sent_deleted: 0, inbox_processed_deleted: 0 })
  })

  test("refuses an inbox cutoff younger than the dedupe window, and deletes nothing", async () => {
    const schema = await freshSchema()
    await insertOutbox(schema, [
      { type: "orders.placed", tenant: null, status: "sent", publishedAgo: 2 * DAY },
    ])
    await insertInbox(schema, [{ id: "m1", consumer: "billing", status: "processed", processedAgo: 2 * DAY }])
    const run = await txbox(["purge", ...on(schema), "--older-than", "1d"])
    expect(expectOneLineFailure(run, 2)).toContain(
      "refusing to purge inbox rows younger than the dedupe window: --older-than 1d is less than --dedupe-window 7d",
    )
    expect(await countWhere(schema, "outbox", "sent")).toBe(1)
    expect(await countWhere(schema, "inbox", "processed")).toBe(1)

    // A shorter window the operator vouches for, or the outbox alone, is allowed.
    const outboxOnly = await txbox([
      "purge",
      ...on(schema),
      "--older-than",
      "1d",
      "--only",
      "outbox",
      "--json",
    ])
    expect(JSON.parse(outboxOnly.stdout)).toMatchObject({
      outbox_sent_deleted: 1,
      inbox_processed_deleted: null,
    })
    expect(await countWhere(schema, "inbox", "processed")).toBe(1)
    const window = await txbox([
      "purge",
      ...on(schema),
      "--older-than",
      "1d",
      "--dedupe-window",
      "1d",
      "--json",
    ])
    expect(JSON.parse(window.stdout)).toMatchObject({ outbox_sent_deleted: 0, inbox_processed_deleted: 1 })
  })
})

describe("txbox errors", () => {
  const SECRET = "hunter2-not-for-logs"

  test("a URL whose credentials are refused prints one line without the password", async () => {
    // A role that does not exist: refused whether the server checks passwords or trusts local
    // connections (the local test cluster does), so this holds on every test setup.
    const url = new URL(t.url)
    url.username = "txbox_nobody"
    url.password = SECRET
    const run = await txbox(["status", "--url", url.toString()])
    const line = expectOneLineFailure(run, 1)
    expect(line).toStartWith("txbox: cannot connect to the database: ")
    expect(line).toContain("txbox_nobody")
    expect(run.stderr).not.toContain(SECRET)
  })

  test("an unreachable database prints one line without the password, with either driver", async () => {
    for (const driver of ["postgres.js", "pg"]) {
      const run = await txbox([
        "status",
        "--driver",
        driver,
        "--url",
        `postgres://admin:${SECRET}@127.0.0.1:1/db`,
      ])
      expect(expectOneLineFailure(run, 1)).toStartWith("txbox: cannot connect to the database: ")
      expect(run.stderr).not.toContain(SECRET)
    }
  })

  test("a malformed URL is a usage error, redacted", async () => {
    const run = await txbox(["status", "--url", `postgres://admin:${SECRET}@host:notaport/db`])
    expect(expectOneLineFailure(run, 2)).toBe(
      "txbox: database URL is not a valid URL: postgres://***@host:notaport/db",
    )
  })

  test("no URL, a bad schema name, an unknown flag, a missing flag: usage errors (exit 2)", async () => {
    const [noUrl, badSchema, unknownFlag, missingFlag, badBatch] = await Promise.all([
      txbox(["status"]),
      txbox(["status", ...on("Bad-Name")]),
      txbox(["status", "--url", t.url, "--bogus"]),
      txbox(["purge", "--url", t.url]),
      txbox(["purge", "--url", t.url, "--older-than", "30d", "--batch", "0"]),
    ])
    expect(expectOneLineFailure(noUrl!, 2)).toBe("txbox: no database URL: pass --url or set DATABASE_URL")
    expect(expectOneLineFailure(badSchema!, 2)).toContain('schema name "Bad-Name" is not a valid identifier')
    expect(expectOneLineFailure(unknownFlag!, 2)).toBe(
      "txbox: Unrecognized flag: --bogus in command txbox status (see `txbox status --help`)",
    )
    expect(expectOneLineFailure(missingFlag!, 2)).toBe(
      "txbox: Missing required flag: --older-than (see `txbox purge --help`)",
    )
    expect(expectOneLineFailure(badBatch!, 2)).toBe("txbox: --batch must be a positive integer, got 0")
  })

  test("--help prints the commands and exits 0", async () => {
    const run = await txbox(["--help"])
    expect(run.code).toBe(0)
    for (const name of ["migrate", "status", "dead", "purge"])
      expect(run.stdout).toMatch(new RegExp(`^  ${name}\\s`, "m"))
  })
})
