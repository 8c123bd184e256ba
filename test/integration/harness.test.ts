// The real-service harness itself: the servers the preload provides answer, and a private
// PostgreSQL survives a restart on the same URL (what restart tests of the store rely on).
import { afterAll, describe, expect, test } from "bun:test"
import amqp from "amqplib"
import postgres from "postgres"
import { restartBroker } from "../soak/soak.ts"
import { amqpUrl, createTestDatabase, uniqueName } from "../support/db.ts"
import { type LocalPostgres, startLocalPostgres } from "../support/postgres.ts"
import { type Ctl, type LocalRabbit, startLocalRabbit } from "../support/rabbitmq.ts"

describe("test harness", () => {
  test("a test database of its own answers on PostgreSQL", async () => {
    const db = await createTestDatabase("harness")
    const sql = postgres(db.url, { max: 1 })
    try {
      const [row] = await sql<{ version: string; database: string }[]>`
        select version() as version, current_database() as database`
      expect(row?.version).toContain("PostgreSQL")
      expect(row?.database).toBe(db.name)
    } finally {
      await sql.end()
      await db.drop()
    }
  })

  test("a confirmed message comes back from a RabbitMQ queue", async () => {
    const connection = await amqp.connect(amqpUrl())
    try {
      const channel = await connection.createConfirmChannel()
      const queue = uniqueName("txbox.harness")
      await channel.assertQueue(queue, { durable: false, autoDelete: true })
      const body = JSON.stringify({ id: queue, sentAt: Date.now() })
      channel.sendToQueue(queue, Buffer.from(body), { contentType: "application/json", messageId: queue })
      await channel.waitForConfirms()

      const received = await new Promise<amqp.ConsumeMessage>((resolve, reject) => {
        channel
          .consume(queue, (message) => (message ? resolve(message) : reject(new Error("consumer cancelled"))))
          .catch(reject)
      })
      channel.ack(received)
      expect(received.content.toString()).toBe(body)
      expect(received.properties.messageId).toBe(queue)
      await channel.deleteQueue(queue)
    } finally {
      await connection.close()
    }
  })
})

describe("local PostgreSQL", () => {
  let pg: LocalPostgres | undefined
  afterAll(async () => {
    await pg?.stop()
  })

  test("a restarted server answers on the same URL", async () => {
    pg = await startLocalPostgres({ name: "harness-restart" })
    const startTime = async (): Promise<string> => {
      const sql = postgres(pg!.url, { max: 1 })
      try {
        const [row] = await sql<{ started: string }[]>`select pg_postmaster_start_time()::text as started`
        return row!.started
      } finally {
        await sql.end()
      }
    }

    const before = await startTime()
    await pg.restart()
    const after = await startTime()
    // A new start time proves the server really went down and came back.
    expect(after).not.toBe(before)
  })
})

describe("soak's broker restart", () => {
  let rabbit: LocalRabbit | undefined
  afterAll(async () => {
    await rabbit?.stop()
  }, 60_000)

  // CI's failure: stop_app outlived rabbitmqctl's timeout, the broker stopped anyway, and nothing
  // started it again, so the drain waited on a broker that never came back.
  test("a stop_app that fails on our side after stopping the broker still ends with the broker up", async () => {
    rabbit = await startLocalRabbit()
    const ctl: Ctl = async (args, timeoutMs) => {
      const out = await rabbit!.ctl(args, timeoutMs)
      if (args[0] === "stop_app") throw new Error("rabbitmqctl stop_app: timed out after 60000 ms")
      return out
    }
    await expect(restartBroker(ctl, "RabbitMQ", 100)).rejects.toThrow(
      /stop_app failed after \d+ ms \(started again\): rabbitmqctl stop_app: timed out/,
    )
    const connection = await amqp.connect(rabbit.url)
    await connection.close()
  }, 120_000)

  test("a clean restart reports its stop and its down time", async () => {
    rabbit ??= await startLocalRabbit()
    const notes: string[] = []
    const done = await restartBroker(rabbit.ctl, "RabbitMQ", 200, undefined, (n) => notes.push(n))
    expect(done).toMatch(/^RabbitMQ stop_app \(done after \d+ ms\), down 200 ms, start_app$/)
    expect(notes).toEqual(["RabbitMQ stopped (stop_app); starting it again in 200 ms"])
    const connection = await amqp.connect(rabbit.url)
    await connection.close()
  }, 120_000)
})
