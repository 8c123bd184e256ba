/**
 * `txbox reconcile`: did a consumer apply everything it was owed? Per day (or
 * hour) × type × tenant, the producer's committed outbox rows that the
 * consumer's bindings route to it against its inbox rows of the same ids:
 * processed, still in flight (younger than the grace period), or missing,
 * with why (never published, never received, pending, dead) and their ids.
 * Exits 1 when anything older than the grace period is missing: an
 * operator's question after an incident, and a nightly job's check.
 *
 * The two sides may be two databases (`--url` the producer's, `--inbox-url`
 * the consumer's). Rows a retention already deleted on either side cannot be
 * compared: keep the window inside both retentions.
 */
import { Effect, Option } from "effect"
import { Command, Flag } from "effect/cli"
import * as opsSql from "../storage/sql/operations.ts"
import * as rec from "../storage/sql/reconcile.ts"
import { CheckFailedError, NotReadyError } from "./errors.ts"
import { connectionFlags, jsonFlag, parsing, withDatabase } from "./options.ts"
import { print, printJson, table } from "./output.ts"
import { formatAge, parseDuration, parsePositive, parseTimeBound } from "./parse.ts"

/** Outbox rows read per page, and inbox rows looked up per statement. */
const PAGE = 5000

/** Why an owed message has no effect yet. */
export type MissingReason = "unpublished" | "not received" | "pending" | "dead"

/** One day (or hour) × type × tenant. */
export interface ReconcileGroup {
  /** The bucket's start, ISO. */
  readonly bucket: string
  readonly type: string
  readonly tenant: string | null
  /** Outbox rows routed to the consumer, whatever their state. */
  owed: number
  /** Processed by the consumer. */
  processed: number
  /** Not processed yet and younger than the grace period: not a difference. */
  inFlight: number
  /** Not processed and older than the grace period. */
  missing: number
  readonly reasons: Record<MissingReason, number>
  /** Up to the limit: the missing ones. */
  readonly missingIds: Array<{ readonly id: string; readonly reason: MissingReason }>
  /** Dead in the outbox (never published) or in the consumer's inbox. */
  dead: number
  /** Owed messages the consumer's inbox has a row of, whatever its state. */
  received: number
  /** Publish attempts the outbox spent, and handler attempts the inbox recorded. */
  outboxAttempts: number
  inboxAttempts: number
  /** Enqueue → handler's commit, ms, of the processed ones (the two databases' clocks). */
  readonly latenciesMs: number[]
}

/** What a group says in the report: counts, ratios and latency quantiles. */
export interface GroupSummary extends Omit<ReconcileGroup, "latenciesMs"> {
  /** Dead rows (the outbox's and the inbox's) per owed message. */
  readonly deadRatio: number
  /** Handler attempts per message the inbox received. */
  readonly inboxAttemptsPerMessage: number
  readonly latencyMs: {
    readonly p50: number | null
    readonly p95: number | null
    readonly p99: number | null
  }
}

export interface ReconcileReport {
  readonly consumer: string
  readonly from: string
  readonly to: string
  readonly by: "day" | "hour"
  readonly graceSeconds: number
  readonly groups: ReadonlyArray<GroupSummary>
  readonly owed: number
  readonly processed: number
  readonly inFlight: number
  readonly missing: number
  /** Ordered keys of the consumer waiting (a missing or dead head): `txbox status` lists them. */
  readonly orderedKeysWaiting: number
}

const quantile = (sorted: ReadonlyArray<number>, q: number): number | null =>
  sorted.length === 0 ? null : sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]!

const bucketOf = (at: Date, by: "day" | "hour"): string => {
  const d = new Date(at)
  if (by === "day") d.setUTCHours(0, 0, 0, 0)
  else d.setUTCMinutes(0, 0, 0)
  return d.toISOString()
}

/**
 * The comparison, one message at a time: pure, so its rules are unit-tested. `graceEdge`: a
 * message enqueued after it is in flight, not missing, whatever its state.
 */
export const makeTally = (options: {
  readonly by: "day" | "hour"
  readonly graceEdge: Date
  readonly limit: number
}) => {
  const groups = new Map<string, ReconcileGroup>()
  const add = (owed: rec.OwedMessage, inbox: rec.InboxState | undefined): void => {
    const bucket = bucketOf(owed.occurredAt, options.by)
    const key = JSON.stringify([bucket, owed.type, owed.tenant])
    let g = groups.get(key)
    if (g === undefined) {
      g = {
        bucket,
        type: owed.type,
        tenant: owed.tenant,
        owed: 0,
        processed: 0,
        inFlight: 0,
        missing: 0,
        reasons: { unpublished: 0, "not received": 0, pending: 0, dead: 0 },
        missingIds: [],
        dead: 0,
        received: 0,
        outboxAttempts: 0,
        inboxAttempts: 0,
        latenciesMs: [],
      }
      groups.set(key, g)
    }
    g.owed++
    g.outboxAttempts += owed.attempts
    if (owed.status === "dead") g.dead++
    if (inbox !== undefined) {
      g.received++
      g.inboxAttempts += inbox.attempts
      if (inbox.status === "dead") g.dead++
    }
    if (inbox?.status === "processed") {
      g.processed++
      if (inbox.processedAt !== null)
        g.latenciesMs.push(inbox.processedAt.getTime() - owed.occurredAt.getTime())
      return
    }
    if (owed.occurredAt > options.graceEdge) {
      g.inFlight++
      return
    }
    const reason: MissingReason =
      owed.status !== "sent"
        ? "unpublished"
        : inbox === undefined
          ? "not received"
          : inbox.status === "dead"
            ? "dead"
            : "pending"
    g.missing++
    g.reasons[reason]++
    if (g.missingIds.length < options.limit) g.missingIds.push({ id: owed.id, reason })
  }
  const summaries = (): ReadonlyArray<GroupSummary> =>
    [...groups.values()]
      .sort(
        (a, b) =>
          a.bucket.localeCompare(b.bucket) ||
          a.type.localeCompare(b.type) ||
          (a.tenant ?? "").localeCompare(b.tenant ?? ""),
      )
      .map(({ latenciesMs, ...g }) => {
        const sorted = [...latenciesMs].sort((x, y) => x - y)
        return {
          ...g,
          deadRatio: g.owed === 0 ? 0 : g.dead / g.owed,
          inboxAttemptsPerMessage: g.received === 0 ? 0 : g.inboxAttempts / g.received,
          latencyMs: { p50: quantile(sorted, 0.5), p95: quantile(sorted, 0.95), p99: quantile(sorted, 0.99) },
        }
      })
  return { add, summaries }
}

const ms = (n: number | null) => (n === null ? "-" : n < 10_000 ? `${Math.round(n)} ms` : formatAge(n / 1000))

export const render = (r: ReconcileReport): string => {
  const head = `consumer ${r.consumer}, enqueued ${r.from} .. ${r.to}, grace ${formatAge(r.graceSeconds)}`
  if (r.groups.length === 0) return `${head}\nnothing was owed to it in that window`
  const parts = [
    head,
    table(
      [
        "BUCKET",
        "TYPE",
        "TENANT",
        "OWED",
        "PROCESSED",
        "IN FLIGHT",
        "MISSING",
        "DEAD %",
        "TRIES/MSG",
        "P50",
        "P99",
      ],
      r.groups.map((g) => [
        r.by === "day" ? g.bucket.slice(0, 10) : `${g.bucket.slice(0, 13)}h`,
        g.type,
        g.tenant ?? "(none)",
        String(g.owed),
        String(g.processed),
        String(g.inFlight),
        String(g.missing),
        (100 * g.deadRatio).toFixed(1),
        g.inboxAttemptsPerMessage.toFixed(2),
        ms(g.latencyMs.p50),
        ms(g.latencyMs.p99),
      ]),
      ["left", "left", "left", "right", "right", "right", "right", "right", "right", "right", "right"],
    ),
  ]
  const missing = r.groups.flatMap((g) =>
    g.missingIds.map((m) => [m.id, g.type, g.tenant ?? "(none)", m.reason]),
  )
  if (missing.length > 0) parts.push(table(["MISSING ID", "TYPE", "TENANT", "WHY"], missing))
  parts.push(
    `owed ${r.owed}, processed ${r.processed}, in flight ${r.inFlight}, missing ${r.missing}` +
      (r.orderedKeysWaiting > 0 ? `; ${r.orderedKeysWaiting} ordered key(s) waiting (txbox status)` : ""),
  )
  return parts.join("\n\n")
}

export const command = Command.make(
  "reconcile",
  {
    connection: connectionFlags,
    consumer: Flag.String("consumer").pipe(Flag.withDescription("the inbox consumer to reconcile")),
    inboxUrl: Flag.String("inbox-url").pipe(
      Flag.withDescription("the consumer's database, when it is not the producer's (--url)"),
      Flag.optional,
    ),
    since: Flag.String("since").pipe(
      Flag.withDescription(
        "messages enqueued from this time on: 2h, 7d (ago) or an ISO timestamp (default: 1d)",
      ),
      Flag.withDefault("1d"),
    ),
    until: Flag.String("until").pipe(
      Flag.withDescription("…and before this time (default: now)"),
      Flag.optional,
    ),
    by: Flag.Literals("by", ["day", "hour"]).pipe(
      Flag.withDescription("one row per day or per hour (UTC) × type × tenant (default: day)"),
      Flag.withDefault("day" as const),
    ),
    grace: Flag.String("grace").pipe(
      Flag.withDescription("messages younger than this are in flight, not missing (default: 5m)"),
      Flag.withDefault("5m"),
    ),
    limit: Flag.Int("limit").pipe(
      Flag.withDescription("missing ids listed per row (default: 20)"),
      Flag.withDefault(20),
    ),
    json: jsonFlag,
  },
  (input) =>
    Effect.gen(function* () {
      const since = yield* parsing(() => parseTimeBound("since", input.since))
      const until = yield* parsing(() => Option.map(input.until, (u) => parseTimeBound("until", u)))
      const graceSeconds = yield* parsing(() => parseDuration("grace", input.grace))
      const limit = yield* parsing(() => parsePositive("limit", input.limit))
      const inboxConnection = Option.match(input.inboxUrl, {
        onNone: () => undefined,
        onSome: (url) => ({ ...input.connection, url: Option.some(url) }),
      })
      const options = { since, until, graceSeconds, limit, by: input.by }
      const report = yield* withDatabase(input.connection, { requireTables: true }, (producer) =>
        inboxConnection === undefined
          ? reconcile(producer, producer, input.consumer, options)
          : withDatabase(inboxConnection, { requireTables: true }, (consumer) =>
              reconcile(producer, consumer, input.consumer, options),
            ),
      )
      yield* input.json ? printJson(report) : print(render(report))
      if (report.missing > 0) {
        return yield* new CheckFailedError({
          reason: `${report.missing} message(s) owed to ${report.consumer} for longer than ${formatAge(graceSeconds)} have no effect`,
        })
      }
    }),
).pipe(
  Command.withDescription(
    "Compare what a consumer was owed (the producer's outbox, through its bindings) with what its inbox processed, per day × type × tenant; exit 1 when a message older than --grace has no effect",
  ),
)

/** The whole comparison: the consumer's bindings, then the owed rows a page at a time with their inbox rows. */
export const reconcile = (
  producer: Parameters<typeof rec.owedPage>[0],
  consumerDb: Parameters<typeof rec.owedPage>[0],
  consumer: string,
  options: {
    readonly since: opsSql.TimeBound
    readonly until: Option.Option<opsSql.TimeBound>
    readonly graceSeconds: number
    readonly limit: number
    readonly by: "day" | "hour"
  },
) =>
  Effect.gen(function* () {
    const bindings = yield* rec.consumerBindings(consumerDb, consumer)
    if (bindings.length === 0) {
      return yield* new NotReadyError({
        reason: `consumer ${consumer} has no bindings in schema ${consumerDb.schema}: it never started there (or the name is wrong)`,
      })
    }
    const now = yield* rec.databaseNow(producer)
    const at = (bound: opsSql.TimeBound) =>
      "at" in bound ? bound.at : new Date(now.getTime() - bound.secondsAgo * 1000)
    const from = at(options.since)
    const to = Option.match(options.until, { onNone: () => now, onSome: at })
    const tally = makeTally({
      by: options.by,
      graceEdge: new Date(now.getTime() - options.graceSeconds * 1000),
      limit: options.limit,
    })
    let afterId: string | undefined
    while (true) {
      const page = yield* rec.owedPage(producer, { bindings, from, to, afterId, limit: PAGE })
      const states = yield* rec.inboxStates(
        consumerDb,
        consumer,
        page.map((m) => m.id),
      )
      const byId = new Map(states.map((s) => [s.id, s]))
      for (const m of page) tally.add(m, byId.get(m.id))
      if (page.length < PAGE) break
      afterId = page.at(-1)!.id
    }
    const groups = tally.summaries()
    const keys = yield* opsSql.waitingKeys(consumerDb, 1000)
    const sum = (f: (g: GroupSummary) => number) => groups.reduce((n, g) => n + f(g), 0)
    return {
      consumer,
      from: from.toISOString(),
      to: to.toISOString(),
      by: options.by,
      graceSeconds: options.graceSeconds,
      groups,
      owed: sum((g) => g.owed),
      processed: sum((g) => g.processed),
      inFlight: sum((g) => g.inFlight),
      missing: sum((g) => g.missing),
      orderedKeysWaiting: keys.filter((k) => k.consumer === consumer).length,
    } satisfies ReconcileReport
  })
