/**
 * A relay's share of the outbox (`OutboxShard`) as SQL: how a claim binds it, and the condition
 * that keeps a claim to it.
 */
import { sql } from "kysely"
import type { OutboxShard } from "../../ports/OutboxStore.ts"

/**
 * A shard as a claim binds it: one tenant, several as an array literal (one text parameter), or
 * the hash share. Undefined: every row.
 */
export type ShardParams =
  | { readonly tenant: string }
  | { readonly tenants: string }
  | { readonly of: number; readonly index: number }
  | { readonly sweepAfterMs: number }

/**
 * A PostgreSQL array literal of text (`{"a","b"}`), bound as one text parameter: every driver binds
 * a string the same way, and the planner of a custom plan sees the tenants (their rows' estimate
 * chooses the tenant index; an array from a subquery is an unknown it walked `outbox_due` for).
 */
const textArray = (values: ReadonlyArray<string>): string =>
  `{${values.map((v) => `"${v.replaceAll("\\", "\\\\").replaceAll('"', '\\"')}"`).join(",")}}`

/** The bound form of `shard` (`OutboxShard`). */
export const shardParams = (shard: OutboxShard | undefined): ShardParams | undefined =>
  shard === undefined
    ? undefined
    : "sweepAfterMs" in shard
      ? { sweepAfterMs: shard.sweepAfterMs }
      : "tenants" in shard
        ? shard.tenants.length === 1
          ? { tenant: shard.tenants[0]! }
          : { tenants: textArray(shard.tenants) }
        : { of: shard.of, index: shard.index }

/** `shardParams`, remembering the last shard: a relay claims with the same one every cycle. */
export const shardBinder = () => {
  let last: OutboxShard | undefined
  let bound: ShardParams | undefined
  return (shard: OutboxShard | undefined): ShardParams | undefined => {
    if (shard !== last) {
      last = shard
      bound = shardParams(shard)
    }
    return bound
  }
}

/**
 * Whether the outbox row (aliased `o` or not) is in the shard. Tenants: an index condition on
 * `outbox_tenant_due` (migration 0018), so a tenant's relay never walks another's backlog. The
 * hash share: `hashtext` of the partition key, or of the id for a message without one (so a key
 * is always in one share), a filter on the walk of `outbox_due`.
 */
export const inShard = (shard: ShardParams | undefined, o: "o." | "") => {
  if (shard === undefined) return sql<boolean>`true`
  // A WAL relay's sweep: a filter on the walk of `outbox_due`, whose front holds the rows its log
  // is publishing (fresh ones, due when enqueued), skipped.
  if ("sweepAfterMs" in shard) {
    const visible = sql.raw(`${o}visible_at`)
    const occurred = sql.raw(`${o}occurred_at`)
    return sql<boolean>`(${visible} > ${occurred} OR ${occurred} <= now() - ${shard.sweepAfterMs}::int * interval '1 millisecond')`
  }
  // One tenant: an equality, so the index gives its rows in due order and the claim stops at its
  // limit. Several: `= ANY`, whose rows PostgreSQL 15 sorts (a tenant's backlog, per claim).
  if ("tenant" in shard) {
    const tenant = sql.raw(`${o}tenant_id`)
    return sql<boolean>`${tenant} IS NOT NULL AND ${tenant} = ${shard.tenant}`
  }
  if ("tenants" in shard) {
    // IS NOT NULL as well: the index is partial on it, and the planner cannot tell that `= ANY` of
    // an array it has not seen yet implies it.
    const tenant = sql.raw(`${o}tenant_id`)
    return sql<boolean>`${tenant} IS NOT NULL AND ${tenant} = ANY (${shard.tenants}::text::text[])`
  }
  return sql<boolean>`abs(hashtext(coalesce(${sql.raw(`${o}partition_key`)}, ${sql.raw(`${o}id`)}::text))::bigint) % ${shard.of}::int = ${shard.index}::int`
}
