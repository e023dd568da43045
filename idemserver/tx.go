package idemserver

import "context"

// A TxStore is a Store that can put a handler's own writes and the
// request's stored answer in one database transaction, so that they
// commit or vanish together: a crash, a panic, a 5xx or a lost key takes
// both back, and a retry runs the handler on a clean slate. The
// middleware asserts it on its Store, as database/sql asserts optional
// driver interfaces; a Store without it completes keys with
// Store.Complete, in a transaction of its own.
//
// The claim (Begin) stays a commit of its own, so that other replicas see
// the key in flight while the handler runs.
type TxStore interface {
	Store
	// Scope returns the context the handler of the request holding id
	// under token runs with, and the RequestTx that ends it. The store
	// puts in the context what its own accessor needs (pgstore.Tx) to
	// begin the transaction on the handler's first call; a handler that
	// never asks holds none. Scope itself does no I/O.
	Scope(ctx context.Context, id, token string) (context.Context, RequestTx)
}

// RequestTx ends the transaction of one request; see TxStore. The
// middleware calls Commit or Rollback once, after the handler returned
// and after the lease's renewals stopped.
type RequestTx interface {
	// Commit stores c in the request's transaction, conditional on still
	// holding the key (token and live lease, checked in the same
	// statement), and commits. If the handler began no transaction it
	// does what Store.Complete does. It returns an error matching
	// ErrLockLost if the key was lost (nothing committed), ErrRolledBack
	// if the database refused the commit or the transaction had failed
	// (nothing committed), and another error when the outcome is unknown
	// (the connection broke during the commit).
	Commit(ctx context.Context, c Completion) error
	// Rollback discards the transaction if the handler began one; else it
	// does nothing. It is safe to call after Commit.
	Rollback(ctx context.Context) error
}
