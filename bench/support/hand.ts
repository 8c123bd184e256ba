// A hand-written transactional outbox and inbox: what a team writes without a library, the
// baseline of bench/cost.ts. Plain SQL on node-postgres (`pg`, txbox's default driver) and amqplib;
// no retries beyond "roll back and try again", no leases, no ordering, no dead letters.
// This file: the tables, the producer's transaction (producerProcess.ts mode "hand") and the stdio
// plumbing the bench's children share. The relay is handRelayProcess.ts, the inbox handInboxProcess.ts.
import { randomUUID } from "node:crypto"
import type pg from "pg"
import { BENCH_TYPE } from "./db.ts"
import type { OrderPlaced } from "./payload.ts"

/** Run once in the bench database (postgres.js `unsafe`: several statements, no parameters). */
export const HAND_SCHEMA_SQL = `
  CREATE SCHEMA hand;
  CREATE TABLE hand.outbox (
    id uuid PRIMARY KEY,
    type text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at timestamptz
  );
  CREATE INDEX outbox_unsent ON hand.outbox (created_at) WHERE sent_at IS NULL;
  CREATE TABLE hand.inbox (
    message_id uuid NOT NULL,
    consumer text NOT NULL,
    PRIMARY KEY (message_id, consumer)
  );`

/**
 * The business tables of a whole-pipeline bench (cost.ts, retention.ts): the producers' orders and
 * the handlers' effects, joined by `serial` for commit → handler latency.
 */
export const PIPELINE_TABLES_SQL = `
  CREATE TABLE orders (
    id uuid PRIMARY KEY, customer_id uuid NOT NULL, total numeric NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(), serial int NOT NULL, run int NOT NULL
  );
  CREATE SCHEMA bench;
  CREATE TABLE bench.handled (
    id bigserial PRIMARY KEY, serial int NOT NULL, key text, seq bigint,
    handled_at timestamptz NOT NULL DEFAULT clock_timestamp()
  );`

/** The business write both producers make (producerProcess.ts sends it through Kysely's transaction). */
export const ORDER_INSERT =
  "INSERT INTO orders (id, customer_id, total, serial, run) VALUES ($1, $2, $3, $4, $5)"

/** The hand-written producer's outbox row: its id, type and JSON payload. */
export const HAND_OUTBOX_INSERT = "INSERT INTO hand.outbox (id, type, payload) VALUES ($1, $2, $3)"

/** The handler's effect both inboxes write (inboxProcess.ts through the inbox's Kysely transaction). */
export const HANDLED_INSERT = "INSERT INTO bench.handled (serial, key, seq) VALUES ($1, $2, $3)"

/** `BEGIN`, `body` on one pooled client, `COMMIT`; `ROLLBACK` when it throws (the producers' transaction). */
export const inTransaction = async (
  pool: pg.Pool,
  body: (client: pg.PoolClient) => Promise<void>,
): Promise<void> => {
  const client = await pool.connect()
  let broken: Error | undefined
  try {
    await client.query("BEGIN")
    await body(client)
    await client.query("COMMIT")
  } catch (error) {
    await client.query("ROLLBACK").catch((e: Error) => {
      broken = e
    })
    throw error
  } finally {
    client.release(broken)
  }
}

/** The order row, as both producers write it. */
export const insertOrder = (client: pg.PoolClient, payload: OrderPlaced, run: number) =>
  client.query(ORDER_INSERT, [payload.orderId, payload.customerId, payload.total, payload.serial, run])

/** One business transaction: the order row and its outbox row, committed together. */
export const handTransaction = (pool: pg.Pool, payload: OrderPlaced, run: number): Promise<void> =>
  inTransaction(pool, async (client) => {
    await insertOrder(client, payload, run)
    await client.query(HAND_OUTBOX_INSERT, [randomUUID(), BENCH_TYPE, JSON.stringify(payload)])
  })

/** Opens every pooled connection once, so the measurement does not pay for connecting. */
export const warmPool = async (pool: pg.Pool, size: number): Promise<void> => {
  const clients = await Promise.all(Array.from({ length: size }, () => pool.connect()))
  for (const client of clients) client.release()
}
