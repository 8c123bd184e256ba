import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { spawn } from "node:child_process"
import { Effect, Exit, Layer } from "effect"
import { Kysely, sql } from "kysely"
import { PostgresJSDialect } from "kysely-postgres-js"
import pg from "pg"
import postgres from "postgres"
import * as Outbox from "../../src/Outbox.ts"
import { Database, TxboxSchema } from "../../src/ports/Database.ts"
import * as PgStore from "../../src/storage/drivers/pg/PgStore.ts"
import { migrations } from "../../src/storage/sql/migrations.generated.ts"
import { migrate, pending } from "../../src/storage/sql/migrator.ts"
import { OrderPlaced } from "../fixtures/orders-v1.ts"
import { createTestDatabase, type TestDatabase } from "../support/db.ts"
import { storeOf } from "../support/txbox.ts"

let test_db: TestDatabase
// biome-ignore lint/suspicious/noExplicitAny: reads of catalog tables
let db: Kysely<any>

beforeAll(async () => {
  test_db = await createTestDatabase("migrations")
  db = new Kysely({
    dialect: new PostgresJSDialect({ postgres: postgres(test_db.url, { max: 4, onnotice: () => {} }) }),
  })
})
afterAll(async () => {
  await db.destroy()
  await test_db.drop()
})

const tablesIn = async (schema: string) =>
  (
    await sql<{ table_name: string }>`
      SELECT table_name FROM information_schema.tables WHERE table_schema = ${schema} ORDER BY table_name`.execute(
      db,
    )
  ).rows.map((r) => r.table_name)

const runChild = (args: string[]) =>
  new Promise<string>((resolve, reject) => {
    const child = spawn(process.execPath, ["test/fixtures/migrate.ts", ...args], {
      stdio: ["ignore", "pipe", "pipe"],
    })
    let out = ""
    let err = ""
    child.stdout.on("data", (d) => (out += d))
    child.stderr.on("data", (d) => (err += d))
    child.on("exit", (code) => (code === 0 ? resolve(out.trim()) : reject(new Error(`exit ${code}: ${err}`))))
  })

describe("migrations", () => {
  test("the first run applies every migration and creates the tables", async () => {
    const result = await Effect.runPromise(migrate(db, { schema: "first" }))
    expect(result.applied.map((m) => m.version)).toEqual(migrations.map((m) => m.version))
    expect(await tablesIn("first")).toEqual([
      "housekeeping_leases",
      "inbox",
      "inbox_archive",
      "inbox_bindings",
      "inbox_consumers",
      "inbox_cursors",
      "inbox_default",
      "outbox",
      "outbox_archive",
      "outbox_default",
      "partition_counters",
      "txbox_migrations",
    ])
  })

  test("a second run applies nothing", async () => {
    await Effect.runPromise(migrate(db, { schema: "twice" }))
    const again = await Effect.runPromise(migrate(db, { schema: "twice" }))
    expect(again.applied).toEqual([])
    const recorded = await sql<{ n: string }>`SELECT count(*) AS n FROM twice.txbox_migrations`.execute(db)
    expect(Number(recorded.rows[0]!.n)).toBe(migrations.length)
  })

  test("two processes migrating at once: one applies, the other finds nothing to do", async () => {
    const outputs = await Promise.all([runChild([test_db.url, "racing"]), runChild([test_db.url, "racing"])])
    const applied = outputs.map((o) => JSON.parse(o) as number[])
    expect(applied.flat().sort((a, b) => a - b)).toEqual(migrations.map((m) => m.version))
    expect(await tablesIn("racing")).toEqual([
      "housekeeping_leases",
      "inbox",
      "inbox_archive",
      "inbox_bindings",
      "inbox_consumers",
      "inbox_cursors",
      "inbox_default",
      "outbox",
      "outbox_archive",
      "outbox_default",
      "partition_counters",
      "txbox_migrations",
    ])
  })

  test("dry run lists pending migrations and creates nothing", async () => {
    const list = await Effect.runPromise(pending(db, { schema: "dry" }))
    expect(list.map((m) => m.version)).toEqual(migrations.map((m) => m.version))
    const schemas = await sql`SELECT 1 FROM information_schema.schemata WHERE schema_name = 'dry'`.execute(db)
    expect(schemas.rows).toHaveLength(0)
  })

  test("an edited migration that was already applied is refused", async () => {
    await Effect.runPromise(migrate(db, { schema: "edited" }))
    const changed = migrations.map((m, i) => (i === 0 ? { ...m, sql: `${m.sql}\n-- edited` } : m))
    const exit = await Effect.runPromiseExit(migrate(db, { schema: "edited", migrations: changed }))
    expect(Exit.isFailure(exit)).toBe(true)
    expect(String(Exit.isFailure(exit) && exit.cause)).toContain("was changed after it was applied")
  })

  test("a bad schema name is a ConfigError and touches nothing", async () => {
    const exit = await Effect.runPromiseExit(migrate(db, { schema: 'x"; DROP SCHEMA first CASCADE; --' }))
    expect(Exit.isFailure(exit)).toBe(true)
    expect(String(Exit.isFailure(exit) && exit.cause)).toContain("not a valid identifier")
    expect(await tablesIn("first")).toContain("outbox")
  })
})

describe("the PostgreSQL store", () => {
  const connectionsNamedTxbox = async () =>
    Number(
      (
        await sql<{ n: string }>`
          SELECT count(*) AS n FROM pg_stat_activity WHERE application_name LIKE 'txbox/%' AND datname = ${test_db.name}`.execute(
          db,
        )
      ).rows[0]!.n,
    )

  for (const driver of ["postgres.js", "pg"] as const) {
    test(`with ${driver}: queries run, and closing the layer closes its pool`, async () => {
      const program = Effect.gen(function* () {
        const store = yield* Database
        const result = yield* Effect.promise(() =>
          sql<{
            v: string
            app: string
          }>`SELECT version() AS v, current_setting('application_name') AS app`.execute(store.db),
        )
        expect(result.rows[0]!.v).toContain("PostgreSQL")
        expect(result.rows[0]!.app).toBe(`txbox/${driver}`)
        return yield* Effect.promise(connectionsNamedTxbox)
      })
      const open = await Effect.runPromise(
        Effect.provide(program, storeOf(driver).layer({ url: test_db.url, listen: false })),
      )
      expect(open).toBeGreaterThan(0)
      // Pools end connections asynchronously after destroy; give the server a moment to notice.
      const deadline = Date.now() + 5000
      while ((await connectionsNamedTxbox()) > 0 && Date.now() < deadline) await Bun.sleep(50)
      expect(await connectionsNamedTxbox()).toBe(0)
    })

    test(`with ${driver}: a connection failure never shows the password`, async () => {
      const url = new URL(test_db.url)
      url.username = "nobody"
      url.password = "s3cr3t-pw"
      const exit = await Effect.runPromiseExit(
        Effect.provide(
          Effect.gen(function* () {
            const store = yield* Database
            return yield* Effect.tryPromise(() => sql`SELECT 1`.execute(store.db))
          }),
          Layer.orDie(
            storeOf(driver).layer({ url: url.toString(), listen: false, connectTimeoutSeconds: 2 }),
          ),
        ),
      )
      expect(Exit.isFailure(exit)).toBe(true)
      expect(JSON.stringify(exit)).not.toContain("s3cr3t-pw")
    })
  }

  test("bad configuration is a ConfigError naming the problem", async () => {
    for (const [config, message] of [
      [{ url: "not a url" }, "not a valid URL"],
      [{ url: "mysql://x@y/z" }, "must start with postgres://"],
      [{ url: test_db.url, poolSize: 0 }, "poolSize"],
      [{ url: test_db.url, schema: "Bad-Name" }, "not a valid identifier"],
    ] as const) {
      const exit = await Effect.runPromiseExit(Effect.provide(Effect.void, PgStore.layer(config)))
      expect(String(Exit.isFailure(exit) && exit.cause)).toContain(message)
    }
  })
})

describe("a txbox newer than its schema", () => {
  test("enqueue on a schema without migration 0013 (or without txbox's tables) fails saying `txbox migrate`, and writes nothing", async () => {
    const before13 = migrations.filter((m) => m.version < 13)
    await Effect.runPromise(migrate(db, { schema: "behind", migrations: before13 }))
    const client = new pg.Client({ connectionString: test_db.url })
    await client.connect()
    try {
      const enqueueIn = (schema: string, executor: Outbox.Executor) =>
        Effect.runPromiseExit(
          Effect.provideService(
            Outbox.enqueue(executor, OrderPlaced, {
              orderId: crypto.randomUUID(),
              total: 1,
              currency: "EUR",
            }),
            TxboxSchema,
            schema,
          ),
        )
      for (const schema of ["behind", "no_tables"]) {
        // Through Kysely and through a node-postgres client, each in the caller's transaction.
        const viaKysely = await db.transaction().execute((trx) => enqueueIn(schema, trx))
        await client.query("BEGIN")
        const viaClient = await enqueueIn(schema, client)
        await client.query("ROLLBACK")
        for (const exit of [viaKysely, viaClient]) {
          const failure = Exit.isFailure(exit) ? String(exit.cause) : "succeeded"
          expect(failure).toContain("StoreError")
          expect(failure).toContain("run `txbox migrate`")
        }
      }
      const rows = await sql<{ n: number }>`SELECT count(*)::int AS n FROM behind.outbox`.execute(db)
      expect(rows.rows[0]!.n).toBe(0)
    } finally {
      await client.end()
    }
  })
})
