// The one event of the soak: shared by producer and consumer as a plain module, as a service would.
import * as v from "valibot"
import { defineEvent } from "../../src/index.ts"

export const OrderPlaced = defineEvent({
  type: "soak.order-placed",
  version: 1,
  // n < 0 marks an order written by a transaction that rolls back on purpose: the orchestrator
  // proves from the tables alone that none of those (order, event or effect) ever shows up.
  schema: v.object({ orderId: v.pipe(v.string(), v.uuid()), n: v.pipe(v.number(), v.integer()) }),
})
