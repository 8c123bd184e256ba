// An outbox row as the WAL relay's log gives it (`OutboxLogRow`): pending, never tried, due when
// enqueued; `overrides` for anything else.
import type { OutboxLogRow } from "../../src/ports/OutboxLog.ts"

export const logRow = (overrides: Partial<OutboxLogRow> = {}): OutboxLogRow => {
  const at = overrides.occurredAt ?? new Date()
  return {
    id: "a",
    type: "test.event",
    version: 1,
    payload: "{}",
    headers: {},
    routingKey: null,
    partitionKey: null,
    tenantId: null,
    occurredAt: at,
    visibleAt: at,
    attempts: 0,
    status: "pending",
    ...overrides,
  }
}
