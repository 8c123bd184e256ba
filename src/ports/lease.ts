/**
 * What the relay and the inbox processor share: rows are claimed under a
 * lease (a token plus a deadline), worked on, then settled with a verdict.
 * The stores record verdicts; `core/verdict.ts` decides them.
 */

/** Rows taken under one lease. Marks and releases name the token, so a claim that ran out can never settle rows another claim now holds. */
export interface Claim<Row> {
  /** The lease token: the rows are this claim's while it holds them. */
  readonly token: string
  /** The rows taken; empty when nothing was due. */
  readonly rows: ReadonlyArray<Row>
}

/**
 * What became of one claimed item.
 * - `Done`: published (outbox) or handled (inbox).
 * - `Retry`: due again after `delayMs`. `spendsAttempt` is false when the
 *   infrastructure failed, not the message (broker or database away): an
 *   outage never brings a message closer to dead.
 * - `Dead`: given up on; kept with its error for `txbox dead list|redrive`.
 */
export type Verdict =
  | { readonly _tag: "Done" }
  | {
      readonly _tag: "Retry"
      readonly delayMs: number
      readonly error: string
      readonly spendsAttempt: boolean
    }
  | { readonly _tag: "Dead"; readonly error: string }
