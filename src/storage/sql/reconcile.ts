/**
 * The statements behind `txbox reconcile` (issue #28): what a consumer was
 * owed, read from the producer's outbox a page at a time, and what its inbox
 * made of each of those messages, looked up by id. Reads only; the two sides
 * may be two databases. The comparison itself is `cli/reconcile.ts`'s.
 */
import { Effect } from "effect"
import { sql } from "kysely"
import type { StoreError } from "../../Errors.ts"
import type { DatabaseShape } from "../../ports/Database.ts"
import type { InboxStatus, OutboxStatus } from "../../ports/tables.ts"
import { query, tables } from "./operations.ts"
import { idBound } from "./partitionBounds.ts"

/** A routing-key pattern the consumer's queue is bound with, and since when (migration 0009). */
export interface Binding {
  readonly pattern: string
  readonly boundAt: Date
}

/** The consumer's bindings as its inbox recorded them at start; none: it never started here. */
export const consumerBindings = (
  db: DatabaseShape,
  consumer: string,
): Effect.Effect<ReadonlyArray<Binding>, StoreError> =>
  query("reconcile.bindings", async () => {
    const rows = await tables(db)
      .selectFrom("inbox_bindings")
      .select(["pattern", "bound_at"])
      .where("consumer", "=", consumer)
      .orderBy("pattern")
      .execute()
    return rows.map((r) => ({ pattern: r.pattern, boundAt: new Date(r.bound_at) }))
  })

/**
 * An AMQP topic pattern as a POSIX regular expression over a whole routing key:
 * words split on `.`, `*` one word, `#` zero or more. Pure.
 */
export const topicRegex = (pattern: string): string => {
  // `#.#` is `#`: consecutive ones collapse.
  const words = pattern.split(".").filter((w, i, all) => !(w === "#" && all[i - 1] === "#"))
  if (words.length === 1 && words[0] === "#") return "^.*$"
  let re = ""
  words.forEach((word, i) => {
    if (word === "#") {
      // Zero or more words: leading, each with the dot after it; elsewhere, with the dot before.
      re += i === 0 ? "([^.]+\\.)*" : "(\\.[^.]+)*"
      return
    }
    const text = word === "*" ? "[^.]+" : word.replace(/[\\^$.|?*+()[\]{}]/g, (c) => `\\${c}`)
    re += i === 0 || (i === 1 && words[0] === "#") ? text : `\\.${text}`
  })
  return `^${re}$`
}

/** One message the consumer was owed, as the producer's outbox has it. */
export interface OwedMessage {
  readonly id: string
  readonly type: string
  readonly tenant: string | null
  readonly status: OutboxStatus
  readonly occurredAt: Date
  readonly publishedAt: Date | null
  readonly attempts: number
}

/**
 * The next `limit` outbox rows after `afterId` that were enqueued in [from, to) and that the
 * consumer's bindings route to it: the routing key (the type when none) matches a binding's
 * pattern, and the row was published after that binding existed (before, the broker had no queue
 * to route it to). By id, on the primary key: txbox's ids are UUIDv7, whose first 48 bits are the
 * enqueue time, so [from, to) is a range of ids (an id given to enqueue that is not a UUIDv7 falls
 * wherever its bits say).
 */
export const owedPage = (
  db: DatabaseShape,
  options: {
    readonly bindings: ReadonlyArray<Binding>
    readonly from: Date
    readonly to: Date
    readonly afterId: string | undefined
    readonly limit: number
  },
): Effect.Effect<ReadonlyArray<OwedMessage>, StoreError> =>
  query("reconcile.owed", async () => {
    const { bindings, from, to, afterId, limit } = options
    const patterns = JSON.stringify(bindings.map((b) => topicRegex(b.pattern)))
    const boundAts = JSON.stringify(bindings.map((b) => b.boundAt.toISOString()))
    const rows = await tables(db)
      .selectFrom("outbox as o")
      .select([
        sql<string>`o.id::text`.as("id"),
        "o.type",
        "o.tenant_id",
        "o.status",
        "o.occurred_at",
        "o.published_at",
        "o.attempts",
      ])
      .where("o.id", ">=", sql<string>`${afterId ?? idBound(from.getTime())}::uuid`)
      .$if(afterId !== undefined, (qb) => qb.where("o.id", "!=", sql<string>`${afterId!}::uuid`))
      .where("o.id", "<", sql<string>`${idBound(to.getTime())}::uuid`)
      // sql: Kysely has no words for a regular-expression match over two arrays zipped by position.
      .where(
        sql<boolean>`EXISTS (SELECT 1 FROM json_array_elements_text(${patterns}::text::json) WITH ORDINALITY AS p(re, n)
          JOIN json_array_elements_text(${boundAts}::text::json) WITH ORDINALITY AS b(at, n) USING (n)
          WHERE coalesce(o.routing_key, o.type) ~ p.re
            AND coalesce(o.published_at, o.occurred_at) >= b.at::timestamptz)`,
      )
      .orderBy("o.id")
      .limit(limit)
      .execute()
    return rows.map((r) => ({
      id: r.id,
      type: r.type,
      tenant: r.tenant_id,
      status: r.status,
      occurredAt: new Date(r.occurred_at),
      publishedAt: r.published_at === null ? null : new Date(r.published_at),
      attempts: Number(r.attempts),
    }))
  })

/** What a consumer's inbox holds of one message. */
export interface InboxState {
  readonly id: string
  readonly status: InboxStatus
  readonly attempts: number
  readonly receivedAt: Date
  readonly processedAt: Date | null
}

/** The consumer's inbox rows of `ids`, on the primary key (message_id, consumer). */
export const inboxStates = (
  db: DatabaseShape,
  consumer: string,
  ids: ReadonlyArray<string>,
): Effect.Effect<ReadonlyArray<InboxState>, StoreError> =>
  ids.length === 0
    ? Effect.succeed([])
    : query("reconcile.inbox", async () => {
        const rows = await tables(db)
          .selectFrom("inbox")
          .select(["message_id", "status", "attempts", "received_at", "processed_at"])
          .where("consumer", "=", consumer)
          .where(
            "message_id",
            "=",
            sql<string>`ANY (ARRAY(SELECT json_array_elements_text(${JSON.stringify(ids)}::text::json)))`,
          )
          .execute()
        return rows.map((r) => ({
          id: r.message_id,
          status: r.status,
          attempts: Number(r.attempts),
          receivedAt: new Date(r.received_at),
          processedAt: r.processed_at === null ? null : new Date(r.processed_at),
        }))
      })

/** The database's clock: the grace period and the window are the database's time, not the client's. */
export const databaseNow = (db: DatabaseShape): Effect.Effect<Date, StoreError> =>
  query("reconcile.now", async () => {
    const { rows } = await sql<{ now: Date | string }>`SELECT now() AS now`.execute(db.db)
    return new Date(rows[0]!.now)
  })
