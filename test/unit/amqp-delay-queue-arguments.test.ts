import { describe, expect, test } from "bun:test"
import { delayQueueArguments, queueName } from "../../src/transport/amqp/topology.ts"

describe("delay queue arguments", () => {
  test("quorum, dead-lettered at least once back to the consumer queue, expiring when unused", () => {
    expect(delayQueueArguments("billing", { retryQueueExpiryMs: 60_000 })).toEqual({
      "x-queue-type": "quorum",
      "x-dead-letter-exchange": "",
      "x-dead-letter-routing-key": queueName("billing"),
      "x-dead-letter-strategy": "at-least-once",
      "x-overflow": "reject-publish",
      "x-expires": 60_000,
      // Leaders spread over a cluster's nodes.
      "x-queue-leader-locator": "balanced",
    })
  })
})
