-- The keys of idemserver.Store (ServerStore): one row per scoped inbound
-- key, in flight under a lease (status NULL, token set) or done with the
-- stored response (status set, token ''). Times are Unix nanoseconds, as in
-- operations, so that they read back exactly as the caller passed them.
CREATE TABLE inbound_keys (
	id          text COLLATE "C" PRIMARY KEY, -- the middleware's scoped id
	fingerprint text COLLATE "C" NOT NULL,
	token       text COLLATE "C" NOT NULL,    -- the holder's; '' once done
	expires     bigint NOT NULL,              -- lease end, or retention end once done
	status      integer,                      -- NULL while in flight
	header      bytea,                        -- JSON of the replayed headers once done
	body        bytea                         -- the stored body once done
);

-- Sweep finds expired rows by their expiry.
CREATE INDEX inbound_keys_expires ON inbound_keys (expires);
