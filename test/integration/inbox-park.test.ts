// The inbox sweep's set-aside (`parkQuery`), read from the table: which ordered rows it takes off
// the front of `inbox_due` (their `visible_at` becomes infinity) and which it leaves, with many
// keys that move and a few that cannot. It judges each key once; asked once per waiting row, a
// backlog of 100 rows in each of 200 keys cost PostgreSQL over a second a sweep (issue #21's
// soak drain: bench/ordered.ts).
import { afterAll, beforeAll, beforeEach, expect, test } from "bun:test"
import type { ManagedRuntime } from "effect"
import { sql } from "kysely"
import { type InboxRow, InboxStore } from "../../src/ports/InboxStore.ts"
import type { TxboxStore } from "../../src/ports/stores.ts"
import { type MigratedDatabase, migratedDatabase, runtimeOf, storeLayer } from "../support/txbox.ts"

const CONSUMER = "parker"
const EPOCH = 1

let database: MigratedDatabase
let runtime: ManagedRuntime.ManagedRuntime<TxboxStore, never>

beforeAll(async () => {
  database = await migratedDatabase("inbox_park")
  runtime = runtimeOf(storeLayer(database.url))
})
afterAll(async () => {
  await runtime.dispose()
  await database.close()
})
beforeEach(async () => {
  await sql`TRUNCATE txbox.inbox, txbox.inbox_cursors`.execute(database.db)
})

const ordered = (key: string, partitionKey: string, seq: number): InboxRow => ({
  key,
  consumer: CONSUMER,
  type: "test.event",
  version: 1,
  payload: '{"n":1}',
  raw: null,
  headers: {},
  partitionKey,
  position: { epoch: EPOCH, seq },
  tenantId: null,
  attempts: 0,
  lastError: null,
})

const insert = (rows: ReadonlyArray<InboxRow>) =>
  runtime.runPromise(InboxStore.use((s) => s.insertPending(rows)))
const sweep = (onDead: "block" | "skip" = "block") =>
  runtime.runPromise(InboxStore.use((s) => s.sweep(CONSUMER, { onDead, waitedMs: 1_000 })))

/** The rows received a minute ago: past the sweep's wait. */
const age = () =>
  sql`UPDATE txbox.inbox SET received_at = now() - interval '1 minute', visible_at = now() - interval '1 minute'`.execute(
    database.db,
  )

/** Parked rows, by message id. */
const parked = async (): Promise<string[]> =>
  (
    await sql<{ message_id: string }>`
      SELECT message_id FROM txbox.inbox WHERE consumer = ${CONSUMER} AND visible_at = 'infinity'
      ORDER BY message_id`.execute(database.db)
  ).rows.map((r) => r.message_id)

test("keys whose head may go keep their backlog; keys missing their head have every waiting row set aside", async () => {
  const rows: InboxRow[] = []
  // 60 keys that move: numbers 1..20, the head (1) may go.
  for (let k = 0; k < 60; k++) for (let s = 1; s <= 20; s++) rows.push(ordered(`m${k}-${s}`, `m${k}`, s))
  // 5 keys that cannot: their 1 never came, 2..6 wait.
  for (let k = 0; k < 5; k++) for (let s = 2; s <= 6; s++) rows.push(ordered(`x${k}-${s}`, `x${k}`, s))
  await insert(rows)
  await age()
  // And one stuck key's row that came a moment ago: left alone until it has waited.
  await insert([ordered("x0-7", "x0", 7)])
  await sweep()
  const expected: string[] = []
  for (let k = 0; k < 5; k++) for (let s = 2; s <= 6; s++) expected.push(`x${k}-${s}`)
  expect(await parked()).toEqual(expected.sort())
})

test("a key whose cursor is past its head's wait moves; one whose cursor stops short is set aside", async () => {
  // Key A handled up to 4: its 5 may go. Key B handled up to 2: its 5 and 6 wait for 3 and 4.
  await sql`INSERT INTO txbox.inbox_cursors (consumer, partition_key, epoch, last_seq)
            VALUES (${CONSUMER}, 'A', ${EPOCH}, 4), (${CONSUMER}, 'B', ${EPOCH}, 2)`.execute(database.db)
  await insert([ordered("a5", "A", 5), ordered("a6", "A", 6), ordered("b5", "B", 5), ordered("b6", "B", 6)])
  await age()
  await sweep()
  expect(await parked()).toEqual(["b5", "b6"])
})

test('a dead head holds its key under "block" (set aside); under "skip" the row after it goes', async () => {
  await insert([ordered("d2", "D", 2), ordered("d3", "D", 3)])
  await runtime.runPromise(InboxStore.use((s) => s.insertDead([ordered("d1", "D", 1)])))
  await age()
  await sweep("block")
  expect(await parked()).toEqual(["d2", "d3"])
  // Under "skip" the next sweep brings d2 back (it may go past its dead predecessor); d3 waits
  // for d2, set aside until d2's mark brings it back.
  expect(await sweep("skip")).toBe(1)
  expect(await parked()).toEqual(["d3"])
})
