// Deno smoke suite (Deno.test), run by Deno from node_modules/.bin (`npm run test:deno`) on the
// TypeScript sources as they are, with npm packages from node_modules (package.json present, so
// Deno resolves bare specifiers there). Named *.deno.ts so that `bun test` does not collect it;
// tsconfig.json leaves it out too (Deno's globals), and `deno test` type-checks it instead.
import * as amqp from "../../src/amqp.ts"
import * as txbox from "../../src/index.ts"
import * as postgres from "../../src/postgres.ts"
import * as promise from "../../src/promise/index.ts"
import { smokeEffect, smokePromise } from "./smoke.mjs"

const modules = { txbox, postgres, amqp, promise }

Deno.test("node-postgres: enqueue → relay → inbox end to end (Effect API)", () => smokeEffect(modules, "pg"))

Deno.test("postgres.js: enqueue → relay → inbox end to end (Promise facade)", () =>
  smokePromise(modules, "postgres.js"))
