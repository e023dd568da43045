//go:build idembolt

package idem

// Open opens (or creates, mode 0600) the bbolt journal at path and returns a
// Client that uses it. It fails with an error matching ErrJournalLocked if
// another process or handle holds the journal, and ErrJournalCorrupt if the
// file is not a readable journal.
func Open(path string, opts ...Option) (*Client, error) {
	cfg := newConfig(opts)
	store, err := OpenBoltStore(path, &BoltOptions{
		LockTimeout: cfg.lockTimeout,
		Retention:   cfg.retention,
		Logger:      cfg.logger,
	})
	if err != nil {
		return nil, err
	}
	return newClient(store, cfg), nil
}
