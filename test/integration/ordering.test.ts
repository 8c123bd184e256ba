// Per-key order end to end on real PostgreSQL and RabbitMQ: producers number each key's messages in
// commit order, the relay publishes, and the inbox hands each key's messages to its handler strictly
// in that order — through concurrent producers, two relay workers, two consumers, handler failures,
// duplicates and deliveries reordered on purpose. Counted from the table the handlers write.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect, Layer, ManagedRuntime } from "effect"
import { sql } from "kysely"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import { uuidv7 } from "../../src/core/uuid.ts"
import * as Inbox from "../../src/Inbox.ts"
import * as Outbox from "../../src/Outbox.ts"
import { Database } from "../../src/ports/Database.ts"
import { type OutgoingMessage, Transport } from "../../src/ports/Transport.ts"
import * as Relay from "../../src/Relay.ts"
import { cutoff, purgeIdleCursors, redriveDead } from "../../src/storage/sql/operations.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { amqpUrl, uniqueName } from "../support/db.ts"
import {
  eventually,
  type MigratedDatabase,
  migratedDatabase,
  publishConfirmed,
  storeLayer,
} from "../support/txbox.ts"

const Step = defineEvent({
  type: "ordering.step",
  version: 1,
  schema: v.object({ key: v.string(), label: v.string() }),
})

let t: MigratedDatabase
beforeAll(async () => {
  t = await migratedDatabase("ordering")
  await sql`CREATE TABLE seen (id bigserial PRIMARY KEY, consumer text, key text, seq int, label text)`.execute(
    t.db,
  )
})
afterAll(async () => {
  await t.close()
})

/** Each key's handled sequence numbers and labels, in the order the handlers committed them. */
const seenByKey = async (consumer: string) => {
  const rows = await sql<{ key: string; seq: number; label: string }>`
    SELECT key, seq, label FROM seen WHERE consumer = ${consumer} ORDER BY id`.execute(t.db)
  const byKey = new Map<string, { seqs: number[]; labels: string[] }>()
  for (const r of rows.rows) {
    const entry = byKey.get(r.key) ?? { seqs: [], labels: [] }
    entry.seqs.push(r.seq)
    entry.labels.push(r.label)
    byKey.set(r.key, entry)
  }
  return byKey
}

/** Rows the handlers of `consumer` wrote, those whose label matches `label` (a LIKE pattern). */
const handledCount = async (consumer: string, label = "%") =>
  Number(
    (
      await sql<{ n: string }>`
        SELECT count(*) AS n FROM seen WHERE consumer = ${consumer} AND label LIKE ${label}`.execute(t.db)
    ).rows[0]!.n,
  )

const startInbox = (
  exchange: string,
  consumer: string,
  options: {
    failRate?: number
    refuse?: (label: string) => boolean
    mode?: Inbox.InboxConfig["mode"]
    onOrderedDead?: Inbox.InboxConfig["onOrderedDead"]
    pollInterval?: Inbox.InboxConfig["pollInterval"]
    dedupeKey?: (payload: { readonly key: string; readonly label: string }) => string
  } = {},
) =>
  ManagedRuntime.make(
    Inbox.layer({
      consumer,
      ...(options.mode ? { mode: options.mode } : {}),
      ...(options.onOrderedDead ? { onOrderedDead: options.onOrderedDead } : {}),
      pollInterval: options.pollInterval ?? "200 millis",
      retry: { initialDelay: "50 millis", maxDelay: "200 millis", maxAttempts: options.refuse ? 2 : 20 },
      handlers: [
        Inbox.handler(
          Step,
          ({ payload, envelope, trx }) =>
            options.refuse?.(payload.label) || Math.random() < (options.failRate ?? 0)
              ? Effect.fail(new Error(`refusing ${payload.label}`))
              : Effect.promise(() =>
                  sql`INSERT INTO seen (consumer, key, seq, label)
                    VALUES (${consumer}, ${payload.key}, ${envelope.position?.seq ?? null}, ${payload.label})`.execute(
                    trx,
                  ),
                ),
          options.dedupeKey ? { dedupeKey: options.dedupeKey } : {},
        ),
      ],
    }).pipe(
      Layer.provide(
        Layer.mergeAll(storeLayer(t.url), Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange }))),
      ),
    ),
  )

/** A relay on the test database publishing to `exchange`. */
const startRelay = (exchange: string, config: Relay.RelayConfig = { pollInterval: "100 millis" }) =>
  ManagedRuntime.make(
    Relay.layer(config).pipe(
      Layer.provide(
        Layer.mergeAll(storeLayer(t.url), Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange }))),
      ),
    ),
  )

/** A Step message as a relay would publish it, at `position` of `key`. */
const stepMessage = (
  key: string,
  label: string,
  position: { readonly epoch: number; readonly seq: number },
  headers: Readonly<Record<string, string>> = {},
): OutgoingMessage => ({
  id: uuidv7(),
  type: Step.type,
  version: 1,
  routingKey: Step.type,
  body: JSON.stringify({ key, label }),
  headers,
  occurredAt: new Date(),
  partitionKey: key,
  position,
  tenantId: null,
})

/** Publishes `messages` latest first, then all of them again in a random order; every one confirmed. */
const publishReorderedTwice = async (exchange: string, messages: ReadonlyArray<OutgoingMessage>) => {
  const shuffled = [...messages].reverse().concat([...messages].sort(() => Math.random() - 0.5))
  await publishConfirmed(exchange, shuffled)
}

describe("per-key order, end to end", () => {
  test("60 keys × 10 messages from concurrent transactions, 2 relay workers, 2 consumers, failures and duplicates: each key in commit order, once", async () => {
    const exchange = uniqueName("ordering-e2e")
    const consumer = uniqueName("ordering-e2e")
    const KEYS = 60
    const PER_KEY = 10
    const keys = Array.from({ length: KEYS }, (_, i) => `key-${i}-${uuidv7()}`)
    const committed = new Map<string, string[]>(keys.map((k) => [k, []]))
    // Two consumer processes' worth of inboxes, started first so the queue exists.
    const inboxes = [0, 1].map(() => startInbox(exchange, consumer, { failRate: 0.2 }))
    await Promise.all(inboxes.map((r) => r.runPromise(Effect.void)))
    const relay = startRelay(exchange, { workers: 2, batchSize: 50, pollInterval: "100 millis" })
    const producers = ManagedRuntime.make(storeLayer(t.url, { poolSize: 16 }))
    try {
      await relay.runPromise(Effect.void)
      const { db } = await producers.runPromise(
        Effect.gen(function* () {
          return yield* Database
        }),
      )
      // 16 writers; each transaction writes one message for each of 3 random keys.
      let written = 0
      const writers = Array.from({ length: 16 }, async (_, w) => {
        while (written < (KEYS * PER_KEY) / 3) {
          written++
          const mine = [...keys].sort(() => Math.random() - 0.5).slice(0, 3)
          const label = `w${w}-${written}`
          await db.transaction().execute(async (trx) => {
            await new Promise((resolve) => setTimeout(resolve, Math.random() * 5))
            await producers.runPromise(
              Outbox.enqueueMany(
                trx,
                mine.map((key) => ({
                  contract: Step,
                  payload: { key, label },
                  options: { partitionKey: key },
                })),
              ),
            )
          })
          // Same-key transactions wait for each other from enqueue to commit: this is commit order.
          for (const key of mine) committed.get(key)!.push(label)
        }
      })
      await Promise.all(writers)
      const total = [...committed.values()].reduce((n, labels) => n + labels.length, 0)
      // Duplicates: every message published a second time with its id, as a relay crash would.
      await eventually("every message handled", async () => (await handledCount(consumer)) >= total, 90_000)
      const seen = await seenByKey(consumer)
      // Commit order as the database decided it: the key's row lock is held from the enqueue to the
      // commit, so the numbers are it. (The order in which this process saw its transactions' COMMITs
      // return is not: two transactions committed back to back on two connections may answer in either
      // order; partition-numbering.test.ts checks numbers against commit order.)
      const numbered = await sql<{ key: string; label: string }>`
        SELECT partition_key AS key, payload->>'label' AS label FROM txbox.outbox
        WHERE partition_key IN (SELECT unnest(${keys}::text[])) ORDER BY partition_key, partition_seq`.execute(
        t.db,
      )
      const inCommitOrder = new Map<string, string[]>()
      for (const r of numbered.rows) inCommitOrder.set(r.key, [...(inCommitOrder.get(r.key) ?? []), r.label])
      for (const key of keys) {
        const labels = committed.get(key)!
        const got = seen.get(key) ?? { seqs: [], labels: [] }
        expect({ key, seqs: got.seqs }).toEqual({ key, seqs: labels.map((_, i) => i + 1) })
        // Every committed message, each once, in commit order.
        expect([...(inCommitOrder.get(key) ?? [])].sort()).toEqual([...labels].sort())
        expect({ key, labels: got.labels }).toEqual({ key, labels: inCommitOrder.get(key) ?? [] })
      }
    } finally {
      await relay.dispose()
      await producers.dispose()
      await Promise.all(inboxes.map((r) => r.dispose()))
    }
  }, 150_000)

  test("deliveries reordered and duplicated on the way: each key's handler still sees 1..n once, in order (both modes)", async () => {
    for (const mode of ["idempotent", "store-then-process"] as const) {
      const exchange = uniqueName(`ordering-shuffle-${mode}`)
      const consumer = uniqueName(`ordering-shuffle-${mode}`)
      const inbox = startInbox(exchange, consumer, { mode })
      try {
        await inbox.runPromise(Effect.void)
        const epoch = Date.now()
        const messages: OutgoingMessage[] = []
        for (let k = 0; k < 20; k++) {
          for (let seq = 1; seq <= 8; seq++) {
            const key = `k${k}`
            messages.push(stepMessage(key, `${key}#${seq}`, { epoch, seq }))
          }
        }
        // Latest first, then everything again in a random order.
        await publishReorderedTwice(exchange, messages)
        await eventually(
          `${mode}: all 160 handled`,
          async () => (await handledCount(consumer)) >= 160,
          60_000,
        )
        await new Promise((resolve) => setTimeout(resolve, 300)) // room for a wrong late duplicate
        const seen = await seenByKey(consumer)
        expect(seen.size).toBe(20)
        for (const [key, got] of seen) {
          expect({ mode, key, seqs: got.seqs }).toEqual({ mode, key, seqs: [1, 2, 3, 4, 5, 6, 7, 8] })
        }
      } finally {
        await inbox.dispose()
      }
    }
  }, 150_000)

  test("a resend under the handler's dedupeKey is dropped and still moves its key on (both modes)", async () => {
    for (const mode of ["idempotent", "store-then-process"] as const) {
      const exchange = uniqueName(`ordering-resend-${mode}`)
      const consumer = uniqueName(`ordering-resend-${mode}`)
      // The business key is the label: seq 3 resends seq 2's event under a new message id.
      const inbox = startInbox(exchange, consumer, { mode, dedupeKey: (payload) => payload.label })
      try {
        await inbox.runPromise(Effect.void)
        const epoch = Date.now()
        const messages: OutgoingMessage[] = []
        for (let k = 0; k < 10; k++) {
          const key = `k${k}`
          const labels = ["placed", "paid", "paid", "shipped", "delivered"]
          for (const [i, label] of labels.entries()) {
            messages.push(stepMessage(key, `${key}:${label}`, { epoch, seq: i + 1 }))
          }
        }
        // Latest first, then everything again in a random order: the resend may arrive before
        // the event it repeats, and every message is redelivered once.
        await publishReorderedTwice(exchange, messages)
        await eventually(
          `${mode}: every key's last message handled`,
          async () => (await handledCount(consumer, "%:delivered")) >= 10,
          60_000,
        )
        await new Promise((resolve) => setTimeout(resolve, 300)) // room for a wrong late duplicate
        const seen = await seenByKey(consumer)
        expect(seen.size).toBe(10)
        for (const [key, got] of seen) {
          // One handler run per business event, in commit order; the resend holds seq 2 or 3.
          expect({ mode, key, labels: got.labels }).toEqual({
            mode,
            key,
            labels: [`${key}:placed`, `${key}:paid`, `${key}:shipped`, `${key}:delivered`],
          })
          expect(got.seqs[0]).toBe(1)
          expect([2, 3]).toContain(got.seqs[1]!)
          expect(got.seqs.slice(2)).toEqual([4, 5])
        }
        // Nothing left waiting: the stand-ins were processed with their keys.
        const waiting = await sql<{ n: string }>`
          SELECT count(*) AS n FROM txbox.inbox WHERE consumer = ${consumer} AND status <> 'processed'`.execute(
          t.db,
        )
        expect(Number(waiting.rows[0]!.n)).toBe(0)
      } finally {
        await inbox.dispose()
      }
    }
  }, 150_000)

  test("a poison message holds back only its key; dead, it keeps it held; after redrive the key resumes in order", async () => {
    const exchange = uniqueName("ordering-poison")
    const consumer = uniqueName("ordering-poison")
    let fixed = false
    const inbox = startInbox(exchange, consumer, { refuse: (label) => label === "P#3" && !fixed })
    const relay = startRelay(exchange)
    try {
      await inbox.runPromise(Effect.void)
      await relay.runPromise(Effect.void)
      const keys = ["P", "Q", "R"]
      for (let seq = 1; seq <= 6; seq++) {
        await t.db.transaction().execute((trx) =>
          relay.runPromise(
            Outbox.enqueueMany(
              trx,
              keys.map((key) => ({
                contract: Step,
                payload: { key: `${consumer}-${key}`, label: `${key}#${seq}` },
                options: { partitionKey: `${consumer}-${key}` },
              })),
            ),
          ),
        )
      }
      const seqsOf = async (key: string) => (await seenByKey(consumer)).get(`${consumer}-${key}`)?.seqs ?? []
      await eventually(
        "Q and R done",
        async () => (await seqsOf("Q")).length === 6 && (await seqsOf("R")).length === 6,
        60_000,
      )
      await eventually("P#3 dead", async () => {
        const dead = await sql<{ n: string }>`
          SELECT count(*) AS n FROM txbox.inbox WHERE consumer = ${consumer} AND status = 'dead'`.execute(
          t.db,
        )
        return Number(dead.rows[0]!.n) === 1
      })
      await new Promise((resolve) => setTimeout(resolve, 1_000))
      expect(await seqsOf("P")).toEqual([1, 2])
      // The rest of P waits, pending, not dead.
      const waiting = await sql<{ seq: string; status: string }>`
        SELECT partition_seq AS seq, status FROM txbox.inbox
        WHERE consumer = ${consumer} AND partition_key = ${`${consumer}-P`} AND status <> 'processed'
        ORDER BY partition_seq`.execute(t.db)
      expect(waiting.rows.map((r) => [Number(r.seq), r.status])).toEqual([
        [3, "dead"],
        [4, "pending"],
        [5, "pending"],
        [6, "pending"],
      ])

      fixed = true
      // What `txbox dead redrive --consumer …` runs.
      const ops = ManagedRuntime.make(storeLayer(t.url))
      const redriven = await ops
        .runPromise(
          Effect.gen(function* () {
            const database = yield* Database
            return yield* redriveDead(database, { table: "inbox", consumer }, 10)
          }),
        )
        .finally(() => ops.dispose())
      expect(redriven).toBe(1)
      await eventually("P resumes", async () => (await seqsOf("P")).length === 6, 30_000)
      expect(await seqsOf("P")).toEqual([1, 2, 3, 4, 5, 6])
    } finally {
      await relay.dispose()
      await inbox.dispose()
    }
  }, 150_000)

  test("idempotent mode: a stored ordered message is handled on NOTIFY, not at the next poll", async () => {
    const exchange = uniqueName("ordering-notify")
    const consumer = uniqueName("ordering-notify")
    // A poll no test waits for: only the processor's LISTEN can pick the stored row up in time.
    const inbox = startInbox(exchange, consumer, { pollInterval: "1 hour" })
    const relay = startRelay(exchange)
    try {
      await inbox.runPromise(Effect.void)
      await relay.runPromise(Effect.void)
      // The processor's first look happens at start; give it time to go idle before the message.
      await new Promise((resolve) => setTimeout(resolve, 1_000))
      await t.db
        .transaction()
        .execute((trx) =>
          relay.runPromise(
            Outbox.enqueue(
              trx,
              Step,
              { key: `${consumer}-K`, label: "K#1" },
              { partitionKey: `${consumer}-K` },
            ),
          ),
        )
      await eventually(
        "handled without a poll",
        async () => ((await seenByKey(consumer)).get(`${consumer}-K`)?.seqs ?? []).length === 1,
        10_000,
      )
    } finally {
      await relay.dispose()
      await inbox.dispose()
    }
  }, 60_000)

  test('onOrderedDead "skip": the poison message goes dead and its key goes on in order without it', async () => {
    const exchange = uniqueName("ordering-skip")
    const consumer = uniqueName("ordering-skip")
    const inbox = startInbox(exchange, consumer, {
      refuse: (label) => label === "P#3",
      onOrderedDead: "skip",
    })
    const relay = startRelay(exchange)
    try {
      await inbox.runPromise(Effect.void)
      await relay.runPromise(Effect.void)
      for (let seq = 1; seq <= 6; seq++) {
        await t.db.transaction().execute((trx) =>
          relay.runPromise(
            Outbox.enqueueMany(
              trx,
              ["P", "Q"].map((key) => ({
                contract: Step,
                payload: { key: `${consumer}-${key}`, label: `${key}#${seq}` },
                options: { partitionKey: `${consumer}-${key}` },
              })),
            ),
          ),
        )
      }
      const seqsOf = async (key: string) => (await seenByKey(consumer)).get(`${consumer}-${key}`)?.seqs ?? []
      await eventually(
        "P and Q done",
        async () => (await seqsOf("P")).length === 5 && (await seqsOf("Q")).length === 6,
        60_000,
      )
      expect(await seqsOf("P")).toEqual([1, 2, 4, 5, 6])
      expect(await seqsOf("Q")).toEqual([1, 2, 3, 4, 5, 6])
      const dead = await sql<{ seq: string }>`
        SELECT partition_seq AS seq FROM txbox.inbox WHERE consumer = ${consumer} AND status = 'dead'`.execute(
        t.db,
      )
      expect(dead.rows.map((r) => Number(r.seq))).toEqual([3])
      // The policy is on record for the operator's tools (txbox status).
      const policy = await sql<{ p: string }>`
        SELECT on_ordered_dead AS p FROM txbox.inbox_consumers WHERE consumer = ${consumer}`.execute(t.db)
      expect(policy.rows).toEqual([{ p: "skip" }])
    } finally {
      await relay.dispose()
      await inbox.dispose()
    }
  }, 150_000)
})

describe("per-key order in a real deployment: consumers of some types, consumers that join late", () => {
  // A key's other event: numbered in the same sequence as Step, routed by its own type.
  const Other = defineEvent({
    type: "ordering.other",
    version: 1,
    schema: v.object({ key: v.string(), label: v.string() }),
  })
  const recorder = (contract: typeof Step | typeof Other, consumer: string) =>
    Inbox.handler(contract, ({ payload, envelope, trx }) =>
      Effect.promise(() =>
        sql`INSERT INTO seen (consumer, key, seq, label)
            VALUES (${consumer}, ${payload.key}, ${envelope.position?.seq ?? null}, ${payload.label})`.execute(
          trx,
        ),
      ),
    )
  /** An inbox handling Step, and Other too when `both`. */
  const consumerOf = (exchange: string, consumer: string, both: boolean) =>
    ManagedRuntime.make(
      Inbox.layer({
        consumer,
        pollInterval: "200 millis",
        handlers: [recorder(Step, consumer), ...(both ? [recorder(Other, consumer)] : [])],
      }).pipe(
        Layer.provide(
          Layer.mergeAll(storeLayer(t.url), Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange }))),
        ),
      ),
    )
  /** One transaction per message: `pattern` says Step ("s") or Other ("o") for each, per key. */
  const produce = async (
    relay: ReturnType<typeof startRelay>,
    keys: ReadonlyArray<string>,
    pattern: string,
    from = 1,
  ) => {
    for (const [i, kind] of [...pattern].entries()) {
      for (const key of keys) {
        await t.db
          .transaction()
          .execute((trx) =>
            relay.runPromise(
              Outbox.enqueue(
                trx,
                kind === "s" ? Step : Other,
                { key, label: `${kind}${from + i}` },
                { partitionKey: key },
              ),
            ),
          )
      }
    }
  }
  const labelsOf = async (consumer: string, key: string) => (await seenByKey(consumer)).get(key)?.labels ?? []

  test("a consumer of some of a key's types goes on through the numbers of the others, in commit order", async () => {
    const exchange = uniqueName("ordering-subset")
    const some = uniqueName("ordering-subset-some")
    const all = uniqueName("ordering-subset-all")
    const inboxes = [consumerOf(exchange, some, false), consumerOf(exchange, all, true)]
    const relay = startRelay(exchange)
    try {
      await Promise.all(inboxes.map((i) => i.runPromise(Effect.void)))
      await relay.runPromise(Effect.void)
      const keys = Array.from({ length: 5 }, (_, i) => `${some}-k${i}`)
      // Step, Other, Other, Step, Other, Step: Step holds numbers 1, 4, 6 of each key.
      await produce(relay, keys, "soosos")
      await eventually(
        "both consumers done",
        async () => {
          for (const key of keys) {
            if ((await labelsOf(some, key)).length < 3 || (await labelsOf(all, key)).length < 6) return false
          }
          return true
        },
        60_000,
      )
      for (const key of keys) {
        expect(await labelsOf(some, key)).toEqual(["s1", "s4", "s6"])
        expect(await labelsOf(all, key)).toEqual(["s1", "o2", "o3", "s4", "o5", "s6"])
      }
    } finally {
      await relay.dispose()
      for (const i of inboxes) await i.dispose()
    }
  }, 120_000)

  test("a consumer deployed after its keys had messages starts at the first it receives", async () => {
    const exchange = uniqueName("ordering-late")
    const early = uniqueName("ordering-late-early")
    const late = uniqueName("ordering-late-late")
    const first = consumerOf(exchange, early, true)
    const relay = startRelay(exchange)
    let second: ReturnType<typeof consumerOf> | undefined
    try {
      await first.runPromise(Effect.void)
      await relay.runPromise(Effect.void)
      const keys = Array.from({ length: 5 }, (_, i) => `${late}-k${i}`)
      await produce(relay, keys, "sos")
      await eventually(
        "the early consumer has the history",
        async () => {
          for (const key of keys) if ((await labelsOf(early, key)).length < 3) return false
          return true
        },
        60_000,
      )
      // Deployed now: numbers 1-3 of every key went out before its queue existed.
      second = consumerOf(exchange, late, false)
      await second.runPromise(Effect.void)
      await produce(relay, keys, "ss", 4)
      await eventually(
        "the late consumer handles what it receives",
        async () => {
          for (const key of keys) if ((await labelsOf(late, key)).length < 2) return false
          return true
        },
        60_000,
      )
      for (const key of keys) expect(await labelsOf(late, key)).toEqual(["s4", "s5"])
    } finally {
      await relay.dispose()
      await first.dispose()
      await second?.dispose()
    }
  }, 120_000)

  test("a predecessor enqueued after the binding is waited for, one enqueued before it is not", async () => {
    const exchange = uniqueName("ordering-late-pred")
    const consumer = uniqueName("ordering-late-pred")
    const inbox = consumerOf(exchange, consumer, false)
    const publisher = ManagedRuntime.make(Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange })))
    try {
      await inbox.runPromise(Effect.void)
      let bound = 0
      await eventually("the binding recorded", async () => {
        const r = await sql<{ ms: number }>`
          SELECT (extract(epoch FROM bound_at) * 1000)::double precision AS ms
          FROM txbox.inbox_bindings WHERE consumer = ${consumer}`.execute(t.db)
        bound = Math.round(Number(r.rows[0]?.ms ?? 0))
        return bound > 0
      })
      const epoch = Date.now()
      const message = (key: string, seq: number, routes: Record<string, [number, number]>) =>
        stepMessage(key, `s${seq}`, { epoch, seq }, { "txbox-partition-routes": JSON.stringify(routes) })
      const waits = `${consumer}-waits`
      const starts = `${consumer}-starts`
      const publish = (messages: ReadonlyArray<OutgoingMessage>) =>
        publisher.runPromise(
          Effect.gen(function* () {
            const transport = yield* Transport
            const outcomes = yield* transport.publish(messages)
            expect(outcomes.every((o) => o._tag === "Confirmed")).toBe(true)
          }),
        )
      // `waits` #3's predecessor on its route, #2, was enqueued after the binding: not here yet.
      // `starts` #3's, #2, was enqueued before it: it never reached this queue.
      await publish([
        message(waits, 3, { [Step.type]: [2, bound + 5_000] }),
        message(starts, 3, { [Step.type]: [2, bound - 60_000] }),
      ])
      await eventually("starts handled", async () => (await labelsOf(consumer, starts)).length === 1, 30_000)
      // Time for a wrong early run of `waits` #3 (the processor polls every 200 ms).
      await new Promise((resolve) => setTimeout(resolve, 1_000))
      expect(await labelsOf(consumer, waits)).toEqual([])
      // #2 arrives (its own predecessor, #1, went out before the binding): both run, in order.
      await publish([message(waits, 2, { [Step.type]: [1, bound - 60_000] })])
      await eventually("waits handled", async () => (await labelsOf(consumer, waits)).length === 2, 30_000)
      expect(await labelsOf(consumer, waits)).toEqual(["s2", "s3"])
      expect(await labelsOf(consumer, starts)).toEqual(["s3"])
    } finally {
      await publisher.dispose()
      await inbox.dispose()
    }
  }, 120_000)
  test("a key whose cursor was purged as idle goes on with its queued backlog; a late predecessor is still waited for", async () => {
    const exchange = uniqueName("ordering-purged")
    const consumer = uniqueName("ordering-purged")
    const DAY = 86_400_000
    let inbox = consumerOf(exchange, consumer, false)
    try {
      // Bound long ago: its queue has been receiving every message of these keys.
      await inbox.runPromise(Effect.void)
      await eventually("the binding recorded", async () => {
        const r = await sql`SELECT 1 FROM txbox.inbox_bindings WHERE consumer = ${consumer}`.execute(t.db)
        return r.rows.length > 0
      })
      await inbox.dispose()
      await sql`UPDATE txbox.inbox_bindings SET bound_at = now() - interval '90 days'
                WHERE consumer = ${consumer}`.execute(t.db)
      // `purged` #1 was handled 70 days ago; the key went quiet, and its cursor is purged as idle.
      const epoch = Date.now() - 80 * DAY
      await sql`INSERT INTO txbox.inbox_cursors (consumer, partition_key, epoch, last_seq, updated_at)
                VALUES (${consumer}, 'purged', ${epoch}, 1, now() - interval '70 days')`.execute(t.db)
      const ops = ManagedRuntime.make(storeLayer(t.url))
      const purged = await ops
        .runPromise(
          Effect.gen(function* () {
            const database = yield* Database
            return yield* purgeIdleCursors(database, yield* cutoff(database, 60 * 86_400), 100)
          }),
        )
        .finally(() => ops.dispose())
      expect(purged).toBe(1)
      // While the consumer is down its queue takes `purged` #2 (after #1, enqueued 75 days ago) and
      // `late` #3, whose #2 was enqueued yesterday: after the purge's horizon, so merely late.
      const message = (key: string, seq: number, routes: Record<string, [number, number]>) =>
        stepMessage(key, `s${seq}`, { epoch, seq }, { "txbox-partition-routes": JSON.stringify(routes) })
      const late = `${consumer}-late`
      await publishConfirmed(exchange, [
        message("purged", 2, { [Step.type]: [1, Date.now() - 75 * DAY] }),
        message(late, 3, { [Step.type]: [2, Date.now() - DAY] }),
      ])
      inbox = consumerOf(exchange, consumer, false)
      await inbox.runPromise(Effect.void)
      await eventually(
        "purged #2 handled",
        async () => (await labelsOf(consumer, "purged")).length === 1,
        30_000,
      )
      // Time for a wrong early run of `late` #3 (the processor polls every 200 ms).
      await new Promise((resolve) => setTimeout(resolve, 1_000))
      expect(await labelsOf(consumer, late)).toEqual([])
      await publishConfirmed(exchange, [message(late, 2, { [Step.type]: [1, Date.now() - 95 * DAY] })])
      await eventually("late handled", async () => (await labelsOf(consumer, late)).length === 2, 30_000)
      expect(await labelsOf(consumer, late)).toEqual(["s2", "s3"])
      expect(await labelsOf(consumer, "purged")).toEqual(["s2"])
    } finally {
      await inbox.dispose()
    }
  }, 120_000)
})

describe("per-key order past a message the producer's relay gave up on", () => {
  test("a keyed message dead in the outbox leaves a tombstone, and its key's consumers go on", async () => {
    const exchange = uniqueName("ordering-tombstone")
    const consumer = uniqueName("ordering-tombstone")
    const inbox = startInbox(exchange, consumer)
    // Bodies over 2 kB are refused unsent: a permanent failure, so the row is dead at once.
    const relay = ManagedRuntime.make(
      Relay.layer({ pollInterval: "100 millis" }).pipe(
        Layer.provide(
          Layer.mergeAll(
            storeLayer(t.url),
            Layer.orDie(AmqpTransport.layer({ url: amqpUrl(), exchange, maxMessageSize: 2_048 })),
          ),
        ),
      ),
    )
    try {
      await inbox.runPromise(Effect.void)
      await relay.runPromise(Effect.void)
      const key = `${consumer}-K`
      for (const label of ["s1", `s2${"x".repeat(4_000)}`, "s3"]) {
        await t.db
          .transaction()
          .execute((trx) =>
            relay.runPromise(Outbox.enqueue(trx, Step, { key, label }, { partitionKey: key })),
          )
      }
      const labels = async () =>
        ((await seenByKey(consumer)).get(key)?.labels ?? []).map((l) => l.slice(0, 2))
      await eventually("s1 and s3 handled", async () => (await labels()).length === 2, 30_000)
      expect(await labels()).toEqual(["s1", "s3"])
      // The relay writes the row dead after the broker confirmed its tombstone, with its next look
      // (held claims): a consumer may have handled s3 before that write commits.
      const deadRows = async () =>
        (
          await sql<{ id: string }>`
            SELECT id FROM txbox.outbox WHERE status = 'dead' AND partition_key = ${key}`.execute(t.db)
        ).rows.length
      await eventually("s2 dead in the outbox", async () => (await deadRows()) === 1, 30_000)
      expect(await deadRows()).toBe(1)
      // The tombstone is the consumer's processed stand-in, with the reason.
      const standIn = await sql<{ last_error: string }>`
        SELECT last_error FROM txbox.inbox
        WHERE consumer = ${consumer} AND partition_key = ${key} AND stands_in_for IS NOT NULL`.execute(t.db)
      expect(standIn.rows[0]?.last_error).toStartWith("dead upstream:")
    } finally {
      await relay.dispose()
      await inbox.dispose()
    }
  }, 120_000)
})
