-- txbox 0003: per-key sequence numbers, the first half of ordered delivery.
-- Enqueue with a partitionKey takes the key's next number from its counter row
-- in the producer's own transaction. The row lock makes a second transaction
-- for the same key wait until the first commits (or rolls back, taking its
-- numbers with it), so a key's numbers follow commit order with no gap.

CREATE TABLE partition_counters (
  partition_key text        PRIMARY KEY,
  -- Milliseconds since 1970 when this counter row was created. A counter
  -- removed after its key went idle and created again starts a newer epoch at
  -- 1, which a consumer tells apart from a missing predecessor.
  epoch         bigint      NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
  seq           bigint      NOT NULL,
  updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX partition_counters_idle ON partition_counters (updated_at);

ALTER TABLE outbox
  ADD COLUMN partition_epoch bigint,
  ADD COLUMN partition_seq   bigint;
