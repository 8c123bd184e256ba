// What Kysely's typed builder costs per statement, next to the same statement as a `sql` template:
// build + compile to SQL text, no database (a DummyDriver; nothing executes). Three ways: the
// builder building and compiling on every call; the builder compiled once, each call binding its
// parameters to the cached text (`prepare`, what the stores in storage/sql/SqlOutboxStore.ts and
// storage/sql/SqlInboxStore.ts do); and the hand-written `sql` template they replaced.
//
//   bun bench/builder.ts [--quick] [--iterations 20000] [--rounds 7] [--marks 100]
import {
  type CompiledQuery,
  DummyDriver,
  Kysely,
  PostgresAdapter,
  PostgresIntrospector,
  PostgresQueryCompiler,
  sql,
} from "kysely"
import { uuidv7 } from "../src/core/uuid.ts"
import type { InboxRow } from "../src/ports/InboxStore.ts"
import type { OutboxMark } from "../src/ports/OutboxStore.ts"
import type { TxboxDatabase } from "../src/ports/tables.ts"
import * as SqlInboxStore from "../src/storage/sql/SqlInboxStore.ts"
import * as SqlOutboxStore from "../src/storage/sql/SqlOutboxStore.ts"
import { log, main, median, parseArgs, printTable, round, writeResult } from "./support/harness.ts"

const args = parseArgs()
const quick = args.quick
const config = {
  iterations: args.number("iterations", quick ? 2_000 : 20_000),
  rounds: args.number("rounds", quick ? 3 : 7),
  /** Verdicts per mark: the JSON parameter is built on both sides, so it only adds the same to each. */
  marks: args.number("marks", 100),
  schema: "txbox",
}

// PostgreSQL's adapter and compiler over a driver that never connects: `.compile()` only.
// biome-ignore lint/suspicious/noExplicitAny: the stores receive the caller's Kysely<any> and narrow it
const base = new Kysely<any>({
  dialect: {
    createAdapter: () => new PostgresAdapter(),
    createDriver: () => new DummyDriver(),
    createIntrospector: (db) => new PostgresIntrospector(db),
    createQueryCompiler: () => new PostgresQueryCompiler(),
  },
})
// As the stores bind it: once, to txbox's schema.
const db = (base as Kysely<TxboxDatabase>).withSchema(config.schema)

// The templates are the hand-written statements the builder replaced (once storage/outboxSql.ts and
// storage/inboxSql.ts, since removed), compiled on the plain Kysely as those ran.
const outbox = sql.id(config.schema, "outbox")
const inbox = sql.id(config.schema, "inbox")

const claimTemplate = (limit: number, token: string, leaseMs: number): CompiledQuery =>
  sql`
      WITH due AS (
        SELECT id FROM ${outbox}
        WHERE status = 'pending' AND visible_at <= now()
        ORDER BY visible_at
        LIMIT ${limit}::int
        FOR UPDATE SKIP LOCKED
      )
      UPDATE ${outbox} AS o
      SET lock_token = ${token}::uuid, visible_at = now() + ${leaseMs}::int * interval '1 millisecond'
      FROM due WHERE o.id = due.id
      RETURNING o.id, o.type, o.version, o.payload::text AS payload, o.headers, o.routing_key,
                o.partition_key, o.tenant_id, o.occurred_at, o.attempts`.compile(base)

// The verdicts' JSON is the store's own (`markVerdicts`): only the statement around it differs.
const markTemplate = (token: string, marks: ReadonlyArray<OutboxMark>): CompiledQuery =>
  sql`
      UPDATE ${outbox} AS o SET
        status = u.status,
        attempts = o.attempts + u.inc,
        visible_at = CASE WHEN u.status = 'pending' THEN now() + u.delay_ms * interval '1 millisecond' ELSE o.visible_at END,
        published_at = CASE WHEN u.status = 'sent' THEN now() ELSE o.published_at END,
        last_error = COALESCE(u.error, o.last_error),
        lock_token = NULL
      FROM json_to_recordset(${SqlOutboxStore.markVerdicts(marks)}::text::json) AS u(id uuid, status text, delay_ms bigint, inc int, error text)
      WHERE o.id = u.id AND o.lock_token = ${token}::uuid AND o.status = 'pending'`.compile(base)

const insertProcessedTemplate = (row: InboxRow): CompiledQuery =>
  sql`
      INSERT INTO ${inbox}
        (message_id, consumer, type, version, payload, headers, partition_key, tenant_id, attempts, status, processed_at)
      VALUES (${row.key}, ${row.consumer}, ${row.type}, ${row.version}::int, ${row.payload}::text::jsonb,
              ${JSON.stringify(row.headers ?? {})}::text::jsonb, ${row.partitionKey}, ${row.tenantId},
              ${row.attempts}::int, 'processed', now())
      ON CONFLICT (message_id, consumer) DO NOTHING
      RETURNING message_id`.compile(base)

// What `Outbox.enqueue` builds for one event, per call (it is not cached: the caller's executor and
// the row count vary): the producer's share of the builder's cost.
const enqueueRow = {
  id: uuidv7(),
  type: "orders.order-placed",
  version: 1,
  payload: JSON.stringify({ orderId: uuidv7(), total: 12.5 }),
  headers: JSON.stringify({ traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" }),
  routing_key: null,
  partition_key: "customer-42",
  tenant_id: null,
}
const enqueueBuilder = (): CompiledQuery =>
  db
    .insertInto("outbox")
    .values({
      ...enqueueRow,
      payload: sql<unknown>`${enqueueRow.payload}::text::jsonb`,
      headers: sql<Record<string, string>>`${enqueueRow.headers}::text::jsonb`,
      visible_at: sql<Date>`now()`,
    })
    .compile()
const enqueueTemplate = (): CompiledQuery =>
  sql`
      INSERT INTO ${outbox} (id, type, version, payload, headers, routing_key, partition_key, tenant_id, visible_at)
      VALUES (${enqueueRow.id}, ${enqueueRow.type}, ${enqueueRow.version}, ${enqueueRow.payload}::text::jsonb,
              ${enqueueRow.headers}::text::jsonb, ${enqueueRow.routing_key}, ${enqueueRow.partition_key},
              ${enqueueRow.tenant_id}, now())`.compile(base)

const token = uuidv7()
const marks: OutboxMark[] = Array.from({ length: config.marks }, (_, i) => ({
  id: uuidv7(),
  verdict:
    i % 10 === 9
      ? { _tag: "Retry", delayMs: 1000, error: "broker said no", spendsAttempt: true }
      : { _tag: "Done" },
}))
const row: InboxRow = {
  key: uuidv7(),
  consumer: "billing",
  type: "orders.order-placed",
  version: 1,
  payload: JSON.stringify({ orderId: uuidv7(), total: 12.5, lines: [{ sku: "A-1", qty: 2 }] }),
  raw: null,
  headers: { traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" },
  partitionKey: "customer-42",
  tenantId: null,
  attempts: 1,
  lastError: null,
}

const outboxStatements = SqlOutboxStore.statements(db, config.schema)
const inboxStatements = SqlInboxStore.statements(db)
const processed = (r: InboxRow) => ({ ...r, headers: JSON.stringify(r.headers ?? {}), bound: null })

// The JSON parameter (mark) and the headers' JSON text (insertProcessed) are built on every side.
const statements = [
  {
    key: "claim",
    builder: () => SqlOutboxStore.claimQuery(db, { limit: 1000, token, leaseMs: 30_000, sinceMs: 3000 }),
    prepared: () => outboxStatements.claim({ limit: 1000, token, leaseMs: 30_000, sinceMs: 3000 }),
    template: () => claimTemplate(1000, token, 30_000),
  },
  {
    key: "mark",
    builder: () => SqlOutboxStore.markQuery(db, { token, verdicts: SqlOutboxStore.markVerdicts(marks) }),
    prepared: () => outboxStatements.mark({ token, verdicts: SqlOutboxStore.markVerdicts(marks) }),
    template: () => markTemplate(token, marks),
  },
  {
    key: "insertProcessed",
    builder: () => SqlInboxStore.insertProcessedQuery(db, processed(row)),
    prepared: () => inboxStatements.insertProcessed(processed(row)),
    template: () => insertProcessedTemplate(row),
  },
  {
    // Not compiled once: "builder, compiled once" is the per-call builder again.
    key: "enqueue",
    builder: enqueueBuilder,
    prepared: enqueueBuilder,
    template: enqueueTemplate,
  },
] as const

// The sink keeps the JIT from dropping a compile whose result nobody reads.
let sink = 0
/** Median over rounds of the mean µs per call, each round `iterations` calls. */
const perCallUs = (f: () => CompiledQuery): number => {
  for (let i = 0; i < Math.min(config.iterations, 5_000); i++) sink += f().sql.length
  const rounds: number[] = []
  for (let r = 0; r < config.rounds; r++) {
    const started = performance.now()
    for (let i = 0; i < config.iterations; i++) sink += f().sql.length
    rounds.push(((performance.now() - started) * 1000) / config.iterations)
  }
  return median(rounds)
}

main(async () => {
  log(`${config.iterations} calls × ${config.rounds} rounds per statement, ${config.marks} verdicts per mark`)
  const results = statements.map(({ key, builder, prepared, template }) => {
    // Interleaved twice, so a slower stretch of a shared machine lands on every side; the faster
    // pass counts.
    const runs = { template: [] as number[], builder: [] as number[], prepared: [] as number[] }
    for (let pass = 0; pass < 2; pass++) {
      runs.template.push(perCallUs(template))
      runs.builder.push(perCallUs(builder))
      runs.prepared.push(perCallUs(prepared))
    }
    const templateUs = Math.min(...runs.template)
    const builderUs = Math.min(...runs.builder)
    const preparedUs = Math.min(...runs.prepared)
    return {
      key,
      builderUs: round(builderUs, 2),
      preparedUs: round(preparedUs, 2),
      templateUs: round(templateUs, 2),
      builderOverheadUs: round(builderUs - templateUs, 2),
      preparedOverheadUs: round(preparedUs - templateUs, 2),
    }
  })
  if (sink === 0) throw new Error("nothing compiled")
  printTable(
    "Build + compile per call, µs (lower is better)",
    [
      "statement",
      "builder",
      "builder, compiled once",
      "sql template",
      "builder − template",
      "once − template",
    ],
    results.map((r) => [
      r.key,
      r.builderUs,
      r.preparedUs,
      r.templateUs,
      r.builderOverheadUs,
      r.preparedOverheadUs,
    ]),
  )
  const summary: Record<string, number> = {}
  for (const r of results) {
    summary[`${r.key}_builder_us`] = r.builderUs
    summary[`${r.key}_prepared_us`] = r.preparedUs
    summary[`${r.key}_template_us`] = r.templateUs
  }
  writeResult("builder", args, undefined, { summary, config, results })
})
