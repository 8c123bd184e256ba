// The soak's events: shared by producer and consumer as a plain module, as a service would.
import * as v from "valibot"
import { defineEvent } from "../../src/index.ts"

// n < 0 marks an order written by a transaction that rolls back on purpose: the orchestrator
// proves from the tables alone that none of those (order, event or effect) ever shows up.
const order = v.object({ orderId: v.pipe(v.string(), v.uuid()), n: v.pipe(v.number(), v.integer()) })

export const OrderPlaced = defineEvent({ type: "soak.order-placed", version: 1, schema: order })

/**
 * A second type on the same partition keys, interleaved with OrderPlaced in each key's sequence:
 * a consumer bound to one of the two types sees gaps in the key's numbers and must not wait on them.
 */
export const OrderPaid = defineEvent({ type: "soak.order-paid", version: 1, schema: order })

export const CONTRACTS = { [OrderPlaced.type]: OrderPlaced, [OrderPaid.type]: OrderPaid } as const
export type SoakType = keyof typeof CONTRACTS
export const SOAK_TYPES = Object.keys(CONTRACTS) as SoakType[]
