// Node smoke suite (node:test), run by Node 22 from node_modules/.bin (`npm run test:node`) against
// the BUILT package: `txbox` resolves to this package itself through its `exports`, whose "default"
// condition is dist/ (Node does not match "bun"). `npm run build` comes first.
// Named *.node.mjs so that `bun test` does not collect it.
import { test } from "node:test"
import pg from "pg"
import postgres from "postgres"
import * as txbox from "txbox"
import * as amqp from "txbox/amqp"
import { KyselyStore, migrate } from "txbox/kysely"
import { PgStore } from "txbox/pg"
import { PostgresJsDialect, PostgresJsStore } from "txbox/postgres-js"
import * as promise from "txbox/promise"
import { pgApp, postgresJsApp, smokeEffect, smokePromise } from "./smoke.mjs"

const modules = { txbox, amqp, promise, migrate }

test("runs on dist/, not on the TypeScript sources", async () => {
  const resolved = import.meta.resolve("txbox")
  if (!resolved.endsWith("/dist/index.js")) throw new Error(`txbox resolved to ${resolved}`)
})

test("txbox/pg (node-postgres): enqueue → relay → inbox end to end (Effect API)", () =>
  smokeEffect(modules, pgApp(pg), ({ url }) => PgStore.layer({ url, poolSize: 2 })))

test("txbox/postgres-js: enqueue → relay → inbox end to end (Promise facade)", () =>
  smokePromise(modules, postgresJsApp(postgres, PostgresJsDialect), ({ url }) =>
    PostgresJsStore.layer({ url, poolSize: 2 }),
  ))

test("txbox/kysely over the app's own Kysely: enqueue → relay → inbox end to end", () =>
  smokeEffect(modules, pgApp(pg), ({ db }) => KyselyStore.layer({ db })))
