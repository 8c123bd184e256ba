-- txbox 0002: the inbox. Key (message_id, consumer): one row per message per
-- consuming service, written in the handler's own transaction.

CREATE TABLE inbox (
  message_id    text        NOT NULL,
  consumer      text        NOT NULL,
  type          text,
  version       integer,
  payload       jsonb,
  -- The body as received, kept only when it could not be decoded (dead rows),
  -- so nothing a producer sent is ever lost.
  raw           text,
  headers       jsonb       NOT NULL DEFAULT '{}'::jsonb,
  partition_key text,
  tenant_id     text,
  received_at   timestamptz NOT NULL DEFAULT now(),
  visible_at    timestamptz NOT NULL DEFAULT now(),
  attempts      integer     NOT NULL DEFAULT 0,
  status        text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'processed', 'dead')),
  lock_token    uuid,
  processed_at  timestamptz,
  last_error    text,
  PRIMARY KEY (message_id, consumer)
);

CREATE INDEX inbox_due ON inbox (consumer, visible_at) WHERE status = 'pending';
CREATE INDEX inbox_dead ON inbox (received_at) WHERE status = 'dead';
CREATE INDEX inbox_processed ON inbox (processed_at) WHERE status = 'processed';

-- Wake the store-then-process processor when pending rows arrive. Rows an
-- idempotent consumer writes are already processed (or dead): they send no
-- NOTIFY, which matters because NOTIFY serialises commits on a global lock.
CREATE FUNCTION inbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM new_rows WHERE status = 'pending') THEN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '.inbox', '');
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER inbox_notify AFTER INSERT ON inbox
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION inbox_notify();
