/**
 * A message's place in its partition key's sequence, as it travels: two
 * headers set together, read back by every transport and by the inbox.
 */
import type { PartitionPosition } from "../ports/Transport.ts"

export const PARTITION_EPOCH_HEADER = "txbox-partition-epoch"
export const PARTITION_SEQ_HEADER = "txbox-partition-seq"
/**
 * On a tombstone: the relay gave up on this keyed message (the header says
 * why), and publishes this body-less stand-in in its place so that consumers
 * waiting for its number go on (docs/ordering.md).
 */
export const DEAD_UPSTREAM_HEADER = "txbox-dead-upstream"
/** The last message before this one on each route of its key (`keyRoutes.ts`), as JSON. */
export const PARTITION_ROUTES_HEADER = "txbox-partition-routes"

const wholeNumber = (value: unknown): number | undefined => {
  const n =
    typeof value === "number"
      ? value
      : typeof value === "string" && /^\d+$/.test(value.trim())
        ? Number(value)
        : Number.NaN
  return Number.isSafeInteger(n) ? n : undefined
}

/** Both numbers, whole (epoch ≥ 0, seq ≥ 1), or no position at all: half of one orders nothing. */
export const positionOf = (epochValue: unknown, seqValue: unknown): PartitionPosition | undefined => {
  const epoch = wholeNumber(epochValue)
  const seq = wholeNumber(seqValue)
  if (epoch === undefined || seq === undefined || epoch < 0 || seq < 1) return undefined
  return { epoch, seq }
}

/** The position carried in a message's headers (as strings, the way the inbox keeps them). */
export const positionFromHeaders = (
  headers: Readonly<Record<string, string>>,
): PartitionPosition | undefined => positionOf(headers[PARTITION_EPOCH_HEADER], headers[PARTITION_SEQ_HEADER])
