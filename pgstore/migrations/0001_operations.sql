-- The journal of operations: one row per key. Times are Unix nanoseconds
-- (0: not set), as the bbolt journal keeps them, so a record reads back
-- exactly as it was written. Text columns use the "C" collation so that key
-- order is byte order, the order Go compares strings in.
CREATE TABLE operations (
	key          text COLLATE "C" PRIMARY KEY,
	name         text COLLATE "C" UNIQUE, -- NULL when unnamed: a name is one key fleet-wide
	version      smallint NOT NULL,       -- record format; a newer one reads as ErrRecordVersion
	method       text NOT NULL,
	url          text NOT NULL,
	host         text NOT NULL,
	fingerprint  bytea NOT NULL,
	state        smallint NOT NULL,
	attempts     bigint NOT NULL,
	last_status  integer NOT NULL,
	last_error   text NOT NULL,
	created      bigint NOT NULL,
	updated      bigint NOT NULL,
	owner        text NOT NULL,
	lease_until  bigint NOT NULL,
	redacted     boolean NOT NULL,
	unreplayable boolean NOT NULL,
	header       bytea,                   -- JSON of the replayable header while pending
	body         bytea                    -- the replayable body while pending
);

-- Pending and Claim walk the pending rows in key order.
CREATE INDEX operations_pending ON operations (key) WHERE state = 1;

-- Sweep finds finished rows by age.
CREATE INDEX operations_finished ON operations (updated) WHERE state <> 1;
