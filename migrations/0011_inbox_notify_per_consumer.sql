-- txbox 0011: a pending inbox row wakes its own consumer's processors only.
-- 0008 notified one channel per schema, so a row stored for one consumer woke
-- every consumer's processor in every process, each to claim nothing. The
-- channel is now per (schema, consumer): 'txbox_inbox_' and 24 hex digits of
-- an md5 of both, within the 63 bytes a channel name may have whatever the
-- consumer's name. Processors started before this migration listen on the old
-- channel and fall back to their poll until they are restarted.
CREATE OR REPLACE FUNCTION inbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('txbox_inbox_' || left(md5(TG_TABLE_SCHEMA || '.' || NEW.consumer), 24), '');
  RETURN NULL;
END
$$;
