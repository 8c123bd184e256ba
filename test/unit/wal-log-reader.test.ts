// The WAL relay's pure parts (issue #27): pgoutput frames decoded, whole transactions handed out in
// batches, and the position the slot is told. The stream itself is test/integration/wal-relay.test.ts's.
import { describe, expect, test } from "bun:test"
import { publishesAtOnce } from "../../src/core/walRelay.ts"
import { LogReader } from "../../src/storage/wal/logReader.ts"
import { parseTimestamp } from "../../src/storage/wal/outboxRows.ts"
import {
  decodeFrame,
  lsnText,
  ProtocolError,
  parseLsn,
  statusUpdate,
} from "../../src/storage/wal/pgoutput.ts"
import { logRow } from "../support/outboxLogRow.ts"

const encoder = new TextEncoder()

/** Bytes written big-endian, as the protocol does. */
class Writer {
  private readonly parts: number[] = []
  u8(v: number) {
    this.parts.push(v & 0xff)
    return this
  }
  i16(v: number) {
    return this.u8(v >> 8).u8(v)
  }
  i32(v: number) {
    return this.u8(v >>> 24)
      .u8(v >>> 16)
      .u8(v >>> 8)
      .u8(v)
  }
  u64(v: bigint) {
    for (let shift = 56n; shift >= 0n; shift -= 8n) this.u8(Number((v >> shift) & 0xffn))
    return this
  }
  cstring(text: string) {
    for (const b of encoder.encode(text)) this.u8(b)
    return this.u8(0)
  }
  bytes(): Uint8Array {
    return Uint8Array.from(this.parts)
  }
}

const xlog = (message: Uint8Array, walEnd = 0n): Uint8Array => {
  const head = new Writer().u8(0x77).u64(0n).u64(walEnd).u64(0n).bytes()
  const all = new Uint8Array(head.length + message.length)
  all.set(head)
  all.set(message, head.length)
  return all
}
const keepalive = (walEnd: bigint, reply: boolean) =>
  new Writer()
    .u8(0x6b)
    .u64(walEnd)
    .u64(0n)
    .u8(reply ? 1 : 0)
    .bytes()
const begin = () => xlog(new Writer().u8(0x42).u64(0n).u64(0n).i32(7).bytes())
const commit = (endLsn: bigint) =>
  xlog(
    new Writer()
      .u8(0x43)
      .u8(0)
      .u64(endLsn - 8n)
      .u64(endLsn)
      .u64(0n)
      .bytes(),
  )

const COLUMNS = [
  "id",
  "type",
  "version",
  "payload",
  "headers",
  "routing_key",
  "partition_key",
  "partition_epoch",
  "partition_seq",
  "tenant_id",
  "occurred_at",
  "visible_at",
  "attempts",
  "status",
  "lock_token",
  "published_at",
  "last_error",
]
const relation = (id: number, schema: string, table: string, columns = COLUMNS) => {
  const w = new Writer().u8(0x52).i32(id).cstring(schema).cstring(table).u8(0x64).i16(columns.length)
  for (const name of columns) w.u8(0).cstring(name).i32(25).i32(-1)
  return xlog(w.bytes())
}
const insert = (relationId: number, values: Record<string, string | null>) => {
  const w = new Writer().u8(0x49).i32(relationId).u8(0x4e).i16(COLUMNS.length)
  for (const name of COLUMNS) {
    const value = values[name] ?? null
    if (value === null) w.u8(0x6e)
    else {
      const bytes = encoder.encode(value)
      w.u8(0x74).i32(bytes.length)
      for (const b of bytes) w.u8(b)
    }
  }
  return xlog(w.bytes())
}
const row = (id: string, extra: Record<string, string | null> = {}) => ({
  id,
  type: "orders.order-placed",
  version: "1",
  payload: '{"n": 1}',
  headers: '{"traceparent": "00-abc"}',
  occurred_at: "2026-11-28 21:00:00.123456+00",
  visible_at: "2026-11-28 21:00:00.123456+00",
  attempts: "0",
  status: "pending",
  ...extra,
})

describe("LogReader", () => {
  test("hands out whole committed transactions' outbox rows, in commit order, as messages", () => {
    const reader = new LogReader("txbox.outbox")
    expect(reader.feed(begin())).toBeUndefined()
    reader.feed(relation(1, "txbox", "outbox"))
    reader.feed(
      insert(1, row("a", { partition_key: "k", partition_epoch: "5", partition_seq: "2", tenant_id: "t" })),
    )
    expect(reader.ready).toBe(false) // not committed yet
    expect(reader.feed(commit(100n))).toBe("rows")
    reader.feed(begin())
    reader.feed(insert(1, row("b")))
    reader.feed(commit(200n))

    const batch = reader.take(1000)!
    expect(batch.position).toBe(200n)
    expect(batch.rows.map((r) => r.id)).toEqual(["a", "b"])
    const a = batch.rows[0]!
    expect(a).toMatchObject({
      type: "orders.order-placed",
      version: 1,
      payload: '{"n": 1}',
      headers: { traceparent: "00-abc" },
      routingKey: null,
      partitionKey: "k",
      position: { epoch: 5, seq: 2 },
      tenantId: "t",
      attempts: 0,
      status: "pending",
    })
    expect(a.occurredAt.toISOString()).toBe("2026-11-28T21:00:00.123Z")
    expect(reader.take(1000)).toBeUndefined()
  })

  test("a batch stops at maxRows between transactions, never inside one", () => {
    const reader = new LogReader("txbox.outbox")
    reader.feed(relation(1, "txbox", "outbox"))
    for (const [end, ids] of [
      [10n, ["a", "b", "c"]],
      [20n, ["d", "e"]],
      [30n, ["f"]],
    ] as const) {
      reader.feed(begin())
      for (const id of ids) reader.feed(insert(1, row(id)))
      reader.feed(commit(end))
    }
    // The first transaction alone is over the limit: it goes whole.
    expect(reader.take(2)).toMatchObject({ position: 10n, rows: [{ id: "a" }, { id: "b" }, { id: "c" }] })
    expect(reader.take(3)).toMatchObject({ position: 30n, rows: [{ id: "d" }, { id: "e" }, { id: "f" }] })
  })

  test("inserts into another relation (another schema's outbox, another table) are not the outbox's", () => {
    const reader = new LogReader("txbox.outbox")
    reader.feed(relation(1, "other", "outbox"))
    reader.feed(relation(2, "txbox", "orders", ["id", "total"]))
    reader.feed(begin())
    reader.feed(insert(1, row("x")))
    expect(reader.feed(commit(10n))).toBeUndefined()
    expect(reader.ready).toBe(false)
  })

  test("the slot is told the WAL end only while nothing is open, waiting or unconfirmed", () => {
    const reader = new LogReader("txbox.outbox")
    expect(reader.feed(keepalive(50n, true))).toBe("reply")
    // Idle: the server's WAL end, so the slot holds nothing for an outbox with nothing to send.
    expect(reader.flushPosition).toBe(50n)
    reader.feed(relation(1, "txbox", "outbox"))
    reader.feed(begin())
    reader.feed(insert(1, row("a")))
    reader.feed(keepalive(80n, false))
    expect(reader.flushPosition).toBe(0n) // a transaction open
    reader.feed(commit(90n))
    reader.feed(keepalive(120n, false))
    expect(reader.flushPosition).toBe(0n) // waiting to be taken
    const batch = reader.take(10)!
    expect(reader.flushPosition).toBe(0n) // handed out, not confirmed
    reader.confirm(batch.position)
    expect(reader.flushPosition).toBe(120n)
  })

  test("a reply the server waits on (its shutdown) confirms all it sent, whatever is in flight", () => {
    const reader = new LogReader("txbox.outbox")
    reader.feed(relation(1, "txbox", "outbox"))
    reader.feed(begin())
    reader.feed(insert(1, row("a")))
    reader.feed(commit(90n))
    reader.take(10)
    expect(reader.feed(keepalive(150n, false))).toBeUndefined()
    expect(reader.flushPosition).toBe(0n) // handed out, not confirmed
    expect(reader.feed(keepalive(160n, true))).toBe("reply")
    reader.confirmAll()
    expect(reader.flushPosition).toBe(160n)
    // The batch confirmed later moves nothing back.
    reader.confirm(90n)
    expect(reader.flushPosition).toBe(160n)
  })

  test("a new connection drops what was read and not taken: the server sends it again", () => {
    const reader = new LogReader("txbox.outbox")
    reader.feed(relation(1, "txbox", "outbox"))
    reader.feed(begin())
    reader.feed(insert(1, row("a")))
    reader.feed(commit(10n))
    reader.restart()
    expect(reader.ready).toBe(false)
    // Relations come again too: an insert for an unknown relation is not taken for the outbox's.
    reader.feed(begin())
    reader.feed(insert(1, row("a")))
    reader.feed(commit(10n))
    expect(reader.ready).toBe(false)
  })

  test("a bad frame is a ProtocolError, not a row", () => {
    const reader = new LogReader("txbox.outbox")
    reader.feed(relation(1, "txbox", "outbox"))
    reader.feed(begin())
    expect(() => reader.feed(insert(1, row("a", { status: "weird" })))).toThrow(ProtocolError)
    expect(() => reader.feed(xlog(new Writer().u8(0x49).i32(1).bytes()))).toThrow(ProtocolError)
  })
})

describe("pgoutput framing", () => {
  test("LSNs in PostgreSQL's text form, both ways", () => {
    expect(lsnText(parseLsn("16/B374D848"))).toBe("16/B374D848")
    expect(parseLsn("0/10")).toBe(16n)
    expect(() => parseLsn("nope")).toThrow(ProtocolError)
  })

  test("a status update carries the position three times and the clock from 2000", () => {
    const bytes = statusUpdate(0x1_0000_0002n, Date.UTC(2000, 0, 1, 0, 0, 1))
    const view = new DataView(bytes.buffer)
    expect(bytes[0]).toBe(0x72)
    expect(view.getBigUint64(1)).toBe(0x1_0000_0002n)
    expect(view.getBigUint64(9)).toBe(0x1_0000_0002n)
    expect(view.getBigUint64(17)).toBe(0x1_0000_0002n)
    expect(view.getBigInt64(25)).toBe(1_000_000n)
    expect(bytes[33]).toBe(0)
  })

  test("keepalives and unknown frames", () => {
    expect(decodeFrame(keepalive(7n, true))).toEqual({ _tag: "Keepalive", walEnd: 7n, reply: true })
    expect(decodeFrame(Uint8Array.of(0x7a))).toEqual({ _tag: "Unknown", kind: 0x7a })
  })

  test("timestamps with and without fractions and offsets", () => {
    expect(parseTimestamp("2026-11-28 21:00:00+00").toISOString()).toBe("2026-11-28T21:00:00.000Z")
    expect(parseTimestamp("2026-11-28 21:00:00.5+05:30").toISOString()).toBe("2026-11-28T15:30:00.500Z")
    expect(() => parseTimestamp("yesterday")).toThrow(ProtocolError)
  })

  // Read by hand (the fast path) for what the replication session writes; the same instant as the
  // text means, checked against Date's own reading of its ISO 8601 form, for each shape PostgreSQL
  // writes: fractions of 0 to 6 digits, offsets of hours, hours and minutes, either sign.
  test("the hand-read timestamps agree with Date's reading of the same instant", () => {
    const shapes = ["", ".1", ".12", ".123", ".1234", ".12345", ".999999", ".000001"]
    const offsets = ["+00", "-03", "+05:30", "-09:45", "+14", "+0530"]
    let checked = 0
    for (let n = 0; n < 400; n++) {
      const at = new Date(
        Date.UTC(1971 + (n % 60), n % 12, 1 + (n % 28), n % 24, (n * 7) % 60, (n * 13) % 60),
      )
      const base = at.toISOString().slice(0, 19).replace("T", " ")
      const fraction = shapes[n % shapes.length]!
      const offset = offsets[n % offsets.length]!
      const text = `${base}${fraction}${offset}`
      const iso = `${base.replace(" ", "T")}${fraction.slice(0, 4)}${offset.length === 3 ? `${offset}:00` : offset.length === 5 ? `${offset.slice(0, 3)}:${offset.slice(3)}` : offset}`
      expect({ text, ms: parseTimestamp(text).getTime() }).toEqual({ text, ms: new Date(iso).getTime() })
      checked++
    }
    expect(checked).toBe(400)
    // Not the session's form: Date reads what it can, and what it cannot is a ProtocolError.
    expect(parseTimestamp("2026-11-28T21:00:00Z").toISOString()).toBe("2026-11-28T21:00:00.000Z")
    expect(() => parseTimestamp("2026-11-28 21:00:00")).not.toThrow()
    expect(() => parseTimestamp("2026-11-28 2x:00:00+00")).toThrow(ProtocolError)
    expect(() => parseTimestamp("2026-11-28 21:00:00+0")).toThrow(ProtocolError)
  })
})

describe("publishesAtOnce", () => {
  const base = logRow({ occurredAt: new Date(1000) })
  test("a fresh pending row is the log's; a delayed, retried or settled one is the sweep's", () => {
    expect(publishesAtOnce(base)).toBe(true)
    expect(publishesAtOnce({ ...base, visibleAt: new Date(500) })).toBe(true)
    expect(publishesAtOnce({ ...base, visibleAt: new Date(6000) })).toBe(false)
    expect(publishesAtOnce({ ...base, attempts: 1 })).toBe(false)
    expect(publishesAtOnce({ ...base, status: "dead" })).toBe(false)
  })
})
