-- txbox 0004: the consumer half of ordered delivery. A stored delivery keeps
-- its key's number; a cursor per (consumer, key) says which number was handled
-- last, and the processor claims only the next one of each key.

ALTER TABLE inbox
  ADD COLUMN partition_epoch bigint,
  ADD COLUMN partition_seq   bigint;

CREATE TABLE inbox_cursors (
  consumer      text        NOT NULL,
  partition_key text        NOT NULL,
  -- The epoch and number of the last message of this key the consumer handled.
  epoch         bigint      NOT NULL,
  last_seq      bigint      NOT NULL,
  updated_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, partition_key)
);

-- Waiting ordered rows per key, for status and for finding what blocks a key.
CREATE INDEX inbox_ordered ON inbox (consumer, partition_key, partition_epoch, partition_seq)
  WHERE partition_seq IS NOT NULL AND status <> 'processed';
