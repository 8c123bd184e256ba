// The soak (test/soak/soak.ts) in the suite: short runs of real producer, relay and consumer
// processes under every fault kind, each judged from the tables alone. The runs get a PostgreSQL and
// a RabbitMQ of their own (not the suite's shared pair), because the faults restart them.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { randomUUID } from "node:crypto"
import { Effect } from "effect"
import { Kysely, sql } from "kysely"
import { PostgresJSDialect } from "kysely-postgres-js"
import postgres from "postgres"
import { migrate } from "../../src/pg.ts"
import { OrderPaid, OrderPlaced } from "../soak/contract.ts"
import {
  DRAIN_STRETCH,
  FAULT_KINDS,
  formatReport,
  runSoak,
  type SoakOptions,
  type SoakResult,
} from "../soak/soak.ts"
import {
  createBusinessTables,
  type Db,
  diagnostics,
  drainProgress,
  registerConsumers,
  settled,
  tableCounts,
} from "../soak/tables.ts"
import { createTestDatabase } from "../support/db.ts"
import { type LocalPostgres, startLocalPostgres } from "../support/postgres.ts"
import { type LocalRabbit, startLocalRabbit } from "../support/rabbitmq.ts"

// 45 s of load per run, then the drain (bounded below). A passing run takes 75–105 s on a 2-core
// machine (three consumers apply about three times as many events as there are orders); a run that
// does not drain takes ≈ 3 min.
const LOAD_MINUTES = 0.75
// Well above a healthy drain (20–47 s seen; at worst the default 30 s lease of a killed process's
// rows plus backoffs), well below the CLI's 3 minutes so that a wedged run fails in reasonable time.
// A drain still going down past it gets up to DRAIN_STRETCH× (soak.ts): once the faults stretched a load to
// 100 s, twice the events were owed and the drain, steady at ~500 events/s, needed ~100 s.
const DRAIN_TIMEOUT_MS = 90_000
// Load + drain (up to DRAIN_STRETCH× its bound) + start and stop of the eight processes and the
// count, with room to spare on a slow machine (CI's took 128 s for the last two).
const RUN_TIMEOUT_MS = 45_000 + DRAIN_STRETCH * DRAIN_TIMEOUT_MS + 200_000

describe("the soak's verdict, read from the tables", () => {
  let db: Db
  let drop: () => Promise<void>
  beforeAll(async () => {
    const t = await createTestDatabase("soak_verdict")
    drop = t.drop
    db = new Kysely({
      dialect: new PostgresJSDialect({ postgres: postgres(t.url, { max: 2, onnotice: () => {} }) }),
    })
    await Effect.runPromise(migrate(db))
    await createBusinessTables(db)
  })
  afterAll(async () => {
    await db.destroy()
    await drop()
  })

  // Each case counts the whole database: it starts from empty tables.
  const reset = () =>
    sql`TRUNCATE orders, effects, soak_consumers, soak_events, txbox.outbox, txbox.inbox, txbox.inbox_bindings`.execute(
      db,
    )

  /** An outbox row for order `o`'s event of `type`, keyed when `key` is given. */
  const event = async (
    o: { id: string; n: number },
    status: string,
    lastError: string | null = null,
    key: { partition: string; seq: number } | null = null,
    type: string = OrderPlaced.type,
  ) => {
    const id = randomUUID()
    await sql`
      INSERT INTO txbox.outbox (id, type, version, payload, status, attempts, last_error, partition_key, partition_epoch, partition_seq)
      VALUES (${id}, ${type}, 1, ${JSON.stringify({ orderId: o.id, n: o.n })}::text::jsonb, ${status},
              ${lastError === null ? 0 : 3}, ${lastError}, ${key?.partition ?? null}, ${key === null ? null : 1}, ${key?.seq ?? null})`.execute(
      db,
    )
    return id
  }
  /** One handler run of `consumer` for order `orderId`'s event `messageId`. */
  const effect = (consumer: string, orderId: string, messageId: string, type: string = OrderPlaced.type) =>
    db
      .insertInto("effects")
      .values({ order_id: orderId, type, consumer, message_id: messageId, pid: 1 })
      .execute()

  test("counts lost, duplicated, dead, stuck, rolled-back and orphan rows, and names them", async () => {
    await reset()
    await registerConsumers(db, [{ consumer: "c", role: "c", types: [OrderPlaced.type], joinedLate: false }])
    const order = (n: number) => ({ id: randomUUID(), n })
    const o1 = order(1)
    const o2 = order(2)
    const o3 = order(3)
    const o4 = order(4)
    const o5 = order(5)
    const o6 = order(6)
    const rolledBack = order(-1) // an order of a transaction that rolled back: must never be there
    await db.insertInto("orders").values([o1, o2, o3, o4, o5, o6, rolledBack]).execute()
    const e1 = await event(o1, "sent")
    const e2 = await event(o2, "sent")
    await event(o3, "pending", "broker not connected")
    await event(o4, "dead", "unroutable")
    const e5 = await event(o5, "sent")
    await event(rolledBack, "sent")
    await event(order(9), "sent") // an event whose order is not in the table
    // o6 has no event at all.
    const inbox = async (messageId: string, status: string, lastError: string | null = null) =>
      sql`INSERT INTO txbox.inbox (message_id, consumer, status, last_error)
          VALUES (${messageId}, 'c', ${status}, ${lastError})`.execute(db)
    await inbox(e1, "processed")
    await inbox(e2, "processed")
    await inbox(e5, "dead", "handler failed")
    await effect("c", o1.id, e1)
    await effect("c", o2.id, e2)
    await effect("c", o2.id, e2) // applied twice
    await effect("c", randomUUID(), "m-none") // an effect of no order
    // Key K: its second event handled before its first (out of order); key L in order.
    const [k1, k2, l1, l2] = [order(11), order(12), order(13), order(14)]
    await db.insertInto("orders").values([k1, k2, l1, l2]).execute()
    const ek1 = await event(k1, "sent", null, { partition: "K", seq: 1 })
    const ek2 = await event(k2, "sent", null, { partition: "K", seq: 2 })
    const el1 = await event(l1, "sent", null, { partition: "L", seq: 1 })
    const el2 = await event(l2, "sent", null, { partition: "L", seq: 2 })
    await effect("c", k2.id, ek2)
    await effect("c", k1.id, ek1)
    await effect("c", l1.id, el1)
    await effect("c", l2.id, el2)

    expect(await tableCounts(db)).toEqual({
      orders: 10,
      events: 11,
      sent: 9,
      effects: 8,
      lost: 4, // o3 (pending), o4 (dead), o5 (inbox dead), o6 (no event)
      duplicated: 1,
      extraEffects: 1,
      outboxPending: 1,
      outboxDead: 1,
      inboxProcessed: 2,
      inboxPending: 0,
      inboxDead: 1,
      rolledBackOrders: 1,
      rolledBackEvents: 1,
      orphanEvents: 1,
      orphanEffects: 1,
      ordersWithoutEvent: 1,
      keysOutOfOrder: 1,
      mixedKeys: 0,
      consumers: [
        {
          consumer: "c",
          role: "c",
          types: [OrderPlaced.type],
          joinedLate: false,
          boundAt: null,
          effects: 8,
          required: 10,
          optional: 0,
          optionalApplied: 0,
          lost: 4,
          duplicated: 1,
          extraEffects: 1,
          keysOutOfOrder: 1,
          ranLate: 0,
          inboxPending: 0,
          inboxDead: 1,
        },
      ],
    })
    // Still waiting for o3 (pending) and o6; o4 and o5 are dead and will never come.
    const progress = await drainProgress(db)
    expect(progress).toEqual({ orders: 10, deliveries: 10, waiting: 2, outboxPending: 1, inboxPending: 0 })
    expect(settled(progress)).toBe(false)

    const report = (await diagnostics(db, await tableCounts(db))).join("\n")
    for (const expected of [
      o3.id,
      o4.id,
      o5.id,
      o6.id,
      o2.id,
      "broker not connected",
      "unroutable",
      "handler failed",
    ]) {
      expect(report).toContain(expected)
    }
  })

  test("counts each consumer over its own types: one of a key's two types, and one that joined late", async () => {
    await reset()
    await registerConsumers(db, [
      { consumer: "all", role: "all", types: [OrderPlaced.type, OrderPaid.type], joinedLate: false },
      { consumer: "paid", role: "paid", types: [OrderPaid.type], joinedLate: false },
      { consumer: "late", role: "late", types: [OrderPlaced.type, OrderPaid.type], joinedLate: true },
    ])
    // The late consumer's bindings began at 00:00:10.0002; the others' long before any order.
    const boundAt = "2030-01-01 00:00:10.0002+00"
    for (const [consumer, at] of [
      ["all", "2030-01-01 00:00:00+00"],
      ["paid", "2030-01-01 00:00:00+00"],
      ["late", boundAt],
    ] as const) {
      for (const type of [OrderPlaced.type, OrderPaid.type])
        await sql`INSERT INTO txbox.inbox_bindings (consumer, pattern, bound_at) VALUES (${consumer}, ${type}, ${at}::text::timestamptz)`.execute(
          db,
        )
    }
    // As text: the driver would round a timestamp parameter to whole milliseconds.
    const order = (n: number, paid: boolean, createdAt: string) => ({
      id: randomUUID(),
      n,
      paid,
      created_at: sql`${createdAt}::text::timestamptz`,
    })
    const p1 = order(1, true, "2030-01-01 00:00:05+00") // before the late binding
    const p2 = order(2, false, "2030-01-01 00:00:15+00")
    const p3 = order(3, true, "2030-01-01 00:00:20+00")
    // 0.1 ms after the binding, but in a whole millisecond (10000) before it (10000.2), as a
    // successor's header says: the late consumer does not wait for it, so it is not owed.
    const q1 = order(4, false, "2030-01-01 00:00:10.0003+00")
    const q2 = order(5, false, "2030-01-01 00:00:30+00")
    await db.insertInto("orders").values([p1, p2, p3, q1, q2]).execute()
    const PAID = OrderPaid.type
    // Key K interleaves the types: 1 placed, 2 paid (p1), 3 placed (p2), 4 placed, 5 paid (p3).
    const k1 = await event(p1, "sent", null, { partition: "K", seq: 1 })
    const k2 = await event(p1, "sent", null, { partition: "K", seq: 2 }, PAID)
    const k3 = await event(p2, "sent", null, { partition: "K", seq: 3 })
    const k4 = await event(p3, "sent", null, { partition: "K", seq: 4 })
    const k5 = await event(p3, "sent", null, { partition: "K", seq: 5 }, PAID)
    const l1 = await event(q1, "sent", null, { partition: "L", seq: 1 })
    const l2 = await event(q2, "sent", null, { partition: "L", seq: 2 })
    // "all": every event, in order.
    for (const [o, id, type] of [
      [p1, k1, OrderPlaced.type],
      [p1, k2, PAID],
      [p2, k3, OrderPlaced.type],
      [p3, k4, OrderPlaced.type],
      [p3, k5, PAID],
      [q1, l1, OrderPlaced.type],
      [q2, l2, OrderPlaced.type],
    ] as const)
      await effect("all", o.id, id, type)
    // "paid": the OrderPaid events of K, 5 before 2 (out of order); the OrderPlaced events are not
    // its and are not lost; an OrderPlaced it applied anyway is an orphan.
    await effect("paid", p3.id, k5, PAID)
    await effect("paid", p1.id, k2, PAID)
    await effect("paid", p2.id, k3)
    // "late": owed K 3, 4, 5 and L 2. It applies 3 and 4, then p1's OrderPlaced (1, enqueued before
    // its binding: the late-consumer race, counted, not out of order); 5 never (lost); 2 of K not
    // at all (not owed); L 1 twice (not owed, but twice is a duplicate), then L 2.
    await effect("late", p2.id, k3)
    await effect("late", p3.id, k4)
    await effect("late", p1.id, k1)
    await effect("late", q1.id, l1)
    await effect("late", q1.id, l1)
    await effect("late", q2.id, l2)

    const counts = await tableCounts(db)
    const perConsumer = Object.fromEntries(
      counts.consumers.map(({ consumer, boundAt: _, types: __, role: ___, ...c }) => [consumer, c]),
    )
    expect(perConsumer).toEqual({
      all: {
        joinedLate: false,
        effects: 7,
        required: 7,
        optional: 0,
        optionalApplied: 0,
        lost: 0,
        duplicated: 0,
        extraEffects: 0,
        keysOutOfOrder: 0,
        ranLate: 0,
        inboxPending: 0,
        inboxDead: 0,
      },
      late: {
        joinedLate: true,
        effects: 6,
        required: 4, // K 3, 4, 5 and L 2
        optional: 3, // K 1, 2 and L 1
        optionalApplied: 2,
        lost: 1, // K 5
        duplicated: 1, // L 1
        extraEffects: 1,
        keysOutOfOrder: 0,
        ranLate: 1, // K 1 after K 4
        inboxPending: 0,
        inboxDead: 0,
      },
      paid: {
        joinedLate: false,
        effects: 3,
        required: 2, // K 2 and 5
        optional: 0,
        optionalApplied: 0,
        lost: 0,
        duplicated: 0,
        extraEffects: 0,
        keysOutOfOrder: 1,
        ranLate: 0,
        inboxPending: 0,
        inboxDead: 0,
      },
    })
    expect(counts.consumers.find((c) => c.consumer === "late")?.boundAt).toBe("2030-01-01T00:00:10.000Z")
    expect({
      lost: counts.lost,
      duplicated: counts.duplicated,
      keysOutOfOrder: counts.keysOutOfOrder,
      orphanEffects: counts.orphanEffects,
      orphanEvents: counts.orphanEvents,
      ordersWithoutEvent: counts.ordersWithoutEvent,
      mixedKeys: counts.mixedKeys,
    }).toEqual({
      lost: 1,
      duplicated: 1,
      keysOutOfOrder: 1,
      orphanEffects: 1,
      orphanEvents: 0,
      ordersWithoutEvent: 0,
      mixedKeys: 1,
    })
    // Only K 5 is still owed (to "late").
    expect(await drainProgress(db)).toEqual({
      orders: 5,
      deliveries: 13,
      waiting: 1,
      outboxPending: 0,
      inboxPending: 0,
    })
    const report = (await diagnostics(db, counts)).join("\n")
    expect(report).toContain(k5) // the lost one
    expect(report).toContain("consumer=paid  key=K  applied=5p 2p") // the paid-only consumer's inversion
  })
})

// The whole report: on a failure it names the lost, duplicated and stuck rows and the logs dir. A
// failed run's report is printed again with a prefix that .ci/run repeats last (CI keeps the tail).
const printReport = (result: SoakResult) => {
  const report = formatReport(result)
  console.error(report)
  if (!result.ok)
    console.error(
      report
        .split("\n")
        .slice(0, 500)
        .map((line) => `soak-failed| ${line}`)
        .join("\n"),
    )
}

describe("soak: real processes under faults, judged from the tables", () => {
  let pg: LocalPostgres | undefined
  let rabbit: LocalRabbit | undefined
  beforeAll(async () => {
    ;[pg, rabbit] = await Promise.all([startLocalPostgres({ name: "soak-tests" }), startLocalRabbit()])
  }, 120_000)
  afterAll(async () => {
    await Promise.all([pg?.stop(), rabbit?.stop()])
  }, 60_000)

  const soak = async (
    options: Pick<SoakOptions, "driver" | "runtime" | "relayWorkers" | "rate">,
  ): Promise<SoakResult> => {
    const result = await runSoak({
      minutes: LOAD_MINUTES,
      drainTimeoutMs: DRAIN_TIMEOUT_MS,
      services: { postgres: pg!, rabbit: rabbit! },
      ...options,
    })
    printReport(result)
    return result
  }

  const expectExactlyOnce = (r: SoakResult) => {
    expect(r.failures.filter((f) => f.startsWith("the soak itself"))).toEqual([])
    const c = r.counts!
    expect(c.orders).toBeGreaterThan(0)
    expect(r.producers.rolledBack).toBeGreaterThan(0) // the rollback check below proves something
    expect({
      lost: c.lost,
      duplicated: c.duplicated,
      dead: r.dead,
      stuck: r.stuck,
      rolledBackVisible: c.rolledBackOrders + c.rolledBackEvents,
      orphans: c.orphanEvents + c.orphanEffects + c.ordersWithoutEvent,
      keysOutOfOrder: c.keysOutOfOrder,
      drained: r.drained,
      crashes: r.crashes.map((crash) => `${crash.process} gen ${crash.generation}: ${crash.exit}`),
      stalledProducers: r.stalls,
    }).toEqual({
      lost: 0,
      duplicated: 0,
      dead: 0,
      stuck: 0,
      rolledBackVisible: 0,
      orphans: 0,
      keysOutOfOrder: 0,
      drained: true,
      crashes: [],
      stalledProducers: [],
    })
    // Per consumer, over the events of its types: "main" (both types, the original consumer's
    // two processes), "paid-only" (one of each key's two types) and "late" (started a third into
    // the load: owed what was enqueued from its binding on, and in order over those).
    expect(c.mixedKeys).toBeGreaterThan(0) // the keys interleave the two types
    expect(
      c.consumers.map((k) => ({
        role: k.role,
        applied: k.required > 0 && k.effects >= k.required,
        joinedLate: k.joinedLate && k.optional > 0, // orders were written before its binding
        lost: k.lost,
        duplicated: k.duplicated,
        keysOutOfOrder: k.keysOutOfOrder,
        inboxPending: k.inboxPending,
        inboxDead: k.inboxDead,
      })),
    ).toEqual(
      [
        { role: "main", joinedLate: false },
        { role: "paid-only", joinedLate: false },
        { role: "late", joinedLate: true },
      ].map((k) => ({
        ...k,
        applied: true,
        lost: 0,
        duplicated: 0,
        keysOutOfOrder: 0,
        inboxPending: 0,
        inboxDead: 0,
      })),
    )
    // Every fault kind happened at least once during the run.
    expect(r.skippedFaults).toEqual([])
    expect(Object.fromEntries(FAULT_KINDS.map((k) => [k, r.faults[k] >= 1]))).toEqual(
      Object.fromEntries(FAULT_KINDS.map((k) => [k, true])),
    )
    expect(r.ok).toBe(true)
  }

  test(
    "default driver (no driver option), Bun: exactly once under every fault",
    async () => {
      expectExactlyOnce(await soak({ runtime: "bun" }))
    },
    RUN_TIMEOUT_MS,
  )

  // The default driver is pg, so the runs with no driver option are pg's; postgres.js runs on the
  // two runtimes the issue names, with its reservation guard (storage/drivers/postgres-js/renewingPool.ts).
  for (const runtime of ["bun", "node"] as const) {
    test(
      `postgres.js, ${runtime === "bun" ? "Bun" : "Node 22"}: exactly once under every fault`,
      async () => {
        expectExactlyOnce(await soak({ driver: "postgres.js", runtime }))
      },
      RUN_TIMEOUT_MS,
    )
  }

  // Issue #12's shape: 2 relay processes × 2 workers (every event has one of 200 partition keys, the
  // verdict includes keys out of order), the main consumer's 2 processes and the two others, a
  // consumer SIGKILLed, duplicates.
  test(
    "per-key order with 2 relay processes × 2 workers (default driver, Bun): every key in commit order, once",
    async () => {
      // 40 transactions/s per producer (default 25): ≥ 20 events per key in 45 s (OrderPlaced alone).
      const r = await soak({ runtime: "bun", relayWorkers: 2, rate: 40 })
      expect(r.counts!.events).toBeGreaterThanOrEqual(200 * 20)
      expectExactlyOnce(r)
    },
    RUN_TIMEOUT_MS,
  )

  // Issue #27: both relay processes with source "wal" (one reads the slot, the other stands by and
  // takes over when the reader is SIGKILLed; both sweep), under the same faults.
  test(
    "relays reading the WAL (default driver, Bun): exactly once under every fault",
    async () => {
      // A PostgreSQL of its own (wal_level = logical): the other runs keep theirs as it was.
      const walPg = await startLocalPostgres({ name: "soak-wal", settings: ["wal_level = logical"] })
      try {
        const result = await runSoak({
          minutes: LOAD_MINUTES,
          drainTimeoutMs: DRAIN_TIMEOUT_MS,
          services: { postgres: walPg, rabbit: rabbit! },
          runtime: "bun",
          relaySource: "wal",
        })
        printReport(result)
        expectExactlyOnce(result)
      } finally {
        await walPg.stop()
      }
    },
    RUN_TIMEOUT_MS,
  )

  test(
    "default driver (no driver option), Node 22: exactly once under every fault",
    async () => {
      expectExactlyOnce(await soak({ runtime: "node" }))
    },
    RUN_TIMEOUT_MS,
  )

  test(
    "default driver (no driver option), Deno: exactly once under every fault",
    async () => {
      expectExactlyOnce(await soak({ runtime: "deno" }))
    },
    RUN_TIMEOUT_MS,
  )
})
