/** `txbox/memory`: the in-process broker, for tests and the demo. */

export type {
  MemoryBroker,
  MemoryFaults,
  MemoryStats,
  MemoryTransportOptions,
} from "./transport/memory/MemoryTransport.ts"
export * as MemoryTransport from "./transport/memory/MemoryTransport.ts"
