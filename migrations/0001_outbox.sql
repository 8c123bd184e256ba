-- txbox 0001: the outbox.
-- Applied with search_path set to the txbox schema (default "txbox"), so the
-- file names no schema. To apply by hand: SET search_path TO txbox; \i 0001_outbox.sql

CREATE TABLE outbox (
  id            uuid        PRIMARY KEY,
  type          text        NOT NULL,
  version       integer     NOT NULL,
  payload       jsonb       NOT NULL,
  headers       jsonb       NOT NULL DEFAULT '{}'::jsonb,
  routing_key   text,
  partition_key text,
  tenant_id     text,
  occurred_at   timestamptz NOT NULL DEFAULT now(),
  -- Due time. A claim pushes it forward by the lease, so a relay that dies
  -- mid-batch hands its rows back when the lease runs out.
  visible_at    timestamptz NOT NULL DEFAULT now(),
  attempts      integer     NOT NULL DEFAULT 0,
  status        text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'dead')),
  -- The claim that holds the row; a mark only applies while it still matches,
  -- so a relay whose lease expired can never mark a row twice.
  lock_token    uuid,
  published_at  timestamptz,
  last_error    text
);

-- The claim's only index: due pending rows in due order. Partial, so sent
-- rows (the vast majority over time) cost it nothing.
CREATE INDEX outbox_due ON outbox (visible_at) WHERE status = 'pending';
CREATE INDEX outbox_dead ON outbox (occurred_at) WHERE status = 'dead';
CREATE INDEX outbox_sent ON outbox (published_at) WHERE status = 'sent';

-- Wake relays on commit: a statement-level trigger, so a batch INSERT sends one
-- NOTIFY and enqueue stays a single statement. NOTIFY is delivered at commit
-- and dropped on rollback, which is exactly when a relay should wake.
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify(TG_TABLE_SCHEMA || '.outbox', '');
  RETURN NULL;
END
$$;

CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
  FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
