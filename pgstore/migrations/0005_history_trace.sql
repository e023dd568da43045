-- Each operation keeps the W3C traceparent it was journaled under
-- (idem.Operation.Trace; '' in rows written before) and its recorded
-- attempts (idem.Operation.History): a JSON array, oldest first, of
-- {"at": Unix nanoseconds, "sent", "status", "err", "reason"}, which the
-- attempt mark appends to and trims to idem.MaxHistory in the same
-- statement. NULL in rows written before, and in rows of operations that
-- never retried: read as no history. Older replicas neither read nor
-- write these columns; their marks leave the history as it is.
ALTER TABLE operations
	ADD COLUMN trace   text NOT NULL DEFAULT '',
	ADD COLUMN history jsonb;
