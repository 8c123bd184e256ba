// When enqueue's INSERT asks whether to wake the relays (storage/sql/enqueue.ts, migration 0013):
// the statements a plain client receives, recorded. The NOTIFY itself, against PostgreSQL, is
// test/integration/relay.test.ts ("enqueue wakes relays with NOTIFY only while…").
import { describe, expect, test } from "bun:test"
import { Effect } from "effect"
import * as v from "valibot"
import { defineEvent } from "../../src/Contract.ts"
import * as Outbox from "../../src/Outbox.ts"
import { TxboxSchema } from "../../src/ports/Database.ts"
import { QUIET_MS } from "../../src/storage/sql/enqueue.ts"

const Ping = defineEvent({ type: "test.ping", version: 1, schema: v.object({ n: v.number() }) })

/** A client that records each statement's text and answers a wake-up check as `notifies` says. */
const recordingClient = (at: { host: string; port: number; database: string } | object = {}) => {
  const texts: string[] = []
  let notifies = false
  return {
    ...at,
    texts,
    answer: (notify: boolean) => {
      notifies = notify
    },
    query: async (text: string) => {
      texts.push(text)
      return { rows: text.includes("outbox_wake()") ? [{ notified: notifies }] : [] }
    },
  }
}

const enqueueOn = (client: ReturnType<typeof recordingClient>, schema: string) =>
  Effect.runPromise(Effect.provideService(Outbox.enqueue(client, Ping, { n: 1 }), TxboxSchema, schema))

const checks = (texts: ReadonlyArray<string>) => texts.map((t) => t.includes("outbox_wake()"))

describe("enqueue's wake-up check", () => {
  test("after a check that found a relay warm, INSERTs skip it for QUIET_MS, then check again", async () => {
    const client = recordingClient()
    client.answer(false)
    await enqueueOn(client, "wake_quiet")
    await enqueueOn(client, "wake_quiet")
    await enqueueOn(client, "wake_quiet")
    expect(checks(client.texts)).toEqual([true, false, false])
    await Bun.sleep(QUIET_MS + 5)
    await enqueueOn(client, "wake_quiet")
    expect(checks(client.texts)).toEqual([true, false, false, true])
    // Every statement is the INSERT, checked or not.
    for (const text of client.texts) expect(text).toContain(`INSERT INTO "wake_quiet".outbox`)
  })

  test("after a check that notified, the next INSERT checks again (that NOTIFY is lost if its transaction rolls back)", async () => {
    const client = recordingClient()
    client.answer(true)
    await enqueueOn(client, "wake_notified")
    await enqueueOn(client, "wake_notified")
    expect(checks(client.texts)).toEqual([true, true])
  })

  test("the quiet window is per database and schema: another schema's or another client's INSERT still checks", async () => {
    const client = recordingClient()
    client.answer(false)
    await enqueueOn(client, "wake_one")
    await enqueueOn(client, "wake_two")
    expect(checks(client.texts)).toEqual([true, true])
    expect(client.texts[1]).toContain(`"wake_two".outbox_wake()`)
    // Another client that does not say where it is connected has no quiet window yet.
    const other = recordingClient()
    other.answer(false)
    await enqueueOn(other, "wake_one")
    expect(checks(other.texts)).toEqual([true])
  })

  test("node-postgres clients of one database share the quiet window; another database's do not", async () => {
    const first = recordingClient({ host: "db-a", port: 5432, database: "shop" })
    const pooledTwin = recordingClient({ host: "db-a", port: 5432, database: "shop" })
    const otherTenant = recordingClient({ host: "db-a", port: 5432, database: "tenant_2" })
    first.answer(false)
    await enqueueOn(first, "wake_pool")
    await enqueueOn(pooledTwin, "wake_pool")
    await enqueueOn(otherTenant, "wake_pool")
    expect([...checks(first.texts), ...checks(pooledTwin.texts), ...checks(otherTenant.texts)]).toEqual([
      true,
      false,
      true,
    ])
  })
})
