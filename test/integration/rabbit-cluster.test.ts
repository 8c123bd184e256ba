// A three-node RabbitMQ cluster (test/support/rabbitCluster.ts) under a node crash: relays and an
// inbox consumer on the transport with the three URLs, a backlog flowing, and the node they are
// connected to SIGKILLed. Counted from the tables afterwards: every outbox row sent, every message
// applied once by the handler, nothing dead. Needs the Debian package's RabbitMQ scripts (a
// cluster of our own); PostgreSQL comes from the usual test support.
import { afterAll, beforeAll, describe, expect, test } from "bun:test"
import { Effect, Layer, ManagedRuntime } from "effect"
import { type Kysely, sql } from "kysely"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import * as Inbox from "../../src/Inbox.ts"
import * as Outbox from "../../src/Outbox.ts"
import { Transport } from "../../src/ports/Transport.ts"
import * as Relay from "../../src/Relay.ts"
import * as AmqpTransport from "../../src/transport/amqp/AmqpTransport.ts"
import { declareTopology } from "../../src/transport/amqp/topology.ts"
import { uniqueName } from "../support/db.ts"
import { startFixture } from "../support/processes.ts"
import {
  type BrokerConnection,
  type ClusterNode,
  type RabbitCluster,
  startRabbitCluster,
} from "../support/rabbitCluster.ts"
import { localRabbitMissing, RABBITMQ_INSTALL_HINT } from "../support/rabbitmq.ts"
import {
  eventually,
  type MigratedDatabase,
  migratedDatabase,
  outboxCounts,
  storeLayer,
} from "../support/txbox.ts"

const Ping = defineEvent({ type: "cluster.ping", version: 1, schema: v.object({ n: v.number() }) })

// Skipped only when there is no RabbitMQ to make a cluster of: a single broker from the
// environment or a container is not one.
const missing = localRabbitMissing()
if (missing !== undefined) {
  console.error(`[txbox tests] rabbit-cluster.test.ts skipped: ${missing} (${RABBITMQ_INSTALL_HINT})`)
}

// biome-ignore lint/suspicious/noExplicitAny: test database
const enqueuePings = async (db: Kysely<any>, from: number, count: number) => {
  const events = Array.from({ length: count }, (_, i) => ({ contract: Ping, payload: { n: from + i } }))
  await db.transaction().execute((trx) => Effect.runPromise(Outbox.enqueueMany(trx, events)))
}

describe.skipIf(missing !== undefined)("a three-node RabbitMQ cluster", () => {
  let cluster: RabbitCluster | undefined
  let t: MigratedDatabase | undefined
  beforeAll(async () => {
    const started = performance.now()
    ;[cluster, t] = await Promise.all([startRabbitCluster(), migratedDatabase("rabbit_cluster")])
    console.error(`[txbox tests] three-node cluster up in ${Math.round(performance.now() - started)} ms`)
  }, 150_000)
  afterAll(async () => {
    await cluster?.stop()
    await t?.close()
  }, 60_000)

  /** `list_queues name leader` of our consumers' queues: queue → leader node. */
  const leaders = async (prefix: string): Promise<Map<string, string>> => {
    const rows = JSON.parse(
      await cluster!.nodes
        .find((n) => n.isRunning())!
        .ctl(["list_queues", "name", "leader", "--formatter", "json"]),
    ) as Array<{ name: string; leader: string }>
    return new Map(rows.filter((r) => r.name.startsWith(prefix)).map((r) => [r.name, String(r.leader)]))
  }

  test("quorum queues declared through one node get their leaders spread over the three", async () => {
    const c = cluster!
    const prefix = uniqueName("spread")
    for (const i of [1, 2, 3]) {
      await Effect.runPromise(
        declareTopology({ url: c.nodes[0]!.url, exchange: prefix, consumer: `${prefix}-${i}`, types: ["t"] }),
      )
    }
    const placed = await leaders(`txbox.${prefix}`)
    expect(placed.size).toBe(6) // three consumer queues and their dead queues
    const perNode = new Map<string, number>()
    for (const node of placed.values()) perNode.set(node, (perNode.get(node) ?? 0) + 1)
    // client-local would have put all six on node 1.
    expect([...perNode.keys()].sort()).toEqual(c.nodes.map((n) => n.node).sort())
    expect([...perNode.values()]).toEqual([2, 2, 2])
  })

  test("the node the clients use, then the consumer queue's leader, SIGKILLed while a backlog flows: every row sent, every message applied once, none dead", async () => {
    const c = cluster!
    const db = t!.db
    const exchange = uniqueName("cluster")
    const consumer = uniqueName("cluster")
    const queue = `txbox.${consumer}`
    const transport = (source: string) =>
      Layer.orDie(
        AmqpTransport.layer({
          urls: c.urls,
          exchange,
          source,
          publishTimeout: "5 seconds",
          reconnect: { initialDelay: "100 millis", maxDelay: "1 second" },
        }),
      )
    // Declared ahead, so nothing the relays send before the inbox subscribes comes back unroutable.
    await Effect.runPromise(declareTopology({ urls: c.urls, exchange, consumer, types: [Ping.type] }))

    // Service A: a relay and the inbox on one transport layer, so one connection, to one node.
    const serviceA = ManagedRuntime.make(
      Layer.mergeAll(
        Relay.layer({
          batchSize: 200,
          pollInterval: "100 millis",
          retry: { initialDelay: "100 millis", maxDelay: "1 second" },
          outageRetry: { initialDelay: "100 millis", maxDelay: "1 second" },
        }),
        Inbox.layer({
          consumer,
          retry: { initialDelay: "100 millis", maxDelay: "1 second" },
          handlers: [
            Inbox.handler(Ping, ({ envelope, trx }) =>
              Effect.promise(() =>
                sql`INSERT INTO effects (consumer, message_id) VALUES (${consumer}, ${envelope.id})`.execute(
                  trx,
                ),
              ),
            ),
          ],
        }),
      ).pipe(Layer.provideMerge(Layer.mergeAll(storeLayer(t!.url), transport("cluster-a"))), Layer.orDie),
    )
    // Relay B: a process of its own with its own connection (from a random node on).
    const relayB = await startFixture("test/fixtures/relay.ts", {
      DB_URL: t!.url,
      AMQP_URLS: c.urls.join(","),
      EXCHANGE: exchange,
      SOURCE: "cluster-b",
      BATCH: "200",
      LEASE_MS: "10000",
    })

    const effects = async () =>
      Number(
        (await sql<{ n: string }>`SELECT count(*) AS n FROM effects WHERE consumer = ${consumer}`.execute(db))
          .rows[0]!.n,
      )
    /** Where each client is. Asked before traffic: the CLI is too slow to ask while a backlog flows. */
    const clients = async () => {
      let listed: ReadonlyArray<BrokerConnection> = []
      await eventually(
        "both clients are connected",
        async () => {
          listed = await c.connections()
          return ["txbox cluster-a", "txbox cluster-b"].every((name) => listed.some((l) => l.name === name))
        },
        30_000,
      )
      return listed
    }
    /**
     * Enqueues a backlog of `count` (3/5 at once, the rest in small batches across the kill),
     * SIGKILLs `target` once the inbox is under way, restarts it 3 s later, and waits until every
     * row is sent and every message applied.
     */
    const killWhileFlowing = async (from: number, count: number, target: ClusterNode, what: string) => {
      const backlog = Math.round((count * 3) / 5)
      await enqueuePings(db, from, backlog)
      const producing = (async () => {
        for (let n = from + backlog; n < from + count; n += 50) {
          await enqueuePings(db, n, 50)
          await Bun.sleep(60)
        }
      })()
      await eventually("the backlog flows", async () => (await effects()) >= from + 300, 60_000)
      await target.kill()
      const applied = await effects()
      const sent = (await outboxCounts(db)).sent
      console.error(
        `[txbox tests] SIGKILLed node ${target.index} (${what}) at ${sent} sent, ${applied} applied of ${from + count}`,
      )
      expect(applied).toBeLessThan(from + count)
      // Back in a while, as after a crash; the others carry on meanwhile.
      const restarted = Bun.sleep(3_000).then(() => target.restart())
      try {
        await producing
        await eventually(
          "every row is sent and every message applied",
          async () => (await outboxCounts(db)).sent === from + count && (await effects()) >= from + count,
          90_000,
        )
      } finally {
        await restarted
      }
    }
    /** Counted from the tables: every row sent, every message applied once by the handler, none dead. */
    const expectAllOnce = async (total: number) => {
      // Room for a late duplicate to (wrongly) apply.
      await Bun.sleep(500)
      expect(await outboxCounts(db)).toEqual({ pending: 0, sent: total, dead: 0 })
      const applied = await sql<{ rows: string; messages: string }>`
        SELECT count(*) AS rows, count(DISTINCT message_id) AS messages FROM effects WHERE consumer = ${consumer}`.execute(
        db,
      )
      expect(applied.rows[0]).toEqual({ rows: String(total), messages: String(total) })
      const inbox = await sql<{ status: string; n: string }>`
        SELECT status, count(*) AS n FROM txbox.inbox WHERE consumer = ${consumer} GROUP BY status`.execute(
        db,
      )
      expect(Object.fromEntries(inbox.rows.map((r) => [r.status, Number(r.n)]))).toEqual({ processed: total })
    }

    try {
      await serviceA.runPromise(Effect.void)

      // 1. The node service A (relay and inbox) is connected to.
      const before = await clients()
      const target = c.nodeOfPort(before.find((conn) => conn.name === "txbox cluster-a")!.port)!
      const onTarget = before.filter((conn) => conn.port === target.port).map((conn) => conn.name!)
      const leaderFirst = (await leaders(queue)).get(queue)
      const first = `${onTarget.join(", ")} on it${leaderFirst === target.node ? ", and the queue's leader" : ""}`
      await killWhileFlowing(0, 5000, target, first)
      await expectAllOnce(5000)
      // The clients that were on it moved to another node.
      const after = await clients()
      for (const name of onTarget)
        expect(after.find((conn) => conn.name === name)!.port).not.toBe(target.port)

      // 2. The node that leads the consumer queue now: its consumers, wherever they are, carry on
      // once the queue's other replicas have elected a leader.
      const leaderNow = (await leaders(queue)).get(queue)
      const leader = c.nodes.find((n) => n.node === leaderNow)!
      const onLeader = after.filter((conn) => conn.port === leader.port).map((conn) => conn.name!)
      await killWhileFlowing(
        5000,
        2000,
        leader,
        `the queue's leader${onLeader.map((n) => `, ${n}`).join("")}`,
      )
      await expectAllOnce(7000)

      const connected = Effect.gen(function* () {
        const transport = yield* Transport
        return yield* transport.isConnected
      })
      expect(await serviceA.runPromise(connected)).toBe(true)
      expect(relayB.process.exitCode).toBeNull()
    } finally {
      await relayB.kill("SIGTERM")
      await serviceA.dispose()
    }
    await c.awaitRunning(3)
  }, 180_000)
})
