// The postgres.js pool renewal and reservation guard, over fake pools: the logic only. Its effect on
// a real database is in test/integration/store-faults.test.ts (a backend killed inside a
// transaction) and the postgres.js soak (test/integration/soak.test.ts).
import { describe, expect, test } from "bun:test"
import type postgres from "postgres"
import { makeRenewingClient } from "../../src/storage/drivers/postgres-js/renewingPool.ts"

interface FakePool {
  readonly id: number
  readonly close: () => void
  /** A statement with this text never answers; reserve() waits while `full`. */
  hang: string | undefined
  full: boolean
  reserved: number
  released: number
  statements: string[]
  endedWith: { timeout?: number } | undefined
}

const fakes = () => {
  const pools: FakePool[] = []
  const create = (onclose: () => void): postgres.Sql => {
    const pool: FakePool = {
      id: pools.length,
      close: onclose,
      hang: undefined,
      full: false,
      reserved: 0,
      released: 0,
      statements: [],
      endedWith: undefined,
    }
    pools.push(pool)
    return {
      reserve: async () => {
        while (pool.full) await new Promise((resolve) => setTimeout(resolve, 5))
        pool.reserved++
        return {
          unsafe: (text: string) => {
            pool.statements.push(text)
            const answer = text === pool.hang ? new Promise(() => {}) : Promise.resolve([])
            return Object.assign(answer, { cursor: () => undefined })
          },
          release: () => {
            pool.released++
          },
        }
      },
      end: async (options?: { timeout?: number }) => {
        pool.endedWith = options ?? {}
      },
    } as unknown as postgres.Sql
  }
  return { pools, create }
}

describe("renewing postgres.js client", () => {
  test("the first close replaces the pool; further closes of the old one change nothing; it ends with the grace", async () => {
    const { pools, create } = fakes()
    const client = makeRenewingClient(create, { graceSeconds: 7, settleMs: 20 })
    await client.facade.reserve()
    expect(pools[0]!.reserved).toBe(1)
    for (let i = 0; i < 5; i++) pools[0]!.close()
    expect(pools.length).toBe(2)
    expect(client.renewals()).toBe(1)
    expect(pools[0]!.endedWith).toEqual({ timeout: 7 })
    await client.facade.reserve()
    expect(pools[1]!.reserved).toBe(1)
    expect(client.current()).not.toBe(undefined)
  })

  test("a transaction of a pool that saw a close never reaches it again and is not handed back", async () => {
    const { pools, create } = fakes()
    const client = makeRenewingClient(create, { graceSeconds: 1, settleMs: 20 })
    const trx = await client.facade.reserve()
    await trx.unsafe("begin")
    pools[0]!.close()
    const refused = await trx.unsafe("rollback").then(
      () => undefined,
      (e: { code?: string }) => e.code,
    )
    expect(refused).toBe("CONNECTION_CLOSED")
    trx.release()
    expect(pools[0]!.statements).toEqual(["begin"])
    expect(pools[0]!.released).toBe(0)
    // The fresh pool's transactions run and are handed back as usual.
    const next = await client.facade.reserve()
    await next.unsafe("select 1")
    next.release()
    expect(pools[1]!.statements).toEqual(["select 1"])
    expect(pools[1]!.released).toBe(1)
  })

  test("a statement still unanswered when its pool closes fails settleMs later instead of waiting forever", async () => {
    const { pools, create } = fakes()
    const client = makeRenewingClient(create, { graceSeconds: 1, settleMs: 20 })
    const trx = await client.facade.reserve()
    pools[0]!.hang = "rollback"
    const answer = trx.unsafe("rollback").then(
      () => "answered",
      (e: { code?: string }) => e.code,
    )
    pools[0]!.close()
    expect(await answer).toBe("CONNECTION_CLOSED")
  })

  test("a transaction waiting for a connection when its pool closes gets one from the fresh pool", async () => {
    const { pools, create } = fakes()
    const client = makeRenewingClient(create, { graceSeconds: 1, settleMs: 20 })
    pools[0]!.full = true
    const waiting = client.facade.reserve()
    await new Promise((resolve) => setTimeout(resolve, 10))
    pools[0]!.close()
    const trx = await waiting
    await trx.unsafe("select 1")
    expect(pools[1]!.statements).toEqual(["select 1"])
    // The old pool's late connection is neither used nor handed back into a pool that saw a close.
    pools[0]!.full = false
    await new Promise((resolve) => setTimeout(resolve, 20))
    expect(pools[0]!.statements).toEqual([])
    expect(pools[0]!.released).toBe(0)
  })

  test("end() ends the pool of the moment and renews no more", async () => {
    const { pools, create } = fakes()
    const client = makeRenewingClient(create, { graceSeconds: 1, settleMs: 20 })
    await client.facade.end({ timeout: 2 })
    pools[0]!.close()
    expect(pools.length).toBe(1)
    expect(pools[0]!.endedWith).toEqual({ timeout: 2 })
  })
})
