package idemserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// serve claims id and answers from the store or runs the route's handler.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, h *handler, id, key, fp string) {
	log := m.cfg.logger
	if resp, match, ok := m.cache.get(id, fp, m.now()); ok {
		if !match {
			m.mismatch(w)
			return
		}
		m.replay(w, r, resp)
		return
	}
	claim, claimed, err := m.begin(r.Context(), id, fp)
	if err == nil && claim.State == StateInFlight && m.cfg.wait > 0 {
		claim, claimed, err = m.await(r.Context(), id, fp, claim, claimed)
	}
	if err != nil {
		log.Error("idemserver: store unavailable; request refused", "id", id, "err", err)
		writeProblem(w, http.StatusServiceUnavailable, ProblemUnavailable, "Service unavailable",
			"The idempotency store cannot be written; the request was not handled.", m.cfg.retryAfter)
		return
	}
	switch claim.State {
	case StateDone:
		m.replay(w, r, claim.Response)
		return
	case StateInFlight:
		writeProblem(w, http.StatusConflict, ProblemInProgress, "Request in progress",
			"A request with the same "+m.cfg.header+" is being processed; retry later.", m.cfg.retryAfter)
		return
	case StateMismatch:
		m.mismatch(w)
		return
	case StateAcquired:
	default:
		log.Error("idemserver: store returned an unknown state", "state", claim.State)
		writeProblem(w, http.StatusServiceUnavailable, ProblemUnavailable, "Service unavailable",
			"The idempotency store answered in a way the middleware does not know; the request was not handled.", m.cfg.retryAfter)
		return
	}
	local, _ := m.store.(LocalStore)
	u := &run{m: m, id: id, fp: fp, token: claim.Token, webhook: h.rt.webhook != nil, claimed: claimed, local: local}
	u.do(w, r, h.h, keyInfo{id: id, key: key, fp: fp})
	m.maybeSweep()
}

// mismatch answers 422 for a key used with another payload.
func (m *Middleware) mismatch(w http.ResponseWriter) {
	writeProblem(w, http.StatusUnprocessableEntity, ProblemKeyMismatch, m.cfg.header+" is already used",
		"This key was used with a different payload; a key must not be reused across payloads.", 0)
}

// begin claims id in the store (held, if it is a LocalStore), bounded by
// the store timeout, and returns the local time taken before the claim
// was sent: the lease's base, for fencing.
func (m *Middleware) begin(ctx context.Context, id, fp string) (Claim, time.Time, error) {
	claimed := time.Now()
	now := m.now()
	ctx, cancel := context.WithTimeout(ctx, m.cfg.timeout)
	defer cancel()
	b := Begin{ID: id, Fingerprint: fp, Now: now, LeaseUntil: now.Add(m.cfg.lease)}
	if local, ok := m.store.(LocalStore); ok {
		c, err := local.BeginHeld(ctx, b)
		return c, claimed, err
	}
	c, err := m.store.Begin(ctx, b)
	return c, claimed, err
}

// await claims id again at growing intervals while another request holds
// it, for at most WithWait's duration and ctx's life; it returns the last
// claim, in flight still if the wait ran out.
func (m *Middleware) await(ctx context.Context, id, fp string, c Claim, claimed time.Time) (Claim, time.Time, error) {
	const first = 10 * time.Millisecond
	limit := min(max(m.cfg.wait/4, first), time.Second)
	deadline := time.NewTimer(m.cfg.wait)
	defer deadline.Stop()
	for delay := first; c.State == StateInFlight; delay = min(2*delay, limit) {
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return c, claimed, nil
		case <-deadline.C:
			t.Stop()
			return c, claimed, nil
		case <-t.C:
		}
		var err error
		if c, claimed, err = m.begin(ctx, id, fp); err != nil {
			return c, claimed, err
		}
	}
	return c, claimed, nil
}

// replay answers r with the stored resp, after the WithOnReplay functions,
// and marks r's context for IsReplay.
func (m *Middleware) replay(w http.ResponseWriter, r *http.Request, resp *Response) {
	if mark, ok := r.Context().Value(replayContext{}).(*replayMark); ok {
		mark.replayed.Store(true)
	}
	if len(m.cfg.onReplay) > 0 {
		ctx := TrackReplay(r.Context())
		ctx.Value(replayContext{}).(*replayMark).replayed.Store(true)
		r = r.WithContext(ctx)
		for _, fn := range m.cfg.onReplay {
			fn(w, r, resp)
		}
	}
	writeReplay(w, resp)
}

// run is one request that holds a key: it owns the lease, the renewer, the
// request's transaction and the recorder until the key is completed or
// released.
type run struct {
	m         *Middleware
	id, token string
	fp        string // the payload's fingerprint, for the answer cache
	webhook   bool
	claimed   time.Time  // local time before the claim was sent
	local     LocalStore // the store, if it holds the key while the run lives
	tx        RequestTx  // nil unless the store is a TxStore
	done      bool       // the key was completed, released or given up
	rec       recorder   // the handler's writer: in the run, one allocation for both
	ren       renewer
}

func (u *run) do(w http.ResponseWriter, r *http.Request, next http.Handler, ki keyInfo) {
	m := u.m
	if u.local != nil {
		// Last, however the run ends: a key neither completed nor
		// released is freed by its lease from now on.
		defer u.local.Unhold(u.id, u.token)
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	ctx = context.WithValue(ctx, keyContext{}, ki)
	if ts, ok := m.store.(TxStore); ok {
		ctx, u.tx = ts.Scope(ctx, u.id, u.token)
	}
	stopRenew := u.renew(ctx, cancel)
	rec := &u.rec
	rec.w, rec.max, rec.replay = w, m.cfg.maxResponse, m.cfg.replay
	defer func() {
		if u.done {
			return
		}
		// The handler panicked: keep what the client may have seen.
		stopRenew()
		if rec.through {
			u.complete(r, &Response{Status: rec.status, NotKept: true}, "handler panicked after its answer began")
		} else {
			u.rollback()
			u.release("handler panicked")
		}
	}()
	next.ServeHTTP(rec, r.WithContext(ctx))
	stopRenew()

	rec.WriteHeader(http.StatusOK) // a handler that wrote no status answers 200, as under net/http
	if cause := context.Cause(ctx); errors.Is(cause, ErrLockLost) {
		u.done = true
		u.rollback()
		m.cfg.logger.Error("idemserver: lease lost while the handler ran; its answer is withheld", "id", u.id, "err", cause)
		u.fail(rec, "The lock on this request's key was lost while it was handled; its answer is withheld.")
		return
	}
	resp, why := u.outcome(rec)
	if resp == nil {
		u.rollback()
		u.release(why)
		rec.passThrough()
		return
	}
	if err := u.complete(r, resp, why); err != nil {
		if errors.Is(err, ErrTxAborted) {
			u.abortedTx(rec, resp.Status)
			return
		}
		u.fail(rec, "The request was handled, but its answer could not be stored; it is withheld.")
		return
	}
	rec.passThrough()
}

// outcome returns what to store for the handler's answer, with why when it
// is a "not kept" record, or nil and why the key is released instead.
func (u *run) outcome(rec *recorder) (*Response, string) {
	status := rec.status
	switch {
	case rec.hijacked:
		return &Response{Status: status, NotKept: true}, "connection hijacked"
	case status == http.StatusSwitchingProtocols:
		return &Response{Status: status, NotKept: true}, "switched protocols"
	case status >= 500:
		return nil, "server error"
	case status == http.StatusRequestTimeout || status == http.StatusTooEarly || status == http.StatusTooManyRequests:
		return nil, "retryable status"
	case status >= 300 && u.webhook && !u.m.cfg.hookClient:
		return nil, "webhook answer other than 2xx"
	case status >= 400 && !u.webhook && !u.m.cfg.storeClient:
		return nil, "client error"
	case rec.overflow:
		return &Response{Status: status, NotKept: true}, "response too large to store"
	case rec.failed:
		return &Response{Status: status, NotKept: true}, "stream failed after its first flush"
	}
	return &Response{Status: status, Header: rec.stored(), Body: rec.body.Bytes()}, ""
}

// storeContext returns a context for a store call made on behalf of r that
// must not end with the client's request, bounded by the store timeout.
func (u *run) storeContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.Context()), u.m.cfg.timeout)
}

// complete stores resp (in the request's transaction, if the store has
// one). On an error it releases the key when nothing was committed for
// sure and the key is still held; otherwise the key stays locked until
// its lease lapses.
func (u *run) complete(r *http.Request, resp *Response, why string) error {
	m := u.m
	u.done = true
	now := m.now()
	c := Completion{ID: u.id, Token: u.token, Response: resp, Now: now, Until: now.Add(m.cfg.retention)}
	ctx, cancel := u.storeContext(r)
	defer cancel()
	var err error
	if u.tx != nil {
		err = u.tx.Commit(ctx, c)
	} else {
		err = m.store.Complete(ctx, c)
	}
	if err != nil {
		if errors.Is(err, ErrTxAborted) {
			m.cfg.logger.Error("idemserver: the handler answered success, but a statement of its transaction failed; nothing committed, answer withheld",
				"id", u.id, "status", resp.Status, "err", err)
		} else {
			m.cfg.logger.Error("idemserver: response not stored", "id", u.id, "err", err)
		}
		if errors.Is(err, ErrRolledBack) {
			u.release("request transaction rolled back")
		}
		return err
	}
	if resp.NotKept {
		m.cfg.logger.Warn("idemserver: request done, its response not kept", "id", u.id, "status", resp.Status, "reason", why)
	}
	m.cache.put(u.id, u.fp, resp, c.Until)
	return nil
}

// fail answers 503 for a handler whose answer cannot be vouched for, or
// aborts the connection if the answer already began.
func (u *run) fail(rec *recorder, detail string) {
	if rec.through {
		panic(http.ErrAbortHandler) // the client must not take a cut stream for a whole answer
	}
	clear(rec.w.Header())
	writeProblem(rec.w, http.StatusServiceUnavailable, ProblemNotStored, "Response not stored", detail, u.m.cfg.retryAfter)
}

// abortedTx answers 500 ProblemTxAborted for a handler that answered
// status over a transaction a failed statement had aborted, or aborts the
// connection if the answer already began.
func (u *run) abortedTx(rec *recorder, status int) {
	if rec.through {
		panic(http.ErrAbortHandler)
	}
	clear(rec.w.Header())
	writeProblem(rec.w, http.StatusInternalServerError, ProblemTxAborted, "Request transaction aborted",
		"The handler answered "+strconv.Itoa(status)+", but a statement in its transaction had failed, so nothing of it was committed; the answer is withheld.", 0)
}

// rollback discards the request's transaction, if there is one.
func (u *run) rollback() {
	if u.tx == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), u.m.cfg.timeout)
	defer cancel()
	if err := u.tx.Rollback(ctx); err != nil {
		u.m.cfg.logger.Warn("idemserver: request transaction not rolled back; the database ends it with the connection", "id", u.id, "err", err)
	}
}

// release frees the key so a retry runs the handler again.
func (u *run) release(why string) {
	u.done = true
	ctx, cancel := context.WithTimeout(context.Background(), u.m.cfg.timeout)
	defer cancel()
	if err := u.m.store.Release(ctx, u.id, u.token); err != nil {
		u.m.cfg.logger.Warn("idemserver: key not released; it frees itself when its lease ends", "id", u.id, "reason", why, "err", err)
		return
	}
	u.m.cfg.logger.Debug("idemserver: key released", "id", u.id, "reason", why)
}

// fenceMargin is the share of the lease kept between the handler's
// cancellation and the lease's end: a handler whose renewals fail is
// cancelled lease-lease/fenceMargin after its last successful renewal.
const fenceMargin = 4

// renew renews the lease every third of it until the returned func is
// called; that func waits for the renewer to stop. A lost lock, or
// renewals that failed for longer than the lease minus a margin, cancel
// the handler's context with a cause matching ErrLockLost. A LocalStore
// holds the key while the run lives, so no fence is armed for it: the
// renewals only keep the lease current for after the run.
func (u *run) renew(ctx context.Context, cancel context.CancelCauseFunc) (stop func()) {
	m := u.m
	lease := m.cfg.lease
	hold := lease - lease/fenceMargin
	r := &u.ren
	r.u, r.ctx, r.cancel, r.lease, r.hold = u, ctx, cancel, lease, hold
	r.mu.Lock()
	if u.local == nil {
		r.fence = time.AfterFunc(hold-time.Since(u.claimed), r.lapse)
	}
	r.t = time.AfterFunc(lease/3, r.tick)
	r.mu.Unlock()
	return r.stop
}

// renewer renews one run's lease on a timer, without a goroutine of its
// own while no renewal is due.
type renewer struct {
	u           *run
	ctx         context.Context
	cancel      context.CancelCauseFunc
	lease, hold time.Duration
	fence, t    *time.Timer
	mu          sync.Mutex
	stopped     bool
	running     sync.WaitGroup
}

func (r *renewer) lapse() {
	r.cancel(fmt.Errorf("idemserver: no lease renewal for %v of a %v lease: %w", r.hold, r.lease, ErrLockLost))
}

func (r *renewer) tick() {
	r.mu.Lock()
	if r.stopped || r.ctx.Err() != nil {
		r.mu.Unlock()
		return
	}
	r.running.Add(1)
	fence := r.fence
	r.mu.Unlock()
	defer r.running.Done()
	m := r.u.m
	sent := time.Now()
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(r.ctx), min(m.cfg.timeout, r.lease/3))
	now := m.now()
	err := m.store.Renew(rctx, r.u.id, r.u.token, now, now.Add(r.lease))
	rcancel()
	switch {
	case err == nil:
		// Under mu, as stop stops the fence: a renewal that returns
		// after the request ended must not re-arm it, which would keep
		// the run alive for most of a lease.
		r.mu.Lock()
		if fence != nil && !r.stopped && r.ctx.Err() == nil {
			fence.Reset(r.hold - time.Since(sent))
		}
		r.mu.Unlock()
	case errors.Is(err, ErrLockLost):
		m.cfg.logger.Error("idemserver: lease lost while the handler runs", "id", r.u.id, "err", err)
		r.cancel(err)
		return
	default:
		m.cfg.logger.Warn("idemserver: lease not renewed", "id", r.u.id, "err", err)
	}
	r.mu.Lock()
	if !r.stopped {
		r.t.Reset(r.lease / 3)
	}
	r.mu.Unlock()
}

func (r *renewer) stop() {
	r.mu.Lock()
	if !r.stopped {
		r.stopped = true
		if r.fence != nil {
			r.fence.Stop()
		}
		r.t.Stop()
	}
	r.mu.Unlock()
	r.running.Wait()
}

// Sweep deletes the records that expired, as the middleware does by
// itself every sweep interval, and returns how many it deleted.
func (m *Middleware) Sweep(ctx context.Context) (int, error) {
	now := m.now()
	m.lastSweep.Store(now.UnixNano())
	m.cache.sweep(now)
	return m.store.Sweep(ctx, now)
}

// maybeSweep starts a sweep in the background when the interval has
// passed, no sweep runs and the middleware is not closed.
func (m *Middleware) maybeSweep() {
	if m.cfg.sweepEvery < 0 || m.now().UnixNano()-m.lastSweep.Load() < int64(m.cfg.sweepEvery) {
		return
	}
	if !m.sweeping.CompareAndSwap(false, true) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		m.sweeping.Store(false)
		return
	}
	m.sweeps.Add(1)
	go func() {
		defer m.sweeps.Done()
		defer m.sweeping.Store(false)
		ctx, cancel := context.WithTimeout(m.stop, max(m.cfg.timeout, m.cfg.sweepEvery))
		defer cancel()
		if n, err := m.Sweep(ctx); err != nil {
			m.cfg.logger.Warn("idemserver: sweep failed", "err", err)
		} else if n > 0 {
			m.cfg.logger.Debug("idemserver: swept expired keys", "count", n)
		}
	}()
}

// writeReplay sends a stored response, or for a record whose response was
// not kept, a ProblemNotKept document.
func writeReplay(w http.ResponseWriter, resp *Response) {
	if resp.NotKept {
		detail := "A request with this key was handled and answered, but its answer could not be kept; it is not run again."
		if resp.Status != 0 {
			detail = "A request with this key was handled and answered with status " + strconv.Itoa(resp.Status) +
				", but its answer could not be kept; it is not run again."
		}
		w.Header().Set(ReplayedHeader, "true")
		writeDoc(w, problemDoc{Type: ProblemNotKept, Title: "Request already handled; its answer was not kept",
			Status: http.StatusConflict, Detail: detail, OriginalStatus: resp.Status}, 0)
		return
	}
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	h.Set(ReplayedHeader, "true")
	w.WriteHeader(resp.Status)
	w.Write(resp.Body)
}
