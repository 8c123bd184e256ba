-- txbox 0005: wake relays only when they may be idle. NOTIFY serialises every
-- notifying commit on one global lock (bench/enqueue.ts: the trigger cost the
-- producer ~40 % of its rate); while a committed row is due and unclaimed a
-- relay is busy or about to look anyway, so the insert skips it. Claimed rows
-- are not due (their lease moved visible_at), so a relay working on its last
-- batch is still woken. The relay looks once more shortly after a partial
-- batch, for a row whose producer skipped the NOTIFY just before the relay
-- went idle; polling stays on behind both.
-- SET search_path FROM CURRENT: the body names `outbox`, which must be this
-- schema's whatever the inserting session's search_path is.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
  IF NOT EXISTS (
    SELECT 1 FROM outbox o
    WHERE o.status = 'pending' AND o.visible_at <= clock_timestamp()
      AND NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.id = o.id)
  ) THEN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '.outbox', '');
  END IF;
  RETURN NULL;
END
$$;

DROP TRIGGER outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
