// Node smoke suite (node:test), run by Node 22 from node_modules/.bin (`npm run test:node`) against
// the BUILT package: `txbox` resolves to this package itself through its `exports`, whose "default"
// condition is dist/ (Node matches neither "bun" nor "deno"). `npm run build` comes first.
// Named *.node.mjs so that `bun test` does not collect it.
import { test } from "node:test"
import * as txbox from "txbox"
import * as amqp from "txbox/amqp"
import * as postgres from "txbox/postgres"
import * as promise from "txbox/promise"
import { smokeEffect, smokePromise } from "./smoke.mjs"

const modules = { txbox, postgres, amqp, promise }

test("runs on dist/, not on the TypeScript sources", async () => {
  const resolved = import.meta.resolve("txbox")
  if (!resolved.endsWith("/dist/index.js")) throw new Error(`txbox resolved to ${resolved}`)
})

test("node-postgres: enqueue → relay → inbox end to end (Effect API)", () => smokeEffect(modules, "pg"))

test("postgres.js: enqueue → relay → inbox end to end (Promise facade)", () =>
  smokePromise(modules, "postgres.js"))
