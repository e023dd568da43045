-- The records of event consumers (ServerStore.Once and ServerStore.Advance),
-- written in the consumer's own transaction. Versions 30 to 39 belong to
-- this line of work. Times are Unix nanoseconds, as elsewhere.
--
-- event_ids: one row per (scope, event id) a consumer has taken, kept
-- until expires (the scope's retention after the delivery).
CREATE TABLE event_ids (
	scope   text COLLATE "C" NOT NULL,
	id      text COLLATE "C" NOT NULL,
	expires bigint NOT NULL,
	PRIMARY KEY (scope, id)
);
CREATE INDEX event_ids_expires ON event_ids (expires);

-- entity_versions: the newest version applied per (scope, entity), kept
-- until expires (the scope's retention after the last advance).
CREATE TABLE entity_versions (
	scope   text COLLATE "C" NOT NULL,
	entity  text COLLATE "C" NOT NULL,
	version bigint NOT NULL,
	expires bigint NOT NULL,
	PRIMARY KEY (scope, entity)
);
CREATE INDEX entity_versions_expires ON entity_versions (expires);
