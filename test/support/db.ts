// Per-test isolation on the shared servers: a database of its own per test file (or test), unique
// exchange and queue names on the broker.
import { randomBytes } from "node:crypto"
import postgres from "postgres"

function fromEnv(name: "TXBOX_TEST_DATABASE_URL" | "TXBOX_TEST_AMQP_URL"): string {
  const value = process.env[name]
  if (!value) {
    throw new Error(
      `${name} is not set: run the tests with \`bun test\` (bunfig.toml preloads test/support/preload.ts), ` +
        "or set it to a server you provide",
    )
  }
  return value
}

/** The PostgreSQL server's URL (its `postgres` database), as set by the preload. */
export const databaseUrl = (): string => fromEnv("TXBOX_TEST_DATABASE_URL")

/** The RabbitMQ URL, as set by the preload. */
export const amqpUrl = (): string => fromEnv("TXBOX_TEST_AMQP_URL")

/** `prefix` plus a random suffix: exchange and queue names that no other test (or run) uses. */
export function uniqueName(prefix: string): string {
  return `${prefix}-${Date.now().toString(36)}-${randomBytes(4).toString("hex")}`
}

export interface TestDatabase {
  /** The server URL with this database's name in the path. */
  readonly url: string
  readonly name: string
  /** `DROP DATABASE ... WITH (FORCE)`: open connections are cut. Safe to call twice. */
  drop(): Promise<void>
}

async function withAdmin<T>(body: (sql: postgres.Sql) => Promise<T>): Promise<T> {
  const sql = postgres(databaseUrl(), { max: 1, onnotice: () => {} })
  try {
    return await body(sql)
  } finally {
    await sql.end({ timeout: 5 })
  }
}

/** Creates an empty database with a unique name on the test server. */
export async function createTestDatabase(prefix = "txbox_test"): Promise<TestDatabase> {
  // Lower case and [a-z0-9_] only, so the name needs no quoting anywhere; 63 bytes is the limit.
  const safe = prefix
    .toLowerCase()
    .replace(/[^a-z0-9_]/g, "_")
    .slice(0, 40)
  const name = `${safe}_${Date.now().toString(36)}_${randomBytes(4).toString("hex")}`
  await withAdmin((sql) => sql.unsafe(`CREATE DATABASE "${name}"`))
  const url = new URL(databaseUrl())
  url.pathname = `/${name}`
  let dropped: Promise<void> | undefined
  return {
    url: url.toString(),
    name,
    drop: () => {
      dropped ??= withAdmin(async (sql) => {
        await sql.unsafe(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`)
      })
      return dropped
    },
  }
}
