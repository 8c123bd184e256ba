// `txbox reconcile` (issue #28) as an operator runs it: a child process against real PostgreSQL,
// judged by its output and exit code. First behind a real pipeline (outbox, relay, RabbitMQ, inbox)
// whose consumer then loses rows, then on rows written with SQL across two databases.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect, Exit, Layer, ManagedRuntime, Scope } from "effect"
import { sql } from "kysely"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import * as Inbox from "../../src/Inbox.ts"
import * as Outbox from "../../src/Outbox.ts"
import * as Relay from "../../src/Relay.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { runTxbox } from "../support/cli.ts"
import { amqpUrl, uniqueName } from "../support/db.ts"
import { eventually, type MigratedDatabase, migratedDatabase, storeLayer } from "../support/txbox.ts"

const txbox = (args: ReadonlyArray<string>) => runTxbox(args, { unset: ["DATABASE_URL"] })

const OrderPlaced = defineEvent({
  type: "orders.order-placed",
  version: 1,
  schema: v.object({ n: v.number() }),
})

let producer: MigratedDatabase
let consumerSide: MigratedDatabase
beforeAll(async () => {
  ;[producer, consumerSide] = await Promise.all([
    migratedDatabase("reconcile"),
    migratedDatabase("reconcile_in"),
  ])
})
afterAll(async () => {
  await Promise.all([producer.close(), consumerSide.close()])
})

describe("txbox reconcile", () => {
  test("behind a real pipeline: the messages a consumer lost or let die are reported with their ids; younger ones are in flight", async () => {
    const exchange = uniqueName("reconcile")
    const consumer = uniqueName("billing")
    // The handler fails for good (one attempt) on message n = 7: a dead inbox row.
    const handler = Inbox.handler(OrderPlaced, ({ payload }) =>
      payload.n === 7 ? Effect.fail(new Error("refused")) : Effect.void,
    )
    const runtime = ManagedRuntime.make(
      Layer.mergeAll(
        storeLayer(producer.url),
        Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange, publishTimeout: "3 seconds" })),
      ),
    )
    const scope = await runtime.runPromise(Scope.make())
    const enqueue = (ns: ReadonlyArray<number>) =>
      producer.db.transaction().execute((trx) =>
        Effect.runPromise(
          Outbox.enqueueMany(
            trx,
            ns.map((n) => ({
              contract: OrderPlaced,
              payload: { n },
              options: { tenantId: n % 2 === 0 ? "acme" : "globex" },
            })),
          ),
        ),
      )
    let written: ReadonlyArray<{ id: string }> = []
    try {
      await runtime.runPromise(
        Effect.gen(function* () {
          yield* Inbox.make({ consumer, handlers: [handler], retry: { maxAttempts: 1 } })
          yield* Relay.make({ pollInterval: "100 millis" })
        }).pipe(Scope.provide(scope)),
      )
      written = await enqueue(Array.from({ length: 30 }, (_, n) => n))
      await eventually("the consumer has settled all 30", async () => {
        const { rows } = await sql<{ n: string }>`SELECT count(*) AS n FROM txbox.inbox
          WHERE consumer = ${consumer} AND status IN ('processed', 'dead')`.execute(producer.db)
        return Number(rows[0]!.n) === 30
      })
    } finally {
      await runtime.runPromise(Scope.close(scope, Exit.void))
      await runtime.dispose()
    }
    // The consumer loses two of its rows (a restore from an old backup, say), and the 30 messages
    // become an hour old; then three more are enqueued with no relay running.
    const lost = [written[3]!.id, written[12]!.id]
    await sql`DELETE FROM txbox.inbox WHERE consumer = ${consumer} AND message_id = ANY(${lost})`.execute(
      producer.db,
    )
    await sql`UPDATE txbox.outbox SET occurred_at = occurred_at - interval '1 hour'
      WHERE id = ANY(${written.map((w) => w.id)}::uuid[])`.execute(producer.db)
    const young = await enqueue([100, 101, 102])

    const run = await txbox([
      "reconcile",
      ...["--url", producer.url, "--consumer", consumer, "--grace", "10m", "--json"],
    ])
    expect(run.stderr).toContain(`3 message(s) owed to ${consumer} for longer than 10m 0s have no effect`)
    expect(run.code).toBe(1)
    const report = JSON.parse(run.stdout)
    expect([report.owed, report.processed, report.inFlight, report.missing]).toEqual([33, 27, 3, 3])
    const missing = report.groups.flatMap(
      (g: { missingIds: Array<{ id: string; reason: string }> }) => g.missingIds,
    )
    expect(missing.sort((a: { id: string }, b: { id: string }) => a.id.localeCompare(b.id))).toEqual(
      [
        { id: lost[0], reason: "not received" },
        { id: lost[1], reason: "not received" },
        { id: written[7]!.id, reason: "dead" },
      ].sort((a, b) => a.id!.localeCompare(b.id!)),
    )
    // Per tenant: n = 3 and 7 are globex's, 12 acme's; the young ones are in flight.
    // Summed over the day buckets: within an hour after midnight (UTC) the hour-old messages are
    // the day before's.
    const byTenant: Record<string, [number, number]> = {}
    for (const g of report.groups as Array<{ tenant: string; missing: number; inFlight: number }>) {
      const [missingSoFar, inFlightSoFar] = byTenant[g.tenant] ?? [0, 0]
      byTenant[g.tenant] = [missingSoFar + g.missing, inFlightSoFar + g.inFlight]
    }
    expect(byTenant).toEqual({ acme: [1, 2], globex: [2, 1] })
    expect(young).toHaveLength(3)

    // The table names each missing id and why.
    const text = await txbox(["reconcile", "--url", producer.url, "--consumer", consumer, "--grace", "10m"])
    expect(text.code).toBe(1)
    expect(text.stdout).toContain(`${lost[0]}  orders.order-placed`)
    expect(text.stdout).toMatch(new RegExp(`${written[7]!.id}\\s+orders.order-placed\\s+globex\\s+dead`))
    expect(text.stdout).toContain("owed 33, processed 27, in flight 3, missing 3")
  }, 120_000)

  test("across two databases: only what the bindings routed after they existed is owed; nothing missing exits 0", async () => {
    const consumer = "audit"
    await sql`INSERT INTO txbox.inbox_bindings (consumer, pattern, bound_at) VALUES
      (${consumer}, 'shop.*', now() - interval '2 hours'),
      (${consumer}, 'payments.#', now() - interval '10 minutes')`.execute(consumerSide.db)
    const row = (
      name: string,
      type: string,
      { ago, publishedAgo, status }: { ago: string; publishedAgo?: string; status: "sent" | "pending" },
    ) =>
      sql`INSERT INTO txbox.outbox (id, type, version, payload, tenant_id, occurred_at, status, published_at)
        VALUES (gen_random_uuid(), ${type}, 1, json_build_object('name', ${name}::text), 'acme',
          now() - ${ago}::interval, ${status},
          ${publishedAgo === undefined ? null : sql`now() - ${publishedAgo}::interval`})`.execute(producer.db)
    await row("a", "shop.placed", { ago: "1 hour", publishedAgo: "1 hour", status: "sent" })
    await row("b", "shop.placed", { ago: "1 hour", publishedAgo: "59 minutes", status: "sent" })
    await row("c", "payments.refund.issued", { ago: "1 hour", publishedAgo: "1 hour", status: "sent" })
    await row("d", "payments.captured", { ago: "6 minutes", publishedAgo: "5 minutes", status: "sent" })
    await row("e", "shipping.sent", { ago: "1 hour", publishedAgo: "1 hour", status: "sent" })
    await row("f", "shop.placed", { ago: "1 minute", status: "pending" })
    // gen_random_uuid() is no UUIDv7: give each id the time bits of a second ago, as enqueue would
    // have (the window is a range of ids).
    await sql`UPDATE txbox.outbox SET id = (
        lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - 1000), 12, '0') || substr(replace(id::text, '-', ''), 13)
      )::uuid`.execute(producer.db)
    const { rows } = await sql<{ id: string; name: string; type: string }>`
      SELECT id::text, payload->>'name' AS name, type FROM txbox.outbox`.execute(producer.db)
    // The consumer processed a, b and d, in its own database.
    const processed = rows.filter((r) => ["a", "b", "d"].includes(r.name))
    await sql`INSERT INTO txbox.inbox (message_id, consumer, type, status, processed_at)
      SELECT id, ${consumer}, type, 'processed', now()
      FROM (VALUES ${sql.join(processed.map((r) => sql`(${r.id}, ${r.type})`))}) AS v(id, type)`.execute(
      consumerSide.db,
    )

    const run = await txbox([
      "reconcile",
      ...["--url", producer.url, "--inbox-url", consumerSide.url, "--consumer", consumer],
      ...["--grace", "3m", "--json"],
    ])
    expect(run.stderr).toBe("")
    expect(run.code).toBe(0)
    const report = JSON.parse(run.stdout)
    // a, b, d owed and processed; c published before payments.# was bound, e never bound: not owed;
    // f (pending, a minute old) is in flight.
    expect([report.owed, report.processed, report.inFlight, report.missing]).toEqual([4, 3, 1, 0])
    // Summed over the day buckets (within an hour after midnight, UTC, the hour-old rows are the
    // day before's).
    const owedByType: Record<string, number> = {}
    for (const g of report.groups as Array<{ type: string; owed: number }>)
      owedByType[g.type] = (owedByType[g.type] ?? 0) + g.owed
    expect(owedByType).toEqual({ "payments.captured": 1, "shop.placed": 3 })
  }, 60_000)

  test("a consumer that never started, and a bad flag, are clear failures", async () => {
    const never = await txbox(["reconcile", "--url", producer.url, "--consumer", "nobody"])
    expect(never.code).toBe(1)
    expect(never.stderr).toContain("consumer nobody has no bindings in schema txbox")
    const bad = await txbox(["reconcile", "--url", producer.url, "--consumer", "x", "--grace", "10"])
    expect(bad.code).toBe(2)
    expect(bad.stderr).toContain('--grace "10" is not a duration')
  }, 30_000)
})
