/**
 * `txbox/testing`: txbox without servers, for your own unit tests and the demo.
 *
 * - `MemoryTransport`: an in-process broker behind the `Transport` port, with RabbitMQ's
 *   contract where txbox relies on it and faults on demand (duplicates, lost acks, failed
 *   publishes, shuffled order).
 * - `MemoryOutboxStore` and `MemoryInboxStore`: the store ports in memory, every "now" read from
 *   Effect's `Clock`, so `TestClock.adjust` expires leases and brings retries due. Their handles
 *   (`make()`) seed and inspect rows and take the store "down".
 * - `layerMemory(handles)`: all three as one layer for `Relay.run` and `Inbox.run`.
 *
 * The memory inbox gives handlers no SQL transaction (`trx` throws a clear error when used): test a
 * handler that writes through `trx` on PGlite (`txbox/pglite`), which runs the same SQL in process.
 *
 * @module
 */
import { Layer } from "effect"
import type { InboxStore } from "./ports/InboxStore.ts"
import type { OutboxStore } from "./ports/OutboxStore.ts"
import type { Transport } from "./ports/Transport.ts"
import * as MemoryInboxStore from "./storage/memory/MemoryInboxStore.ts"
import * as MemoryOutboxStore from "./storage/memory/MemoryOutboxStore.ts"
import * as MemoryTransport from "./transport/memory/MemoryTransport.ts"

export type { MemoryInbox, MemoryInboxRow } from "./storage/memory/MemoryInboxStore.ts"
/** The `InboxStore` port in memory: `make()` for a handle (the store plus test controls), `layer(handle)` to provide it. */
export * as MemoryInboxStore from "./storage/memory/MemoryInboxStore.ts"
export type { MemoryOutbox, MemoryOutboxInsert, MemoryOutboxRow } from "./storage/memory/MemoryOutboxStore.ts"
/** The `OutboxStore` port in memory: `make()` for a handle (the store plus test controls), `layer(handle)` to provide it. */
export * as MemoryOutboxStore from "./storage/memory/MemoryOutboxStore.ts"
export type {
  MemoryBroker,
  MemoryFaults,
  MemoryStats,
  MemoryTransportOptions,
} from "./transport/memory/MemoryTransport.ts"
/** An in-process broker behind the `Transport` port: `makeBroker(options)` for a handle, `layerFrom(broker)` to provide it. */
export * as MemoryTransport from "./transport/memory/MemoryTransport.ts"

/** The handles `layerMemory` provides; each one left out is made fresh. */
export interface MemoryHandles {
  /** From `MemoryOutboxStore.make()`: seed messages with its `enqueue`, read them with `rows`. */
  readonly outbox?: MemoryOutboxStore.MemoryOutbox
  /** From `MemoryInboxStore.make()`: read what consumers stored and applied with `rows`. */
  readonly inbox?: MemoryInboxStore.MemoryInbox
  /** From `MemoryTransport.makeBroker(options)`: switch faults on and off, read `stats`. */
  readonly broker?: MemoryTransport.MemoryBroker
}

/**
 * The memory outbox store, inbox store and broker as one layer: what `Relay.run` and `Inbox.run`
 * need. Pass the handles a test seeds or inspects; the others are made fresh.
 */
export const layerMemory = (handles: MemoryHandles = {}): Layer.Layer<OutboxStore | InboxStore | Transport> =>
  Layer.mergeAll(
    MemoryOutboxStore.layer(handles.outbox),
    MemoryInboxStore.layer(handles.inbox),
    handles.broker === undefined ? MemoryTransport.layer() : MemoryTransport.layerFrom(handles.broker),
  )
