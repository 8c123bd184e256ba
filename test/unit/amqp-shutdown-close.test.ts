// Which connection closes say the broker is stopping (connection.ts's closedForShutdown): the relay
// publishes again what came just before one of those, and only those.
import { describe, expect, test } from "bun:test"
import { closedForShutdown } from "../../src/transport/amqp/connection.ts"

describe("closedForShutdown", () => {
  test("RabbitMQ's close for a stopping node, as amqplib reports it", () => {
    const close = new Error(
      `Connection closed: 320 (CONNECTION-FORCED) with message "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"`,
    )
    expect(closedForShutdown(close)).toBe(true)
    expect(closedForShutdown(close.message)).toBe(true)
  })

  test("other closes: forced by an operator, lost sockets, heartbeats", () => {
    for (const cause of [
      new Error(
        `Connection closed: 320 (CONNECTION-FORCED) with message "CONNECTION_FORCED - txbox soak: injected fault"`,
      ),
      new Error("read ECONNRESET"),
      new Error("Heartbeat timeout"),
      "connection closed",
      undefined,
    ])
      expect(closedForShutdown(cause)).toBe(false)
  })
})
