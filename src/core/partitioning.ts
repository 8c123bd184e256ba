/**
 * How txbox keeps the partitioned outbox and inbox (migration 0015) on its own:
 * the relay and the inbox each make sure the next days' partitions of their
 * table exist, once at start and then hourly. Rows of a day whose partition is
 * missing go to the default partition: never lost, only kept by DELETE.
 */

/** How far ahead of now partitions exist: three days, so a relay or inbox down for two loses none. */
export const PARTITIONS_AHEAD_MS = 3 * 24 * 3_600_000
/** Each partition's length: a day (UTC). `txbox partitions create --every` makes others. */
export const PARTITION_EVERY_MS = 24 * 3_600_000
/** How often the relay and the inbox look. */
export const PARTITIONS_CHECK_MS = 3_600_000
