/**
 * The replication protocol's messages as a WAL relay reads them: the stream's frames (XLogData,
 * keepalive), the `pgoutput` plugin's messages inside them (protocol version 1: begin, commit,
 * relation, insert; the rest skipped), and the standby status update the client answers with.
 * Pure: bytes in, values out. The connection that carries them is `drivers/pg/walLog.ts`.
 *
 * LSNs are `bigint`s; `lsnText` writes PostgreSQL's `X/Y` form.
 */

/** One frame of a `START_REPLICATION` stream. */
export type StreamFrame =
  /** XLogData: a `pgoutput` message, and the server's WAL end when it was sent. */
  | {
      readonly _tag: "XLogData"
      readonly start: bigint
      readonly walEnd: bigint
      readonly message: Uint8Array
    }
  /** Primary keepalive: the server's WAL end; `reply`: answer now or be cut off. */
  | { readonly _tag: "Keepalive"; readonly walEnd: bigint; readonly reply: boolean }
  | { readonly _tag: "Unknown"; readonly kind: number }

/** A `pgoutput` message, as far as a relay needs it. */
export type OutputMessage =
  | { readonly _tag: "Begin"; readonly finalLsn: bigint; readonly xid: number }
  /** `endLsn`: the position after the commit record, what a client confirms once it is done with the transaction. */
  | { readonly _tag: "Commit"; readonly commitLsn: bigint; readonly endLsn: bigint }
  | {
      readonly _tag: "Relation"
      readonly id: number
      readonly schema: string
      readonly table: string
      readonly columns: ReadonlyArray<string>
    }
  /** A new row: its columns' text forms by position (null: SQL NULL or an unchanged TOAST value). */
  | { readonly _tag: "Insert"; readonly relation: number; readonly values: ReadonlyArray<string | null> }
  | { readonly _tag: "Other"; readonly kind: string }

/** A decoding failure: the stream is not what the protocol says (a bug, or a plugin other than pgoutput). */
export class ProtocolError extends Error {
  override readonly name = "ProtocolError"
}

const decoder = new TextDecoder()

/** A cursor over one message's bytes. */
class Reader {
  private at = 0
  private readonly bytes: Uint8Array
  private readonly view: DataView
  constructor(bytes: Uint8Array) {
    this.bytes = bytes
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  }
  private need(n: number): void {
    if (this.at + n > this.bytes.byteLength) {
      throw new ProtocolError(
        `pgoutput: message ends at ${this.bytes.byteLength} bytes, ${this.at + n} needed`,
      )
    }
  }
  u8(): number {
    this.need(1)
    return this.view.getUint8(this.at++)
  }
  i16(): number {
    this.need(2)
    const v = this.view.getInt16(this.at)
    this.at += 2
    return v
  }
  i32(): number {
    this.need(4)
    const v = this.view.getInt32(this.at)
    this.at += 4
    return v
  }
  u64(): bigint {
    this.need(8)
    const v = this.view.getBigUint64(this.at)
    this.at += 8
    return v
  }
  /** A NUL-terminated string. */
  cstring(): string {
    const end = this.bytes.indexOf(0, this.at)
    if (end < 0) throw new ProtocolError("pgoutput: string without its NUL")
    const text = decoder.decode(this.bytes.subarray(this.at, end))
    this.at = end + 1
    return text
  }
  text(n: number): string {
    this.need(n)
    const text = decoder.decode(this.bytes.subarray(this.at, this.at + n))
    this.at += n
    return text
  }
  rest(): Uint8Array {
    return this.bytes.subarray(this.at)
  }
}

/** One CopyData payload of a replication stream. */
export const decodeFrame = (bytes: Uint8Array): StreamFrame => {
  const r = new Reader(bytes)
  const kind = r.u8()
  if (kind === 0x77 /* w */) {
    const start = r.u64()
    const walEnd = r.u64()
    r.u64() // the server's clock
    return { _tag: "XLogData", start, walEnd, message: r.rest() }
  }
  if (kind === 0x6b /* k */) {
    const walEnd = r.u64()
    r.u64()
    return { _tag: "Keepalive", walEnd, reply: r.u8() === 1 }
  }
  return { _tag: "Unknown", kind }
}

/** Tuple data: a column count, then per column its kind and, for text, its bytes. */
const tuple = (r: Reader): Array<string | null> => {
  const count = r.i16()
  const values: Array<string | null> = new Array(count)
  for (let i = 0; i < count; i++) {
    const kind = r.u8()
    if (kind === 0x74 /* t */) values[i] = r.text(r.i32())
    else if (kind === 0x6e /* n */ || kind === 0x75 /* u */) values[i] = null
    else throw new ProtocolError(`pgoutput: column kind ${kind} (binary mode is not asked for)`)
  }
  return values
}

/** One `pgoutput` message (protocol version 1). */
export const decodeOutput = (bytes: Uint8Array): OutputMessage => {
  const r = new Reader(bytes)
  const kind = String.fromCharCode(r.u8())
  switch (kind) {
    case "B": {
      const finalLsn = r.u64()
      r.u64() // commit time
      return { _tag: "Begin", finalLsn, xid: r.i32() }
    }
    case "C": {
      r.u8() // flags
      const commitLsn = r.u64()
      return { _tag: "Commit", commitLsn, endLsn: r.u64() }
    }
    case "R": {
      const id = r.i32()
      const schema = r.cstring()
      const table = r.cstring()
      r.u8() // replica identity
      const count = r.i16()
      const columns: string[] = []
      for (let i = 0; i < count; i++) {
        r.u8() // flags (part of the key)
        columns.push(r.cstring())
        r.i32() // type oid
        r.i32() // type modifier
      }
      return { _tag: "Relation", id, schema, table, columns }
    }
    case "I": {
      const relation = r.i32()
      const marker = r.u8()
      if (marker !== 0x4e /* N */)
        throw new ProtocolError(`pgoutput: insert without its new tuple (${marker})`)
      return { _tag: "Insert", relation, values: tuple(r) }
    }
    default:
      return { _tag: "Other", kind }
  }
}

/** Microseconds from 1970 to 2000-01-01, PostgreSQL's epoch. */
const PG_EPOCH_US = 946_684_800_000_000n

/**
 * A standby status update: written, flushed and applied all up to `lsn` (a relay has no use for
 * three positions: what the broker confirmed is done).
 */
export const statusUpdate = (lsn: bigint, nowMs: number, replyRequested = false): Uint8Array => {
  const bytes = new Uint8Array(34)
  const view = new DataView(bytes.buffer)
  bytes[0] = 0x72 // r
  view.setBigUint64(1, lsn)
  view.setBigUint64(9, lsn)
  view.setBigUint64(17, lsn)
  view.setBigInt64(25, BigInt(Math.floor(nowMs)) * 1000n - PG_EPOCH_US)
  bytes[33] = replyRequested ? 1 : 0
  return bytes
}

/** `X/Y`, PostgreSQL's text form of an LSN. */
export const lsnText = (lsn: bigint): string =>
  `${(lsn >> 32n).toString(16).toUpperCase()}/${(lsn & 0xffff_ffffn).toString(16).toUpperCase()}`

/** An LSN from its `X/Y` text form. */
export const parseLsn = (text: string): bigint => {
  const match = /^([0-9A-Fa-f]{1,8})\/([0-9A-Fa-f]{1,8})$/.exec(text)
  if (match === null) throw new ProtocolError(`not an LSN: ${text}`)
  return (BigInt(`0x${match[1]}`) << 32n) | BigInt(`0x${match[2]}`)
}
