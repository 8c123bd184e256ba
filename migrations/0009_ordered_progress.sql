-- txbox 0009: per-key order that never stops a key for good (issue #22).
--
-- Routes. A key's counter remembers, per routing key, its last message
-- (number and enqueue time) — and, written by the same UPDATE, what it held
-- before, which the enqueue reads back under the row lock: each message
-- carries, per route, the last message before it, so a consumer waits only
-- for predecessors on the routes it is bound to ("not for me" is told apart
-- from "not here yet").
ALTER TABLE partition_counters
  ADD COLUMN routes        jsonb NOT NULL DEFAULT '{}',
  ADD COLUMN routes_before jsonb NOT NULL DEFAULT '{}';

-- What an ordered inbox row waits for: the number of its key's last message
-- before it that this consumer receives (0: none). NULL for rows stored before
-- this migration or from producers that do not say: the number before it.
ALTER TABLE inbox ADD COLUMN partition_after bigint;

-- An ordered delivery that duplicates a row already stored (its handler's
-- dedupeKey is taken: the same business event sent twice) keeps its place in
-- its key's sequence. It is stored under a key of its own with the dedupe key
-- it repeats in stands_in_for; when its turn comes the processor marks it
-- processed without running the handler, and the key moves on.
ALTER TABLE inbox ADD COLUMN stands_in_for text;

-- When each consumer's queue was first bound to each routing pattern, on this
-- database's clock. A predecessor enqueued before the binding existed never
-- reached the queue: a consumer deployed late does not wait for it.
CREATE TABLE inbox_bindings (
  consumer  text        NOT NULL,
  pattern   text        NOT NULL,
  bound_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, pattern)
);

-- What each consumer does with a dead ordered message (its onOrderedDead),
-- as its inbox last said at start: `txbox status` reads it, so a key whose
-- dead head a "skip" consumer passes is not reported as blocked.
CREATE TABLE inbox_consumers (
  consumer        text        PRIMARY KEY,
  on_ordered_dead text        NOT NULL CHECK (on_ordered_dead IN ('block', 'skip')),
  updated_at      timestamptz NOT NULL DEFAULT now()
);
