// The transport's broker setting: one `url` or a cluster's `urls`, checked before anything connects.
import { describe, expect, test } from "bun:test"
import { Effect, Exit } from "effect"
import { type AmqpTransportConfig, resolveConfig } from "../../src/transport/amqp/config.ts"
import { consumerQueueArguments, deadQueueName } from "../../src/transport/amqp/topology.ts"

const resolved = (config: AmqpTransportConfig) => Effect.runPromise(resolveConfig(config))

const refusal = async (config: unknown): Promise<string> => {
  const exit = await Effect.runPromiseExit(resolveConfig(config as AmqpTransportConfig))
  if (Exit.isSuccess(exit)) throw new Error("expected a ConfigError")
  const error = exit.cause.reasons.find((r) => r._tag === "Fail") as unknown as {
    error: { _tag: string; message: string }
  }
  expect(error.error._tag).toBe("ConfigError")
  return error.error.message
}

describe("url or urls", () => {
  test("url is a list of one; urls keeps its order", async () => {
    expect((await resolved({ url: "amqp://mq" })).urls).toEqual(["amqp://mq"])
    const urls = ["amqp://mq1:5672", "amqps://mq2:5671", "amqp://mq3"]
    expect((await resolved({ urls })).urls).toEqual(urls)
  })

  test.each([
    [{}, "amqp url (or urls, for a cluster) is required"],
    [{ url: "amqp://a", urls: ["amqp://b"] }, "amqp url and urls are exclusive"],
    [{ urls: [] }, "amqp urls must be a non-empty array of broker URLs"],
    [{ urls: "amqp://a,amqp://b" }, "amqp urls must be a non-empty array of broker URLs"],
    [{ urls: ["amqp://a", "not a url:pw@"] }, "amqp urls[1] is not a valid URL"],
    [{ urls: ["amqp://a", 42] }, "amqp urls[1] is not a valid URL"],
    [{ urls: ["amqp://a", "http://u:secret@b"] }, "amqp urls[1] must use amqp: or amqps:, got http:"],
    [{ url: "http://u:secret@b" }, "amqp url must use amqp: or amqps:, got http:"],
  ])("%j is a ConfigError naming the option", async (config, reason) => {
    const message = await refusal(config)
    expect(message).toContain(reason)
    expect(message).not.toContain("secret")
  })
})

describe("queue arguments", () => {
  test("quorum consumer queues ask for balanced leaders; classic ones carry no locator", async () => {
    const quorum = consumerQueueArguments("billing", await resolved({ url: "amqp://mq" }))
    expect(quorum).toEqual({
      "x-queue-type": "quorum",
      "x-delivery-limit": 20,
      "x-dead-letter-exchange": "",
      "x-dead-letter-routing-key": deadQueueName("billing"),
      "x-dead-letter-strategy": "at-least-once",
      "x-overflow": "reject-publish",
      "x-queue-leader-locator": "balanced",
    })
    const classic = consumerQueueArguments(
      "billing",
      await resolved({ url: "amqp://mq", queueType: "classic" }),
    )
    expect(classic).not.toHaveProperty("x-queue-leader-locator")
  })
})
