/**
 * A claim's lease kept alive while its batch is worked on. A batch can take
 * longer than the lease for good reasons (a backlog behind the publish window,
 * slow handlers); without this, another claimer would take the rows and
 * publish or handle them a second time. Extensions stop after `maxHoldMs`, so
 * rows held by a worker that hangs still come back to the others.
 */
import { Effect, Fiber } from "effect"
import type { StoreError } from "../Errors.ts"

/** How long past its first lease a claim may be kept alive, in leases. */
export const MAX_HOLD_LEASES = 10

export const holdingLease = <A, E, R>(
  extend: Effect.Effect<number, StoreError>,
  leaseMs: number,
  work: Effect.Effect<A, E, R>,
): Effect.Effect<A, E, R> => {
  const every = Math.max(1, Math.floor(leaseMs / 3))
  const beats = Math.ceil((MAX_HOLD_LEASES * leaseMs) / every)
  const heartbeat = Effect.repeat(
    Effect.delay(
      // A failed extension is no reason to stop: the next one may work, and the lease covers the gap.
      Effect.ignore(extend),
      every,
    ),
    { times: beats - 1 },
  )
  // A fiber interrupted when the work ends, without a scope or a generator: once per batch, and
  // JavaScriptCore kept recompiling the generator body this had (core/inboxConsumer.ts says more).
  // Interruptible even inside the loop's uninterruptible cycle, so it can be stopped.
  return Effect.flatMap(Effect.forkChild(Effect.interruptible(heartbeat)), (beating) =>
    Effect.onExit(work, () => Fiber.interrupt(beating)),
  )
}
