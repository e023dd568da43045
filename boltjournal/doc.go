// Package boltjournal is idem's durable journal on one machine: a
// KeyStore (package idemstore's contract) in a bbolt file, with group
// commit, the checks Open makes of the file, scrubbing of freed pages, and
// the salvage of a damaged journal. Its main type is Store, opened with
// Open.
//
// Applications rarely need this package: the root package's Open opens
// a Store and returns a Client over it, and the root keeps
// idem.OpenBoltStore, idem.BoltStore and idem.BoltOptions as aliases of
// Open, Store and Options for callers who set the journal's own options.
// Tools (the idem command) and tests of the file format use it directly.
package boltjournal
