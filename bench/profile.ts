// What stands between the relay and the raw ceiling, taken apart: each half of the relay alone
// (the database's claim + mark with no broker; txbox's publisher with no database), and what the
// CloudEvents properties cost next to bare ones on the same raw amqplib channel. CPU per message
// for each party tells whose core a message costs. Not part of bench/all.ts: a diagnosis, not a
// figure to track.
//
//   bun bench/profile.ts [--quick] [--rows 200000] [--messages 100000] [--queue classic|quorum]

import type { Options } from "amqplib"
import { Effect, ManagedRuntime } from "effect"
import { uuidv7 } from "../src/core/uuid.ts"
import { OutboxStore } from "../src/ports/OutboxStore.ts"
import { type OutgoingMessage, Transport } from "../src/ports/Transport.ts"
import * as PgStore from "../src/storage/drivers/pg/PgStore.ts"
import * as AmqpTransport from "../src/transport/amqp/AmqpTransport.ts"
import { declareSink, type Encoded, type QueueType, rawPublish } from "./support/amqp.ts"
import { type CpuUse, cpuMeter, portOf } from "./support/cpu.ts"
import { BENCH_TYPE, createBenchDatabase, fillOutbox, outboxStatus } from "./support/db.ts"
import { log, main, parseArgs, printTable, round, withServices, writeResult } from "./support/harness.ts"
import { makeBody } from "./support/payload.ts"

const args = parseArgs()
const quick = args.quick
const config = {
  rows: args.number("rows", quick ? 4_000 : 200_000),
  messages: args.number("messages", quick ? 4_000 : 100_000),
  batchSize: args.number("batch", 1000),
  queues: args.string("queues", "classic,quorum").split(",") as QueueType[],
}

interface Line {
  /** Summary key. */
  readonly key: string
  readonly what: string
  readonly queue: string
  readonly rate: number
  readonly cpu: CpuUse
}

const perMessageUs = (cores: number | undefined, rate: number) =>
  cores === undefined ? undefined : round((cores / rate) * 1e6, 1)

/** The message's id and persistence only: what the wire costs without txbox's CloudEvents properties. */
const bareProperties = (m: Encoded): Options.Publish => ({
  messageId: m.options.messageId!,
  persistent: true,
  mandatory: true,
  contentType: "application/json",
})

main(() =>
  withServices(async (services) => {
    const meter = cpuMeter({
      postgresPort: portOf(services.databaseUrl),
      rabbitPort: portOf(services.amqpUrl),
    })
    const bench = await createBenchDatabase(services.databaseUrl, "profile")
    const lines: Line[] = []
    const statementRows: Array<Array<string | number | undefined>> = []
    const statementSummary: Record<string, number> = {}
    try {
      // 1. The database half: the relay's own claim and mark statements, every row marked sent.
      const store = ManagedRuntime.make(PgStore.layer({ url: bench.url, listen: false }))
      try {
        const outbox = await store.runPromise(
          Effect.gen(function* () {
            return yield* OutboxStore
          }),
        )
        const done = { _tag: "Done" } as const
        const claimAndMark = async () => {
          let t = performance.now()
          const { token, rows } = await Effect.runPromise(outbox.claim(config.batchSize, 30_000))
          const claimMs = performance.now() - t
          t = performance.now()
          if (rows.length > 0) {
            await Effect.runPromise(
              outbox.mark(
                token,
                rows.map((r) => ({ id: r.id, verdict: done })),
              ),
            )
          }
          return { rows: rows.length, claimMs, markMs: performance.now() - t }
        }
        for (const workers of [1, 2]) {
          await fillOutbox(bench.db, config.rows)
          const before = meter.sample()
          const worker = async () => {
            for (;;) {
              if ((await claimAndMark()).rows === 0) return
            }
          }
          await Promise.all(Array.from({ length: workers }, worker))
          const cpu = meter.use(before, meter.sample())
          const status = await outboxStatus(bench.db)
          if (status.sent !== config.rows) throw new Error(`claim+mark: ${status.sent} of ${config.rows}`)
          lines.push({
            key: `claimMark.workers${workers}`,
            what: `claim + mark only, ${workers} worker(s)`,
            queue: "–",
            rate: config.rows / cpu.seconds,
            cpu,
          })
          log(`claim + mark, ${workers} worker(s): ${Math.round(config.rows / cpu.seconds)} rows/s`)
        }
        // 1b. Alternatives to the relay's statements, one worker, same rows: what a different mark
        //     (or no jsonb → text rendering in the claim) would save, per 1000-row batch and per row.
        const claimSql = (token: string, payload: boolean) =>
          bench.sql.unsafe(
            `WITH due AS (
                 SELECT id FROM txbox.outbox WHERE status = 'pending' AND visible_at <= now()
                 ORDER BY visible_at LIMIT $2::int FOR UPDATE SKIP LOCKED)
               UPDATE txbox.outbox AS o
               SET lock_token = $1::uuid, visible_at = now() + 30000 * interval '1 millisecond'
               FROM due WHERE o.id = due.id
               RETURNING o.id, o.type, o.version, ${payload ? "o.payload::text AS payload," : ""} o.headers,
                         o.routing_key, o.partition_key, o.tenant_id, o.occurred_at, o.attempts,
                         o.visible_at::text AS claimed_until`,
            [token, config.batchSize],
          )
        const markByIds = (token: string, ids: ReadonlyArray<string>) =>
          bench.sql.unsafe(
            `UPDATE txbox.outbox SET status = 'sent', published_at = now(), lock_token = NULL
               WHERE id = ANY($1::uuid[]) AND lock_token = $2::uuid AND status = 'pending'`,
            [ids as string[], token],
          )
        // Every row of one claim got the same visible_at (now() is fixed per statement), so the
        // partial due index finds exactly the batch; ::text keeps the microseconds a Date would drop.
        const markByLease = (token: string, claimedUntil: string) =>
          bench.sql.unsafe(
            `UPDATE txbox.outbox SET status = 'sent', published_at = now(), lock_token = NULL
               WHERE status = 'pending' AND visible_at = $1::text::timestamptz AND lock_token = $2::uuid`,
            [claimedUntil, token],
          )
        const variants: ReadonlyArray<{
          key: string
          what: string
          run: (token: string) => Promise<{ rows: number; claimMs: number; markMs: number }>
        }> = [
          {
            key: "src",
            what: "as in src (claim; mark via json_to_recordset)",
            // The store mints its own claim token.
            run: () => claimAndMark(),
          },
          {
            key: "markByIds",
            what: "mark: sent rows by id array (uuid[])",
            run: async (token) => {
              let t = performance.now()
              const rows = await claimSql(token, true)
              const claimMs = performance.now() - t
              t = performance.now()
              if (rows.length > 0)
                await markByIds(
                  token,
                  rows.map((r) => r.id as string),
                )
              return { rows: rows.length, claimMs, markMs: performance.now() - t }
            },
          },
          {
            key: "markByLease",
            what: "mark: sent rows by token + the claim's visible_at",
            run: async (token) => {
              let t = performance.now()
              const rows = await claimSql(token, true)
              const claimMs = performance.now() - t
              t = performance.now()
              if (rows.length > 0) await markByLease(token, rows[0]!.claimed_until as string)
              return { rows: rows.length, claimMs, markMs: performance.now() - t }
            },
          },
          {
            key: "claimNoPayload",
            what: "claim without payload (the jsonb → text cost)",
            run: async (token) => {
              let t = performance.now()
              const rows = await claimSql(token, false)
              const claimMs = performance.now() - t
              t = performance.now()
              if (rows.length > 0)
                await markByIds(
                  token,
                  rows.map((r) => r.id as string),
                )
              return { rows: rows.length, claimMs, markMs: performance.now() - t }
            },
          },
        ]
        for (const variant of variants) {
          await fillOutbox(bench.db, config.rows)
          let rows = 0
          let claimMs = 0
          let markMs = 0
          const before = meter.sample()
          for (;;) {
            const r = await variant.run(uuidv7())
            if (r.rows === 0) break
            rows += r.rows
            claimMs += r.claimMs
            markMs += r.markMs
          }
          const cpu = meter.use(before, meter.sample())
          if ((await outboxStatus(bench.db)).sent !== config.rows)
            throw new Error(`${variant.key}: rows not all sent`)
          const rate = rows / cpu.seconds
          statementRows.push([
            variant.what,
            Math.round(rate),
            round((claimMs / rows) * 1000, 1),
            round((markMs / rows) * 1000, 1),
            perMessageUs(cpu.postgres, rate),
            perMessageUs(cpu.bench, rate),
            cpu.other === undefined ? undefined : round(cpu.other, 2),
          ])
          statementSummary[`statements.${variant.key}.rate`] = round(rate)
          statementSummary[`statements.${variant.key}.markMsPer1000`] = round((markMs / rows) * 1000, 1)
          log(`${variant.key}: ${Math.round(rate)} rows/s`)
        }
      } finally {
        await store.dispose()
      }

      // 2. The broker half, per queue type: txbox's publisher alone, then raw amqplib with the same
      //    messages, then raw amqplib with bare properties (no CloudEvents headers).
      const bodies = Array.from({ length: 1000 }, (_, i) => makeBody(i))
      const outgoing = (i: number): OutgoingMessage => ({
        id: uuidv7(),
        type: BENCH_TYPE,
        version: 1,
        routingKey: BENCH_TYPE,
        body: bodies[i % bodies.length]!,
        headers: {},
        occurredAt: new Date(),
        partitionKey: null,
        tenantId: null,
      })
      for (const queue of config.queues) {
        for (const callers of [1, 2]) {
          const sink = await declareSink(services.amqpUrl, queue, "bench.profile")
          const transport = ManagedRuntime.make(
            AmqpTransport.layer({ url: services.amqpUrl, exchange: sink.exchange, failFast: true }),
          )
          try {
            const publish = await transport.runPromise(
              Effect.gen(function* () {
                return (yield* Transport).publish
              }),
            )
            const batches = Math.ceil(config.messages / config.batchSize)
            let next = 0
            const before = meter.sample()
            const caller = async () => {
              while (next < batches) {
                next++
                // Built per batch, as the relay builds them from its claimed rows.
                const messages = Array.from({ length: config.batchSize }, (_, i) => outgoing(i))
                const outcomes = await transport.runPromise(publish(messages))
                if (outcomes.some((o) => o._tag !== "Confirmed"))
                  throw new Error("publish: not all confirmed")
              }
            }
            await Promise.all(Array.from({ length: callers }, caller))
            const cpu = meter.use(before, meter.sample())
            const sent = batches * config.batchSize
            if ((await sink.events()) !== sent) throw new Error("publish: messages missing")
            lines.push({
              key: `${queue}.txboxPublish.callers${callers}`,
              what: `txbox publish only, ${callers} concurrent batch(es) of ${config.batchSize}`,
              queue,
              rate: sent / cpu.seconds,
              cpu,
            })
            log(`${queue} txbox publish, ${callers} caller(s): ${Math.round(sent / cpu.seconds)} msg/s`)
          } finally {
            await transport.dispose()
            await sink.close()
          }
        }

        for (const bare of [false, true]) {
          const sink = await declareSink(services.amqpUrl, queue, "bench.profile")
          try {
            const before = meter.sample()
            await rawPublish(
              services.amqpUrl,
              sink.exchange,
              config.messages,
              2000,
              1,
              bare ? bareProperties : undefined,
            )
            const cpu = meter.use(before, meter.sample())
            lines.push({
              key: `${queue}.raw.${bare ? "bare" : "cloudEvents"}`,
              what: bare
                ? "raw amqplib, bare properties (id, persistent)"
                : "raw amqplib, txbox's CloudEvents properties",
              queue,
              rate: config.messages / cpu.seconds,
              cpu,
            })
            log(
              `${queue} raw, ${bare ? "bare" : "CloudEvents"} properties: ${Math.round(config.messages / cpu.seconds)} msg/s`,
            )
          } finally {
            await sink.close()
          }
        }
      }

      printTable(
        "The relay's halves alone, and the cost of the wire properties: msg/s, and CPU per message (µs) by party",
        ["what", "queue", "msg/s", "bench µs", "pg µs", "rabbit µs", "other cores"],
        lines.map((l) => [
          l.what,
          l.queue,
          Math.round(l.rate),
          perMessageUs(l.cpu.bench, l.rate),
          perMessageUs(l.cpu.postgres, l.rate),
          perMessageUs(l.cpu.rabbitmq, l.rate),
          l.cpu.other === undefined ? undefined : round(l.cpu.other, 2),
        ]),
      )
      printTable(
        `The relay's statements and alternatives, 1 worker, batch ${config.batchSize}, ${config.rows.toLocaleString("en-US")} rows: rows/s, ms per ${config.batchSize} rows, CPU per row (µs)`,
        ["statements", "rows/s", "claim ms", "mark ms", "pg µs", "bench µs", "other cores"],
        statementRows,
      )
      const summary: Record<string, number> = { ...statementSummary }
      for (const l of lines) summary[l.key] = round(l.rate)
      writeResult("profile", args, services, {
        summary,
        config,
        results: { lines, statements: statementRows },
      })
    } finally {
      await bench.drop()
    }
  }),
)
