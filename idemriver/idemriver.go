// Package idemriver binds a handler's side effects to its idempotency key
// through River (github.com/riverqueue/river), the PostgreSQL job queue: an
// idempotent handler enqueues each effect that leaves the system (a receipt
// e-mail, a call to the warehouse) as a River job in the request's
// transaction, and the job's worker makes its external call through an idem
// Client under a key derived from the request's key and the step's name.
//
//	// In a handler behind idemserver's middleware on a pgstore.ServerStore:
//	if _, err := pgstore.Tx(ctx).Exec(ctx, `INSERT INTO orders ...`); err != nil { ... }
//	if _, err := idemriver.Enqueue(ctx, riverClient, "receipt", ReceiptArgs{Order: id}, nil); err != nil { ... }
//
//	// The worker:
//	river.AddWorker(workers, idemriver.Work(func(ctx context.Context, job *river.Job[ReceiptArgs]) error {
//		req, _ := http.NewRequestWithContext(ctx, "POST", mailURL, receiptBody(job.Args))
//		resp, err := idemClient.HTTPClient().Do(req) // carries the job's key
//		...
//	}))
//
// What it guarantees:
//
//   - The job exists if and only if the stored answer does. Enqueue inserts
//     the job with River's InsertTx in pgstore.Tx's transaction, which the
//     middleware commits with the answer, conditional on still holding the
//     key. A handler that fails, a lost key or a crash before the commit
//     takes both back, and the client's retry runs the handler again on a
//     clean slate; after the commit a retry is replayed and enqueues
//     nothing.
//   - Every attempt of the job sends the same key. The key is
//     idemserver.StepKey's for the step (a UUID of the request's scope, key,
//     payload fingerprint and step name), written in the job's metadata at
//     enqueue time; Work puts it in the worker's context with idem.WithKey.
//     A worker killed mid-call is retried by River (its rescuer, once the
//     job has run longer than Config.RescueStuckJobsAfter and its
//     JobTimeout; River never rescues a job whose timeout is -1, none) on
//     any process, which sends the call again under that key, whatever
//     idem journal it has; a provider that honours keys performs it once.
//   - Waiting is bounded: River retries a failed job with its retry policy
//     (by default a backoff that grows with the attempt's fourth power, up
//     to MaxAttempts, 25 by default), and the idem Client retries each
//     call's transient failures with exponential backoff and jitter within
//     the job's attempt.
//
// What it does not: a provider that ignores keys can still perform a call
// twice (idem check tells); a job discarded after its last attempt, its
// call in doubt, is the application's to reconcile (River's discarded
// jobs, idem's pending operations). The worker's request body must be the
// same on every attempt (derive it from the job's args only): an idem
// Client refuses to send one key with another payload.
//
// The package is a module of its own, so that idem and pgstore do not
// depend on River. River's tables are migrated by River's rivermigrate
// (or its CLI), in the schema River's Config names.
package idemriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/pgstore"
)

// MetadataKey is the member of a job's metadata (a JSON object) that holds
// the idempotency key its external call is sent with.
const MetadataKey = "idem_key"

// MetadataStep is the member of a job's metadata that holds the step name
// its key was derived for, for people reading the job.
const MetadataStep = "idem_step"

// Errors of this package, returned wrapped; match with errors.Is.
var (
	// ErrNoRequest is returned by Enqueue outside a request that holds a
	// key of a pgstore.ServerStore through idemserver's middleware (no
	// request transaction, no key to derive from).
	ErrNoRequest = errors.New("idemriver: no idempotent request in the context")
	// ErrNoKey is returned when a job carries no idempotency key in its
	// metadata: it was not inserted by Enqueue or EnqueueTx. Work cancels
	// such a job rather than send its call without a key.
	ErrNoKey = errors.New("idemriver: the job carries no idempotency key")
)

// Enqueue inserts args as a River job, with c.InsertTx, in the transaction
// of the request ctx belongs to (pgstore.Tx), under the key
// idemserver.StepKey derives for step. Give each effect of a handler its
// own step name ("receipt", "notify-warehouse"). opts are River's; their
// Metadata, if any, must be a JSON object, and gains MetadataKey and
// MetadataStep. c may be an insert-only client (no Workers).
//
// Outside a request holding a ServerStore key it returns an error matching
// ErrNoRequest and inserts nothing. An insert that fails leaves the
// request's transaction aborted: answer 5xx (the middleware rolls it back
// and releases the key, so the client's retry runs the handler again).
func Enqueue(ctx context.Context, c *river.Client[pgx.Tx], step string, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	tx := pgstore.Tx(ctx)
	key, ok := idemserver.StepKey(ctx, step)
	if tx == nil || !ok {
		return nil, fmt.Errorf("idemriver: enqueue %s: %w", step, ErrNoRequest)
	}
	return insert(ctx, c, tx, key, step, args, opts)
}

// EnqueueTx inserts args as a River job in tx under key, for code that
// holds a transaction and a key of its own: an event consumer that
// recorded its event with pgstore's ServerStore.Once in tx and keys its
// effect by the event (a random key it stored, or one derived from the
// event id and the step). The job exists if and only if tx commits.
func EnqueueTx(ctx context.Context, c *river.Client[pgx.Tx], tx pgx.Tx, key, step string, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	if key == "" {
		return nil, fmt.Errorf("idemriver: enqueue %s: %w", step, ErrNoKey)
	}
	return insert(ctx, c, tx, key, step, args, opts)
}

func insert(ctx context.Context, c *river.Client[pgx.Tx], tx pgx.Tx, key, step string, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	var o river.InsertOpts
	if opts != nil {
		o = *opts
	}
	meta := map[string]any{}
	if len(o.Metadata) > 0 {
		if err := json.Unmarshal(o.Metadata, &meta); err != nil {
			return nil, fmt.Errorf("idemriver: enqueue %s: metadata is not a JSON object: %w", step, err)
		}
	}
	meta[MetadataKey], meta[MetadataStep] = key, step
	b, err := json.Marshal(meta)
	if err != nil {
		return nil, fmt.Errorf("idemriver: enqueue %s: metadata: %w", step, err)
	}
	o.Metadata = b
	res, err := c.InsertTx(ctx, tx, args, &o)
	if err != nil {
		return nil, fmt.Errorf("idemriver: enqueue %s: %w", step, err)
	}
	return res, nil
}

// Key returns the idempotency key job was enqueued with, or an error
// matching ErrNoKey.
func Key(job *rivertype.JobRow) (string, error) {
	var meta struct {
		Key string `json:"idem_key"`
	}
	if job == nil || len(job.Metadata) == 0 || json.Unmarshal(job.Metadata, &meta) != nil || meta.Key == "" {
		id := int64(0)
		if job != nil {
			id = job.ID
		}
		return "", fmt.Errorf("idemriver: job %d: %w", id, ErrNoKey)
	}
	return meta.Key, nil
}

// Context returns ctx carrying job's key for idem clients (idem.WithKey):
// the request an idem Client sends under it carries that key, on every
// attempt of the job.
func Context(ctx context.Context, job *rivertype.JobRow) (context.Context, error) {
	key, err := Key(job)
	if err != nil {
		return ctx, err
	}
	return idem.WithKey(ctx, key), nil
}

// Work returns a River worker that runs fn with a context carrying the
// job's key (see Context), so that fn's call through an idem Client is
// sent under it. A job without a key is cancelled (river.JobCancel), never
// sent without one. fn's error is River's to retry, as from any worker.
func Work[T river.JobArgs](fn func(ctx context.Context, job *river.Job[T]) error) river.Worker[T] {
	return river.WorkFunc(func(ctx context.Context, job *river.Job[T]) error {
		kctx, err := Context(ctx, job.JobRow)
		if err != nil {
			return river.JobCancel(err)
		}
		return fn(kctx, job)
	})
}
