-- Each operation records the header its key travels in (idem.Operation.
-- KeyHeader; '' in rows written before, which Resume sends in the Client's
-- own header), and the journal keeps the application's policy
-- (idem.Policy): one row, durations in nanoseconds.
ALTER TABLE operations ADD COLUMN key_header text NOT NULL DEFAULT '';

CREATE TABLE policy (
	id            boolean PRIMARY KEY DEFAULT true CHECK (id), -- one row at most
	key_header    text NOT NULL,
	resend_window bigint NOT NULL,
	retention     bigint NOT NULL,
	match_window  bigint NOT NULL
);
