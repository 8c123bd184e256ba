/**
 * What a replication stream's frames come to for a relay: whole committed transactions' outbox
 * rows, in commit order, handed out in batches; and the position the slot may be told is done.
 * Pure state, no I/O: `drivers/pg/walLog.ts` feeds it the frames of its connection and writes
 * the status updates it asks for.
 *
 * The position confirmed is the end of the last transaction whose batch was confirmed; while
 * nothing is read and not confirmed (no transaction open, none waiting, none handed out), it is
 * the server's WAL end instead, so an outbox with nothing to send holds no WAL, however busy the
 * rest of the database is.
 */
import type { OutboxLogBatch, OutboxLogRow } from "../../ports/OutboxLog.ts"
import { type ColumnIndex, columnIndex, isOutboxRelation, outboxRowOf } from "./outboxRows.ts"
import { decodeFrame, decodeOutput } from "./pgoutput.ts"

interface Committed {
  readonly rows: ReadonlyArray<OutboxLogRow>
  readonly endLsn: bigint
}

export class LogReader {
  /** Relation id → the outbox's columns, or null for a relation that is not the outbox. */
  private relations = new Map<number, ColumnIndex | null>()
  private open: OutboxLogRow[] | undefined
  private waiting: Committed[] = []
  private waitingRows = 0
  /** The end of the last transaction handed out in a batch. */
  private handedOut = 0n
  /** The end of the last transaction whose batch is settled. */
  private confirmed = 0n
  /** The server's WAL end, as its last frame said. */
  private walEnd = 0n

  /** The outbox's name, schema-qualified (`txbox.outbox`). */
  private readonly table: string

  constructor(table: string) {
    this.table = table
  }

  /**
   * One CopyData payload. Returns what the connection must do: `"reply"` when the server asked for
   * a status update, `"rows"` when a transaction with outbox rows committed, undefined otherwise.
   */
  feed(bytes: Uint8Array): "reply" | "rows" | undefined {
    const frame = decodeFrame(bytes)
    if (frame._tag === "Keepalive") {
      if (frame.walEnd > this.walEnd) this.walEnd = frame.walEnd
      return frame.reply ? "reply" : undefined
    }
    if (frame._tag !== "XLogData") return undefined
    if (frame.walEnd > this.walEnd) this.walEnd = frame.walEnd
    const message = decodeOutput(frame.message)
    switch (message._tag) {
      case "Begin":
        this.open = []
        return undefined
      case "Relation": {
        const index = columnIndex(message.columns)
        const outbox = `${message.schema}.${message.table}` === this.table && isOutboxRelation(index)
        this.relations.set(message.id, outbox ? index : null)
        return undefined
      }
      case "Insert": {
        const index = this.relations.get(message.relation)
        if (index != null && this.open !== undefined) this.open.push(outboxRowOf(index, message.values))
        return undefined
      }
      case "Commit": {
        const rows = this.open ?? []
        this.open = undefined
        if (rows.length === 0) return undefined
        this.waiting.push({ rows, endLsn: message.endLsn })
        this.waitingRows += rows.length
        return "rows"
      }
      default:
        return undefined
    }
  }

  /** Whether a batch can be taken now. */
  get ready(): boolean {
    return this.waiting.length > 0
  }

  /** Whole transactions' rows, up to `maxRows` (at least one transaction); undefined when none waits. */
  take(maxRows: number): OutboxLogBatch | undefined {
    if (this.waiting.length === 0) return undefined
    const rows: OutboxLogRow[] = []
    let position = 0n
    while (
      this.waiting.length > 0 &&
      (rows.length === 0 || rows.length + this.waiting[0]!.rows.length <= maxRows)
    ) {
      const next = this.waiting.shift()!
      for (const row of next.rows) rows.push(row)
      position = next.endLsn
    }
    this.waitingRows -= rows.length
    this.handedOut = position
    return { rows, position }
  }

  /**
   * The server asked for a reply and waits on it: everything it sent counts as done. PostgreSQL
   * asks when it shuts down (its WAL senders wait until their clients confirmed all they were
   * sent, and a relay that cannot settle while the database goes down would hold the shutdown for
   * as long as its retries last), or when it heard nothing for half its `wal_sender_timeout`. What
   * was read and not settled is still pending in the outbox: the relay's sweep publishes it.
   */
  confirmAll(): void {
    if (this.walEnd > this.confirmed) this.confirmed = this.walEnd
  }

  /** A batch up to `position` is settled. */
  confirm(position: bigint): void {
    if (position > this.confirmed) this.confirmed = position
  }

  /** The position to tell the server: see the module. */
  get flushPosition(): bigint {
    const idle = this.open === undefined && this.waiting.length === 0 && this.handedOut <= this.confirmed
    return idle && this.walEnd > this.confirmed ? this.walEnd : this.confirmed
  }

  /** Rows read and not yet taken. */
  get backlog(): number {
    return this.waitingRows
  }

  /**
   * A new connection: the server sends again from the slot's confirmed position, so what was read
   * and not taken is dropped (it comes again), and so are the relations (they are sent again).
   * A batch handed out before stays handed out until confirmed.
   */
  restart(): void {
    this.relations = new Map()
    this.open = undefined
    this.waiting = []
    this.waitingRows = 0
  }
}
