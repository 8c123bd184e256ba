-- txbox 0011: the producers' wake-up check reads two index ends, never the table.
--
-- 0007 asked `EXISTS (… status = 'sent' AND published_at > recent)` with
-- `recent` a plpgsql variable: a parameter, so after a few calls plpgsql may
-- run it with a generic plan, which guesses a third of the sent rows match and
-- picks a sequential scan of the outbox to find the first. Whenever no relay
-- had published in the last 50 ms, each producer's INSERT then read every
-- sent row kept for retention: 3 to 5 ms per transaction at 20,000 rows,
-- growing with the table (bench: an idle enqueue on 20,000 sent rows).
-- `max(published_at)` and `min(visible_at)` over the partial indexes have no
-- parameter and only one plan: the last entry of `outbox_sent`, the first of
-- `outbox_due`. Same decision as 0007: notify unless a relay published within
-- 50 ms or a committed row is already due and unclaimed.

CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
  last_sent timestamptz;
  first_due timestamptz;
BEGIN
  SELECT max(published_at) INTO last_sent FROM outbox WHERE status = 'sent';
  IF last_sent > clock_timestamp() - interval '50 milliseconds' THEN
    RETURN NULL;
  END IF;
  -- Rows this transaction wrote have visible_at >= now(): only older ones count.
  SELECT min(visible_at) INTO first_due FROM outbox WHERE status = 'pending';
  IF first_due < now() THEN
    RETURN NULL;
  END IF;
  PERFORM pg_notify(TG_TABLE_SCHEMA || '.outbox', '');
  RETURN NULL;
END
$$;
