// Package idemstore is the contract between idem's journal and the store
// that keeps its records, for store authors: the record types (Operation,
// State, Lease, Request, Attempt, Outcome, Policy), the KeyStore interface
// and its optional capabilities (LastChanger, Inspector, Clock,
// PolicyStore), the helpers a store written in Go uses (CheckKey,
// AppendHistory, TrimQuery, ValidTraceparent, Lease.BlockedBy) and the
// errors a store returns. It follows the pattern of database/sql/driver:
// a leaf package that imports nothing of idem's client.
//
// Callers of idem do not need it: package github.com/idemgo/idem (the
// root) re-exports every name here as an alias (idem.Operation is
// idemstore.Operation, idem.ErrNotFound is idemstore.ErrNotFound), and
// its Client is what applications use. Package
// github.com/idemgo/idem/storetest checks a KeyStore against this
// contract; github.com/idemgo/idem/boltjournal and
// github.com/idemgo/idem/pgstore implement it.
//
// In this package's documentation, "the journal" is the root package's
// Client, which decides every rule about a record and passes its result
// to the store (see KeyStore).
package idemstore
