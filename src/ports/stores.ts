/** What a store adapter provides: the connection and both storage ports over it. */
import type { Database } from "./Database.ts"
import type { InboxStore } from "./InboxStore.ts"
import type { OutboxStore } from "./OutboxStore.ts"

/** The services a store layer (`PgStore.layer`, `PgliteStore.layer`, …) provides: the connection and both storage ports. */
export type TxboxStore = Database | OutboxStore | InboxStore
