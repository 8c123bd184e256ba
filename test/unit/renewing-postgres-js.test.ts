// The postgres.js pool renewal, over fake pools: the logic only. Its effect on a real database
// under restarts is the postgres.js soak (test/integration/soak.test.ts).
import { describe, expect, test } from "bun:test"
import type postgres from "postgres"
import { makeRenewingClient } from "../../src/storage/renewingPostgresJs.ts"

interface FakePool {
  readonly id: number
  readonly close: () => void
  reserved: number
  endedWith: { timeout?: number } | undefined
}

const fakes = () => {
  const pools: FakePool[] = []
  const create = (onclose: () => void): postgres.Sql => {
    const pool: FakePool = {
      id: pools.length,
      close: onclose,
      reserved: 0,
      endedWith: undefined,
    }
    pools.push(pool)
    return {
      reserve: async () => {
        pool.reserved++
        return { pool: pool.id }
      },
      end: async (options?: { timeout?: number }) => {
        pool.endedWith = options ?? {}
      },
    } as unknown as postgres.Sql
  }
  return { pools, create }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

describe("renewing postgres.js client", () => {
  test("a burst of closes replaces the pool once; new work goes to the new pool; the old one ends with the grace", async () => {
    const { pools, create } = fakes()
    const client = makeRenewingClient(create, { debounceMs: 10, graceSeconds: 7 })
    await client.facade.reserve()
    expect(pools[0]!.reserved).toBe(1)
    for (let i = 0; i < 5; i++) pools[0]!.close()
    await sleep(40)
    expect(pools.length).toBe(2)
    expect(client.renewals()).toBe(1)
    expect(pools[0]!.endedWith).toEqual({ timeout: 7 })
    await client.facade.reserve()
    expect(pools[1]!.reserved).toBe(1)
    expect(client.current()).not.toBe(undefined)
  })

  test("closes of a retired pool (its own ending) change nothing", async () => {
    const { pools, create } = fakes()
    const client = makeRenewingClient(create, { debounceMs: 10, graceSeconds: 1 })
    pools[0]!.close()
    await sleep(40)
    pools[0]!.close()
    await sleep(40)
    expect(pools.length).toBe(2)
    expect(client.renewals()).toBe(1)
  })

  test("end() ends the pool of the moment and renews no more", async () => {
    const { pools, create } = fakes()
    const client = makeRenewingClient(create, { debounceMs: 10, graceSeconds: 1 })
    pools[0]!.close()
    await client.facade.end({ timeout: 2 })
    await sleep(40)
    expect(pools.length).toBe(1)
    expect(pools[0]!.endedWith).toEqual({ timeout: 2 })
  })
})
