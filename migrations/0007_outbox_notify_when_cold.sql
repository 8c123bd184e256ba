-- txbox 0007: wake relays only when none is warm. At a steady load a relay
-- drains the outbox within milliseconds, so 0006's rule (notify when every
-- due row is this statement's) held for nearly every commit: one NOTIFY per
-- message, each taking the global commit lock and waking every relay for a
-- claim of one row (bench/cost.ts: most of the relay's CPU per message).
-- A relay that published within the last 50 ms is warm: it looks again every
-- few milliseconds for the next 100 ms (core/leaseLoop.ts), so it will find
-- this row without a wake-up. A committed row that is due and unclaimed still
-- means a relay is about to look (0005). The check needs no transition table:
-- two probes of the ends of two partial indexes (outbox_sent, outbox_due).
-- clock_timestamp(), not now(): a long producer transaction must not take an
-- old publish for a recent one.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
  -- A variable, not the expression: a volatile function in the condition
  -- would rule out the index and scan every sent row.
  recent timestamptz := clock_timestamp() - interval '50 milliseconds';
BEGIN
  IF NOT EXISTS (
    SELECT 1 FROM outbox WHERE status = 'sent' AND published_at > recent
  ) AND NOT EXISTS (
    -- Rows this transaction wrote have visible_at >= now(): only older ones count.
    SELECT 1 FROM outbox WHERE status = 'pending' AND visible_at < now()
  ) THEN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '.outbox', '');
  END IF;
  RETURN NULL;
END
$$;

DROP TRIGGER outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
  FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
