package idem

import "github.com/idemgo/idem/boltjournal"

// BoltStore is boltjournal.Store: the durable KeyStore, a bbolt file journal.
type BoltStore = boltjournal.Store

// BoltOptions is boltjournal.Options: the options of a BoltStore.
type BoltOptions = boltjournal.Options

// OpenBoltStore is boltjournal.Open: it opens (or creates) the bbolt journal at path.
func OpenBoltStore(path string, o *BoltOptions) (*BoltStore, error) { return boltjournal.Open(path, o) }
