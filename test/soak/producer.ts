// A producer process for the soak: a loop of business transactions, each writing 1–3 orders and
// their events with `Outbox.enqueue` in the same transaction: an OrderPlaced per order, and an
// OrderPaid after it for the orders paid at once (`orders.paid`); a share of the transactions roll
// back on purpose after writing both. Each order has a partition key, one of KEYS customers, which
// both its events carry, so each key's sequence interleaves the two types and the soak checks
// per-key order. Wired as in the README quickstart (the store's own Kysely): every other transaction
// in `Outbox.transaction`, the rest in Kysely's own.
// env: DB_URL, DRIVER (unset = the library's default driver), RATE (transactions per second,
//   default 25), ROLLBACK_FRACTION (default 0.1), PAID_FRACTION (share of orders paid, default 0.5),
//   KEYS (default 200), PRODUCER (a name for its log lines)
// Prints `progress {json}` every 2 s and `done {json}` after SIGTERM, when it exits 0.
import { randomUUID } from "node:crypto"
import { Effect, ManagedRuntime } from "effect"
import { Database, Outbox } from "../../src/index.ts"
import { announce, logLine, storeLayer } from "./child.ts"
import { OrderPaid, OrderPlaced } from "./contract.ts"

const rate = Number(process.env.RATE ?? "25")
const rollbackFraction = Number(process.env.ROLLBACK_FRACTION ?? "0.1")
const paidFraction = Number(process.env.PAID_FRACTION ?? "0.5")
// Distinct partition keys (customers) the orders are spread over.
const keys = Number(process.env.KEYS ?? "200")
const name = process.env.PRODUCER ?? "producer"

class IntendedRollback extends Error {}

const runtime = ManagedRuntime.make(storeLayer())
const { db } = await runtime.runPromise(
  Effect.gen(function* () {
    return yield* Database
  }),
)

const stats = { transactions: 0, committed: 0, rolledBack: 0, failed: 0, lastCommitAt: "" }
let stopping = false
process.on("SIGTERM", () => {
  stopping = true
})
const report = (what: "progress" | "done") => announce(`${what} ${JSON.stringify(stats)}`)
const timer = setInterval(() => report("progress"), 2000)

announce("producer started")
let seq = 0
let rollbacks = 0
let next = performance.now()
while (!stopping) {
  const size = 1 + Math.floor(Math.random() * 3)
  const rollback = Math.random() < rollbackFraction
  const orders = Array.from({ length: size }, () => ({
    id: randomUUID(),
    // Positive for orders meant to commit, negative for those of a transaction that rolls back.
    n: rollback ? -++rollbacks : ++seq,
    paid: Math.random() < paidFraction,
    key: `customer-${Math.floor(Math.random() * keys)}`,
  }))
  stats.transactions++
  try {
    // Each order is a customer's, and a customer's events must be handled in commit order: the
    // partition key. One enqueue call for the transaction's events, so their keys are locked in
    // one sorted pass (see docs/ordering.md). Run under the store's runtime: enqueue writes
    // to the schema the relay reads (TxboxSchema).
    const events = orders.flatMap((order) => {
      const payload = { orderId: order.id, n: order.n }
      const options = { partitionKey: order.key }
      const placed = { contract: OrderPlaced, payload, options }
      return order.paid ? [placed, { contract: OrderPaid, payload, options }] : [placed]
    })
    const insertOrders = async (trx: typeof db) => {
      for (const order of orders)
        await trx.insertInto("orders").values({ id: order.id, n: order.n, paid: order.paid }).execute()
    }
    if (stats.transactions % 2 === 0) {
      // Every other transaction in Outbox.transaction (txbox opens and commits it), the rest in
      // Kysely's: both under the soak's faults.
      await runtime.runPromise(
        Outbox.transaction(db, (trx) =>
          Effect.gen(function* () {
            yield* Effect.tryPromise({ try: () => insertOrders(trx), catch: (e) => e })
            yield* Outbox.enqueueMany(trx, events)
            if (rollback) return yield* Effect.fail(new IntendedRollback("rolled back on purpose"))
          }),
        ),
      )
    } else {
      await db.transaction().execute(async (trx) => {
        await insertOrders(trx)
        await runtime.runPromise(Outbox.enqueueMany(trx, events))
        if (rollback) throw new IntendedRollback("rolled back on purpose")
      })
    }
    stats.committed += size
    stats.lastCommitAt = new Date().toISOString()
  } catch (error) {
    if (error instanceof IntendedRollback) {
      stats.rolledBack += size
    } else {
      // A fault (database restarted, connection cut): the outcome may be unknown (a lost COMMIT
      // reply), which is fine — the orchestrator counts committed orders from the table.
      stats.failed++
      logLine(`${name}: transaction failed: ${error instanceof Error ? error.message : String(error)}`)
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
  }
  // Paced, without catching up in a burst after an outage.
  next += 1000 / rate
  const now = performance.now()
  if (next < now - 1000) next = now
  if (next > now) await new Promise((resolve) => setTimeout(resolve, next - now))
}

clearInterval(timer)
report("done")
await runtime.dispose()
process.exit(0)
