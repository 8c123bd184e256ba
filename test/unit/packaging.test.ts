// Drivers as optional peers, the store over the app's own Kysely, and `layerConfig`: what a user
// meets when a driver is not installed or a setting comes from the environment. No server: nothing
// here connects (a bad setting fails before any connection, a missing driver before any pool).
import { describe, expect, test } from "bun:test"
import { Config, ConfigProvider, Effect, Exit, Layer, Schema } from "effect"
import { CamelCasePlugin, Kysely, PostgresAdapter, PostgresIntrospector, PostgresQueryCompiler } from "kysely"
import * as AmqpTransport from "../../src/amqpTransport.ts"
import { loadDriver, missingDriverMessage } from "../../src/drivers.ts"
import { ConfigError } from "../../src/Errors.ts"
import { Database } from "../../src/ports/Database.ts"
import * as KyselyStore from "../../src/storage/drivers/kysely/KyselyStore.ts"
import * as PgStore from "../../src/storage/drivers/pg/PgStore.ts"
import * as PgliteStore from "../../src/storage/drivers/pglite/PgliteStore.ts"
import * as PostgresJsStore from "../../src/storage/drivers/postgres-js/PostgresJsStore.ts"

/** What Node says for `import("pg")` when pg is not installed. */
const notInstalled = (name: string) =>
  Object.assign(new Error(`Cannot find package '${name}' imported from /app/node_modules/txbox/dist/x.js`), {
    code: "ERR_MODULE_NOT_FOUND",
  })

const failure = async <A, E>(effect: Effect.Effect<A, E>): Promise<E> => {
  const exit = await Effect.runPromiseExit(effect)
  if (Exit.isSuccess(exit)) throw new Error("expected a failure")
  const error = exit.cause.reasons.find((r) => r._tag === "Fail")
  if (error === undefined) throw new Error(`expected a typed failure, got ${String(exit.cause)}`)
  return (error as unknown as { error: E }).error
}

/** Builds a layer (in a scope closed right after) and returns its typed failure. */
const layerFailure = <A, E>(layer: Layer.Layer<A, E>, provider?: ConfigProvider.ConfigProvider) =>
  failure(
    Effect.scoped(
      Layer.build(provider === undefined ? layer : Layer.provide(layer, ConfigProvider.layer(provider))),
    ),
  )

describe("a driver that is not installed", () => {
  test("is a ConfigError naming the package and the command that installs it", async () => {
    const error = await failure(
      loadDriver({ name: "pg", entry: "txbox/pg", load: () => Promise.reject(notInstalled("pg")) }),
    )
    expect(error).toBeInstanceOf(ConfigError)
    expect(error.message).toContain('txbox/pg needs the "pg" package, which is not installed: npm i pg')
    expect(error.message).toContain("bun add pg")
    expect(error.message).toContain("deno add npm:pg")
  })

  test("Bun's and Deno's wording of a missing module are recognised too", () => {
    for (const text of [
      "Cannot find module 'postgres' from '/app/node_modules/txbox/src/storage/drivers/postgres-js/database.ts'",
      'Could not resolve "postgres"',
      'Relative import path "postgres" not prefixed with / or ./ or ../ and not in import map',
    ]) {
      const message = missingDriverMessage({ name: "postgres", entry: "txbox/postgres-js" }, new Error(text))
      expect(message).toContain("npm i postgres")
      expect(message).toMatch(/which is not installed|could not load/)
    }
  })

  test("another load failure still says which package and how to install it, with the cause", () => {
    const message = missingDriverMessage(
      { name: "@electric-sql/pglite", entry: "txbox/pglite" },
      new Error("WebAssembly.instantiate(): out of memory"),
    )
    expect(message).toBe(
      'txbox/pglite could not load "@electric-sql/pglite" (npm i @electric-sql/pglite installs it): WebAssembly.instantiate(): out of memory',
    )
  })

  test("a store's settings are checked before its driver is loaded", async () => {
    const error = await layerFailure(PgStore.layer({ url: "mysql://db/app" }))
    expect(error.message).toContain("database URL must start with postgres://")
    const bad = await layerFailure(PostgresJsStore.layer({ url: "mysql://db/app" }))
    expect(bad.message).toContain("database URL must start with postgres://")
  })

  test("a listenUrl is checked like the url, and its secret never shows", async () => {
    for (const store of [PgStore, PostgresJsStore]) {
      const error = await layerFailure(
        store.layer({ url: "postgres://db/app", listenUrl: "http://u:secret@db/app" }),
      )
      expect(error).toBeInstanceOf(ConfigError)
      expect(error.message).toBe("listenUrl must start with postgres:// (got http://)")
      const garbled = await layerFailure(
        store.layer({ url: "postgres://db/app", listenUrl: "postgres://u:secret@db:x/a" }),
      )
      expect(garbled.message).toStartWith("listenUrl is not a valid URL")
      expect(garbled.message).not.toContain("secret")
    }
  })
})

describe("layerConfig", () => {
  test("reads the URL as a Redacted from the ConfigProvider, validated like a plain one", async () => {
    const provider = ConfigProvider.fromUnknown({ DATABASE_URL: "http://user:secret@db/app" })
    for (const layer of [
      PgStore.layerConfig({ url: Config.Redacted("DATABASE_URL") }),
      PostgresJsStore.layerConfig({ url: Config.Redacted("DATABASE_URL"), poolSize: Config.succeed(2) }),
    ]) {
      const error = await layerFailure(layer, provider)
      expect(error).toBeInstanceOf(ConfigError)
      expect(error.message).toBe("database URL must start with postgres:// (got http://)")
      expect(error.message).not.toContain("secret")
    }
  })

  test("a missing setting is a ConfigError naming it", async () => {
    const error = await layerFailure(
      PgStore.layerConfig({ url: Config.Redacted("DATABASE_URL") }),
      ConfigProvider.fromUnknown({}),
    )
    expect(error).toBeInstanceOf(ConfigError)
    expect(error.message).toContain("configuration:")
    expect(error.message).toContain("DATABASE_URL")
  })

  test("a malformed setting is a ConfigError naming it", async () => {
    const error = await layerFailure(
      PgStore.layerConfig({ url: Config.Redacted("DATABASE_URL"), poolSize: Config.Int("DB_POOL") }),
      ConfigProvider.fromUnknown({ DATABASE_URL: "postgres://db/app", DB_POOL: "ten" }),
    )
    expect(error).toBeInstanceOf(ConfigError)
    expect(error.message).toContain("DB_POOL")
  })

  test("AmqpTransport.layerConfig reads a cluster's urls as a comma-separated list, each checked and named", async () => {
    const error = await layerFailure(
      AmqpTransport.layerConfig({ urls: Config.Array(Schema.RedactedFromValue(Schema.String), "AMQP_URLS") }),
      ConfigProvider.fromUnknown({ AMQP_URLS: "amqp://guest:secret@mq1,http://guest:secret@mq2" }),
    )
    expect(error).toBeInstanceOf(ConfigError)
    expect(error.message).toBe("amqp urls[1] must use amqp: or amqps:, got http:")
  })

  test("AmqpTransport.layerConfig and PgliteStore.layerConfig read theirs the same way", async () => {
    const amqp = await layerFailure(
      AmqpTransport.layerConfig({ url: Config.Redacted("AMQP_URL") }),
      ConfigProvider.fromUnknown({ AMQP_URL: "http://guest:guest@mq" }),
    )
    expect(amqp.message).toContain("amqp url must use amqp: or amqps:")
    const pglite = await layerFailure(
      PgliteStore.layerConfig({ schema: Config.String("TXBOX_SCHEMA") }),
      ConfigProvider.fromUnknown({ TXBOX_SCHEMA: "Not-An-Identifier" }),
    )
    expect(pglite).toBeInstanceOf(ConfigError)
    expect(pglite.message).toContain("Not-An-Identifier")
  })
})

describe("KyselyStore: the app's own Kysely", () => {
  // A Kysely that never connects: the store must not touch it while it is built.
  const offline = () =>
    new Kysely<unknown>({
      dialect: {
        createAdapter: () => new PostgresAdapter(),
        createDriver: () => {
          const refuse = () => Promise.reject(new Error("the store must not connect while it is built"))
          return {
            init: refuse,
            acquireConnection: refuse,
            beginTransaction: refuse,
            commitTransaction: refuse,
            rollbackTransaction: refuse,
            releaseConnection: refuse,
            destroy: refuse,
          }
        },
        createIntrospector: (db) => new PostgresIntrospector(db),
        createQueryCompiler: () => new PostgresQueryCompiler(),
      },
    })

  test("provides the Database over it, with its schema, and no LISTEN (polling)", async () => {
    const db = offline().withPlugin(new CamelCasePlugin())
    const shape = await Effect.runPromise(
      Effect.provide(
        Effect.gen(function* () {
          return yield* Database
        }),
        KyselyStore.layer({ db, schema: "billing_txbox" }),
      ),
    )
    // The app's Kysely without its plugins: txbox's statements compile and return as written.
    expect(shape.db.selectFrom("someTable").selectAll().compile().sql).toBe('select * from "someTable"')
    expect(shape.schema).toBe("billing_txbox")
    expect(shape.commitRefusesAborted).toBe(false)
  })

  test("refuses what is not a Kysely, and a bad schema name", async () => {
    expect((await layerFailure(KyselyStore.layer({ db: {} as never }))).message).toBe(
      "db must be a Kysely instance",
    )
    const bad = await layerFailure(KyselyStore.layer({ db: offline(), schema: "Bad-Name" }))
    expect(bad).toBeInstanceOf(ConfigError)
  })
})
