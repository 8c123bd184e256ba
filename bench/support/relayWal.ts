// bench/relay.ts --source wal (issue #27): the same backlog drained by the polling relay and by the
// relay reading the outbox's WAL, one after the other, on a PostgreSQL of the bench's own with
// wal_level = logical. The backlog is written after the WAL relay's slot exists (one INSERT …
// SELECT, rows occurred when due, as an enqueue with no delay writes them), so the log holds it;
// the WAL relay's sweep is held off, so the log's reader alone drains it. Per source: msg/s, and
// CPU µs per message of the relay (in this process), PostgreSQL (the WAL sender included) and
// RabbitMQ. Counted from the broker's queue and the table, not from the relay's stats.
import { startLocalPostgres } from "../../test/support/postgres.ts"
import { declareSink, type QueueType } from "./amqp.ts"
import { cpuMeter, portOf } from "./cpu.ts"
import { createBenchDatabase, dropIdleSlots, fillOutbox, outboxStatus } from "./db.ts"
import { log, printTable, round } from "./harness.ts"
import { runRelayInProcess } from "./relay.ts"

type Source = "polling" | "wal"

export interface WalDrainConfig {
  readonly amqpUrl: string
  readonly queues: ReadonlyArray<QueueType>
  readonly backlog: number
  readonly warmup: number
  readonly batchSize: number
}

export interface WalDrainCell {
  readonly queue: QueueType
  readonly source: Source
  readonly backlog: number
  readonly rate: number
  readonly relayUs: number | undefined
  readonly postgresUs: number | undefined
  readonly rabbitUs: number | undefined
}

const perMessage = (cores: number | undefined, seconds: number, messages: number) =>
  cores === undefined ? undefined : round((cores * seconds * 1e6) / messages, 1)

export const runWalDrain = async (c: WalDrainConfig): Promise<ReadonlyArray<WalDrainCell>> => {
  const server = await startLocalPostgres({ name: "bench-relay-wal", settings: ["wal_level = logical"] })
  try {
    const meter = cpuMeter({ postgresPort: portOf(server.url), rabbitPort: portOf(c.amqpUrl) })
    const bench = await createBenchDatabase(server.url, "relay_wal")
    try {
      const drain = async (queue: QueueType, source: Source, backlog: number): Promise<WalDrainCell> => {
        const sink = await declareSink(c.amqpUrl, queue, "bench.relaywal")
        try {
          const run = await runRelayInProcess({
            dbUrl: bench.url,
            amqpUrl: c.amqpUrl,
            exchange: sink.exchange,
            batchSize: c.batchSize,
            workers: 1,
            expected: backlog,
            timeoutMs: 600_000,
            meter,
            source,
            prepare: () => fillOutbox(bench.db, backlog, "txbox", { occurredWhenDue: true }),
          })
          const [events, status] = await Promise.all([sink.events(), outboxStatus(bench.db)])
          if (status.sent !== backlog || events !== backlog) {
            throw new Error(
              `${source}/${queue}: ${status.sent} rows sent, ${events} events in the queue, expected ${backlog}`,
            )
          }
          const cell: WalDrainCell = {
            queue,
            source,
            backlog,
            rate: run.rate,
            relayUs: perMessage(run.cpu.bench, run.seconds, backlog),
            postgresUs: perMessage(run.cpu.postgres, run.seconds, backlog),
            rabbitUs: perMessage(run.cpu.rabbitmq, run.seconds, backlog),
          }
          log(`${queue}, ${source} relay: ${Math.round(run.rate)} msg/s`)
          return cell
        } finally {
          await sink.close()
          if (source === "wal") await dropIdleSlots(bench.db)
        }
      }
      // A first drain of each source that is not recorded: JIT and connection warm-up.
      if (c.warmup > 0)
        for (const source of ["polling", "wal"] as const) await drain(c.queues[0]!, source, c.warmup)
      const cells: WalDrainCell[] = []
      for (const queue of c.queues) {
        for (const source of ["polling", "wal"] as const) cells.push(await drain(queue, source, c.backlog))
      }
      return cells
    } finally {
      await dropIdleSlots(bench.db)
      await bench.drop()
    }
  } finally {
    await server.stop()
  }
}

export const printWalDrain = (cells: ReadonlyArray<WalDrainCell>, c: WalDrainConfig): void => {
  const rows: Array<Array<string | number | undefined>> = []
  for (const queue of c.queues) {
    const polling = cells.find((x) => x.queue === queue && x.source === "polling")
    const wal = cells.find((x) => x.queue === queue && x.source === "wal")
    for (const x of [polling, wal]) {
      if (x) rows.push([queue, x.source, Math.round(x.rate), x.relayUs, x.postgresUs, x.rabbitUs])
    }
    if (polling && wal) {
      const ratio = (a: number | undefined, b: number | undefined) =>
        a === undefined || b === undefined || b === 0 ? undefined : round(a / b, 2)
      rows.push([
        queue,
        "wal / polling",
        ratio(wal.rate, polling.rate),
        ratio(wal.relayUs, polling.relayUs),
        ratio(wal.postgresUs, polling.postgresUs),
        ratio(wal.rabbitUs, polling.rabbitUs),
      ])
    }
  }
  printTable(
    `Relay drain, polling against the WAL (issue #27): ${c.backlog.toLocaleString("en-US")} rows written in one transaction, ` +
      `batch ${c.batchSize}, one worker; CPU µs per message`,
    ["queue", "source", "msg/s", "relay µs", "pg µs", "rabbit µs"],
    rows,
  )
}
