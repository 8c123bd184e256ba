-- txbox 0006: the NOTIFY trigger of 0005 looks at no more than 8 rows. 0005
-- asked whether ANY due, unclaimed row is not one of this statement's: when
-- every such row is new (a bulk INSERT into an idle outbox) that compares each
-- new row with all the others, and with a nested-loop plan (seen after the
-- table's statistics said it was large) an INSERT of 200,000 rows ran for
-- minutes. Now only the 8 rows due first are checked (the outbox_due index,
-- in due order): if all of them are this statement's, it notifies. Notifying
-- when a relay is already coming costs a wake-up; skipping stays as narrow as
-- before: only when a committed row is due and unclaimed.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
  IF NOT EXISTS (
    SELECT 1
    FROM (
      SELECT o.id FROM outbox o
      WHERE o.status = 'pending' AND o.visible_at <= clock_timestamp()
      ORDER BY o.visible_at
      LIMIT 8
    ) first_due
    WHERE NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.id = first_due.id)
  ) THEN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '.outbox', '');
  END IF;
  RETURN NULL;
END
$$;
