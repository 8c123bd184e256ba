/**
 * Starting a consumer's subscription: at once when the broker is there, so a
 * caller that publishes right after start finds the queue; in the background
 * when it is away, instead of failing the service (health reports not-ready
 * meanwhile). A topology the broker refuses is a configuration error.
 */
import { Effect, type Scope } from "effect"
import { ConfigError, type TransportError } from "../Errors.ts"
import type {
  Delivery,
  DeliveryDecision,
  HandleMany,
  SubscribeOptions,
  TransportShape,
} from "../ports/Transport.ts"
import { type RetryPolicy, schedule } from "../Retry.ts"

export const subscribe = (
  transport: TransportShape,
  options: SubscribeOptions,
  handle: (delivery: Delivery) => Effect.Effect<DeliveryDecision>,
  outage: RetryPolicy,
  /** Runs once the queue is bound, whether at once or in the background. */
  onSubscribed: Effect.Effect<void> = Effect.void,
  handleMany?: HandleMany,
): Effect.Effect<void, ConfigError, Scope.Scope> =>
  Effect.gen(function* () {
    const attempt = Effect.tap(transport.subscribe(options, handle, handleMany), () => onSubscribed)
    const first = yield* Effect.result(attempt)
    if (first._tag === "Success") return
    if (!first.failure.retryable) {
      return yield* new ConfigError({ reason: `inbox ${options.consumer}: ${first.failure.message}` })
    }
    yield* Effect.logWarning(
      `inbox ${options.consumer}: ${first.failure.message}; subscribing in the background`,
    )
    yield* Effect.forkScoped(
      attempt.pipe(
        Effect.retry({ schedule: schedule(outage), while: (e: TransportError) => e.retryable }),
        Effect.catch((e) => Effect.logError(`inbox ${options.consumer}: cannot subscribe: ${e.message}`)),
      ),
    )
  })
