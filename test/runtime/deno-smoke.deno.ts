// Deno smoke suite (Deno.test), run by Deno from node_modules/.bin (`npm run test:deno`) on the
// TypeScript sources as they are, with npm packages from node_modules (package.json present, so
// Deno resolves bare specifiers there). Named *.deno.ts so that `bun test` does not collect it;
// tsconfig.json leaves it out too (Deno's globals), and `deno test` type-checks it instead. The
// package as a Deno user installs it (from npm, and the JSR entry) is tested by pack.test.ts.
import pg from "pg"
import postgres from "postgres"
import * as amqp from "../../src/amqp.ts"
import * as txbox from "../../src/index.ts"
import { migrate } from "../../src/kysely.ts"
import { PgStore } from "../../src/pg.ts"
import { PostgresJsDialect, PostgresJsStore } from "../../src/postgres-js.ts"
import * as promise from "../../src/promise/index.ts"
import { pgApp, postgresJsApp, smokeEffect, smokePromise } from "./smoke.mjs"

const modules = { txbox, amqp, promise, migrate }

Deno.test("node-postgres: enqueue → relay → inbox end to end (Effect API)", () =>
  smokeEffect(modules, pgApp(pg), ({ url }: { url: string }) => PgStore.layer({ url, poolSize: 2 })))

Deno.test("postgres.js: enqueue → relay → inbox end to end (Promise facade)", () =>
  smokePromise(modules, postgresJsApp(postgres, PostgresJsDialect), ({ url }: { url: string }) =>
    PostgresJsStore.layer({ url, poolSize: 2 }),
  ))
