/**
 * A claim's lease kept alive while its batch is worked on. A batch can take
 * longer than the lease for good reasons (a backlog behind the publish window,
 * slow handlers); without this, another claimer would take the rows and
 * publish or handle them a second time. Extensions stop after `maxHoldMs`, so
 * rows held by a worker that hangs still come back to the others.
 */
import { Effect, Fiber } from "effect"
import type { StoreError } from "../Errors.ts"
import { onLiveClock } from "./liveClock.ts"

/** How long past its first lease a claim may be kept alive, in leases. */
export const MAX_HOLD_LEASES = 10

export const holdingLease = <A, E, R>(
  extend: Effect.Effect<number, StoreError>,
  leaseMs: number,
  work: Effect.Effect<A, E, R>,
): Effect.Effect<A, E, R> => {
  const every = Math.max(1, Math.floor(leaseMs / 3))
  const beats = Math.ceil((MAX_HOLD_LEASES * leaseMs) / every)
  // A failed extension is no reason to stop: the next one may work, and the lease covers the gap.
  const beat = Effect.ignore(extend)
  return Effect.withFiber((parent) => {
    if (onLiveClock(parent)) return onTimer(parent, beat, every, beats, work)
    const heartbeat = Effect.repeat(Effect.delay(beat, every), { times: beats - 1 })
    // A fiber interrupted when the work ends, without a scope or a generator (core/inboxConsumer.ts
    // says why). Interruptible even inside the loop's uninterruptible cycle, so it can be stopped.
    return Effect.flatMap(Effect.forkChild(Effect.interruptible(heartbeat)), (beating) =>
      Effect.onExit(work, () => Fiber.interrupt(beating)),
    )
  })
}

/**
 * The same on a timer: no fiber until a beat is due, which a batch that ends within a third of its
 * lease never sees (the fiber version forked one and interrupted it for every batch).
 */
const onTimer = <A, E, R>(
  parent: Fiber.Fiber<unknown, unknown>,
  beat: Effect.Effect<void>,
  every: number,
  beats: number,
  work: Effect.Effect<A, E, R>,
): Effect.Effect<A, E, R> => {
  let left = beats
  let stopped = false
  let extending: Fiber.Fiber<void> | undefined
  let timer: ReturnType<typeof setTimeout> | undefined
  const next = () => {
    timer = setTimeout(() => {
      timer = undefined
      extending = Effect.runForkWith(parent.context as never)(beat)
      extending.addObserver(() => {
        extending = undefined
        if (--left > 0 && !stopped) next()
      })
    }, every)
  }
  next()
  return Effect.onExit(work, () =>
    Effect.suspend(() => {
      stopped = true
      if (timer !== undefined) clearTimeout(timer)
      return extending === undefined ? Effect.void : Fiber.interrupt(extending)
    }),
  )
}
