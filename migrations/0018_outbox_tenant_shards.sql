-- txbox 0018: an index for relays that take a share of the tenants
-- (`RelayConfig.shard: { tenants }`, issue #28).
--
-- Such a relay claims `tenant_id = ANY(its tenants)` in due order. On
-- `outbox_due` alone it would walk every other tenant's pending rows first:
-- with one tenant's backlog of 50,000, every claim of another tenant's relay.
-- Here it reads its own tenants' entries only. Partial on a tenant: a row
-- enqueued without one (most rows, for most users) costs nothing more.
CREATE INDEX outbox_tenant_due ON outbox (tenant_id, visible_at)
  WHERE status = 'pending' AND tenant_id IS NOT NULL;
