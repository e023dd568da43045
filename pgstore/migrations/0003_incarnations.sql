-- Who holds a lease is an owner name and the incarnation of the store that
-- took it (a random id per Store), so that a restarted process with the
-- same owner name, or a second one while the first still runs, takes only
-- leases that lapsed. reserve_id numbers a store's reservations, so that a
-- reservation whose answer was lost finds its own row when it tries again.
-- Rows written before this migration, or by older replicas, have '' and 0:
-- held by no incarnation, their leases count until they lapse.
ALTER TABLE operations
	ADD COLUMN incarnation text COLLATE "C" NOT NULL DEFAULT '',
	ADD COLUMN reserve_id  bigint NOT NULL DEFAULT 0;
