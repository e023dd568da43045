package idemtest

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// unclear is the why of a scenario whose identical answers prove nothing.
const unclear = "two different operations got identical answers too, so an identical answer proves nothing: " +
	"put " + UUIDPlaceholder + " in the body, or test an endpoint whose answer names what it created"

// replay sends one operation twice, and a control operation once. It
// returns the two answers of the operation and whether the control's
// answer differs from the first (answers tell operations apart).
func (c *checker) replay(ctx context.Context) (res CheckResult, first, second answer, apart bool) {
	res = CheckResult{Scenario: ScenarioReplay}
	o := c.newOp(c.cfg.Body)
	c.first = o
	first = c.send(ctx, o, false)
	res.Requests = 1
	res.Sent = fmt.Sprintf("%s, then again with the same key", c.method)
	if !first.ok() {
		res.Got = first.String()
		res.Verdict, res.Why = Unknown, firstNotOK(first)
		return res, first, second, false
	}
	second, n := c.sendSettled(ctx, o, 3)
	res.Requests += n
	res.Got = first.String() + ", then " + second.String()
	switch {
	case second.err != nil:
		res.Verdict, res.Why = Unknown, "no answer to the second request: "+shortErr(second.err)
		return res, first, second, false
	case second.performed:
		res.Verdict = Pass
		res.Why = fmt.Sprintf("the second answer (%d) says the first was performed under the key and is not replayed, as the profile reads it", second.status)
		return res, first, second, true
	case second.status != first.status:
		res.Verdict = Fail
		res.Why = fmt.Sprintf("the second answer's status %d differs from the first's %d", second.status, first.status)
		if second.ok() {
			res.Why += ": performed again"
		}
		return res, first, second, true
	case !first.same(second):
		res.Verdict = Fail
		res.Why = "performed again: " + diff(first.body, second.body)
		return res, first, second, true
	}
	control := c.send(ctx, c.newOp(c.cfg.Body), false)
	res.Requests++
	res.Sent += ", and a control with another key"
	res.Got += "; control " + control.String()
	if control.same(first) {
		res.Verdict, res.Why = Unknown, unclear
		return res, first, second, false
	}
	res.Verdict = Pass
	res.Why = fmt.Sprintf("the second answer repeats the first's status and body (%d B); the control's differs", len(first.body))
	return res, first, second, true
}

// firstNotOK says why a scenario cannot judge after a first answer that
// is not a 2xx.
func firstNotOK(a answer) string {
	if a.err != nil {
		return "no answer to the first request: " + shortErr(a.err)
	}
	return fmt.Sprintf("the first request itself got %d %s (no 2xx), so there is nothing to replay: check -d and -H; body %s",
		a.status, http.StatusText(a.status), excerpt(a.body))
}

// otherPayload sends another payload under the key of the replay
// scenario's operation, which must be refused.
func (c *checker) otherPayload(ctx context.Context, first answer) CheckResult {
	res := CheckResult{Scenario: ScenarioOtherPayload, Sent: c.method + " with the first operation's key and another body"}
	if !first.ok() {
		res.Verdict, res.Why = Unknown, "no first operation to reuse the key of (see replay)"
		return res
	}
	tmpl := c.cfg.OtherBody
	switch {
	case tmpl == "" && strings.Contains(c.cfg.Body, UUIDPlaceholder):
		tmpl = c.cfg.Body // fresh UUIDs make it another payload
	case tmpl == "":
		res.Verdict, res.Why = Unknown, "no other payload: give --other-body (OtherBody), or put "+UUIDPlaceholder+" in the body"
		return res
	}
	o := c.newOp(tmpl)
	if o.body == c.first.body {
		res.Verdict, res.Why = Unknown, "the other body is the same as the first"
		return res
	}
	o.key = c.first.key
	a := c.send(ctx, o, false)
	res.Requests = 1
	res.Got = a.String()
	switch {
	case a.err != nil:
		res.Verdict, res.Why = Unknown, "no answer: "+shortErr(a.err)
	case a.ok() && a.same(first):
		res.Verdict = Fail
		res.Why = fmt.Sprintf("another payload under a used key got %d with the first operation's answer: the new payload was ignored without a word, and the caller believes it was applied", a.status)
	case a.ok():
		res.Verdict = Fail
		res.Why = fmt.Sprintf("another payload under a used key got %d with a new answer: performed under a used key", a.status)
	case a.status >= 500:
		res.Verdict, res.Why = Unknown, fmt.Sprintf("%d is no clear refusal: %s", a.status, excerpt(a.body))
	default:
		res.Verdict = Pass
		res.Why = fmt.Sprintf("refused with %d %s: %s", a.status, http.StatusText(a.status), excerpt(a.body))
	}
	return res
}

// concurrent sends c.n requests of one operation at once, then one more.
func (c *checker) concurrent(ctx context.Context, apart bool) CheckResult {
	res := CheckResult{Scenario: ScenarioConcurrent, Sent: fmt.Sprintf("%d × %s at once with one key, then 1 more", c.n, c.method)}
	o := c.newOp(c.cfg.Body)
	answers := make([]answer, c.n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = c.send(ctx, o, false)
		}()
	}
	close(start)
	wg.Wait()
	res.Requests = c.n

	var (
		busy, lost int
		outcomes   []answer // distinct answers that are not busy
		counts     []int
	)
	for _, a := range answers {
		switch {
		case a.err != nil:
			lost++
			continue
		case a.busy():
			busy++
			continue
		}
		found := false
		for j, b := range outcomes {
			if a.same(b) {
				counts[j]++
				found = true
			}
		}
		if !found {
			outcomes, counts = append(outcomes, a), append(counts, 1)
		}
	}
	var got []string
	if len(outcomes) > 2 {
		got = append(got, fmt.Sprintf("%d answers, %d different", c.n-busy-lost, len(outcomes)))
	} else {
		for j, a := range outcomes {
			got = append(got, fmt.Sprintf("%d × %s", counts[j], a))
		}
	}
	if busy > 0 {
		got = append(got, fmt.Sprintf("%d × 409/429", busy))
	}
	if lost > 0 {
		got = append(got, fmt.Sprintf("%d × no answer", lost))
	}
	res.Got = strings.Join(got, ", ")
	switch {
	case len(outcomes) > 1:
		res.Verdict = Fail
		res.Why = fmt.Sprintf("%d different answers to one operation: more than one request performed (%s)", len(outcomes), diffOrStatus(outcomes[0], outcomes[1]))
		return res
	case lost == c.n:
		res.Verdict, res.Why = Unknown, "no request got an answer: "+shortErr(answers[0].err)
		return res
	}
	after, n := c.sendSettled(ctx, o, 3)
	res.Requests += n
	res.Got += "; then " + after.String()
	switch {
	case after.err != nil:
		res.Verdict, res.Why = Unknown, "no answer after the burst: "+shortErr(after.err)
	case len(outcomes) == 1 && !after.same(outcomes[0]):
		res.Verdict = Fail
		res.Why = "the answer after the burst differs from the one given during it: performed again (" + diffOrStatus(outcomes[0], after) + ")"
	case len(outcomes) == 1 && !outcomes[0].ok():
		res.Verdict, res.Why = Unknown, fmt.Sprintf("the operation got %d %s (no 2xx): %s", outcomes[0].status, http.StatusText(outcomes[0].status), excerpt(outcomes[0].body))
	case len(outcomes) == 1 && counts[0] > 1 && !apart:
		res.Verdict, res.Why = Unknown, fmt.Sprintf("%d identical answers: replays, or as many runs; %s", counts[0], unclear)
	case len(outcomes) == 1:
		res.Verdict = Pass
		res.Why = fmt.Sprintf("one outcome (%d), the other requests got 409/429 or its replay, and the answer after the burst repeats it", outcomes[0].status)
	case after.busy():
		res.Verdict = Fail
		res.Why = "every request got 409/429, and the key is still busy after the burst"
	default:
		res.Verdict = Pass
		res.Why = fmt.Sprintf("every request at once got 409/429 or no answer; the one after the burst got %d", after.status)
	}
	return res
}

// diffOrStatus says how b differs from a.
func diffOrStatus(a, b answer) string {
	if a.status != b.status {
		return fmt.Sprintf("status %d vs %d", a.status, b.status)
	}
	return diff(a.body, b.body)
}

// cutConnection cuts a request's connection as soon as it is written,
// retries it with its key until answered, and retries once more.
func (c *checker) cutConnection(ctx context.Context, apart bool) CheckResult {
	res := CheckResult{Scenario: ScenarioCutConnection, Sent: c.method + " cut after writing, then retried with its key, then once more"}
	o := c.newOp(c.cfg.Body)
	c.send(ctx, o, true)
	res.Requests = 1
	// The server may still be running the cut request: give it time.
	retry, n := c.sendSettled(ctx, o, 6)
	res.Requests += n
	res.Got = "cut, then " + retry.String()
	switch {
	case retry.err != nil:
		res.Verdict, res.Why = Unknown, "no answer to the retry: "+shortErr(retry.err)
		return res
	case retry.performed:
		res.Verdict = Pass
		res.Why = fmt.Sprintf("the retry's answer (%d) says the cut request was performed under the key, as the profile reads it", retry.status)
		return res
	case retry.busy():
		res.Verdict = Unknown
		res.Why = fmt.Sprintf("the key was still busy (%d) after %d retries over a few seconds: the cut request may still run, or the key is stuck and a client can never learn the outcome", retry.status, n)
		return res
	case !retry.ok():
		res.Verdict, res.Why = Unknown, fmt.Sprintf("the retry got %d %s: %s", retry.status, http.StatusText(retry.status), excerpt(retry.body))
		return res
	}
	again, m := c.sendSettled(ctx, o, 3)
	res.Requests += m
	res.Got += ", then " + again.String()
	switch {
	case again.err != nil:
		res.Verdict, res.Why = Unknown, "no answer to the last retry: "+shortErr(again.err)
	case again.performed:
		res.Verdict = Pass
		res.Why = fmt.Sprintf("the retry after the cut was answered %d, and the last retry's answer (%d) says it was performed under the key, as the profile reads it", retry.status, again.status)
	case !again.same(retry):
		res.Verdict = Fail
		res.Why = "the last retry was not answered as the first retry: performed again (" + diffOrStatus(retry, again) + ")"
	case !apart:
		res.Verdict, res.Why = Unknown, unclear
	default:
		res.Verdict = Pass
		res.Why = fmt.Sprintf("the retry after the cut was answered %d and the last retry repeats it", retry.status)
	}
	return res
}

// replayMarkers are the response headers known to mark a replay.
var replayMarkers = []string{"Idempotent-Replayed", "Idempotency-Replayed", "X-Idempotent-Replayed", "X-Idempotency-Replayed",
	"X-GCS-Idempotence-Request-Timestamp", "Request-Idempotency", "X-Idempotency-Status"}

// replayMarker looks for a header that marks the replay scenario's second
// answer and not its first.
func (c *checker) replayMarker(replay CheckResult, first, second answer) CheckResult {
	res := CheckResult{Scenario: ScenarioReplayMarker, Sent: "(the replay scenario's answers)", Informational: true}
	if replay.Verdict != Pass {
		res.Verdict, res.Why = Unknown, "no replay to look at (see replay)"
		return res
	}
	for _, h := range replayMarkers {
		if v := first.header.Get(h); strings.EqualFold(v, "true") || strings.EqualFold(v, "replayed") {
			res.Got = h + ": " + v + " on the first answer"
			res.Verdict, res.Why = Fail, "the first answer is marked as a replay"
			return res
		}
	}
	for h := range second.header {
		v := second.header.Get(h)
		lh := strings.ToLower(h)
		known := false
		for _, m := range replayMarkers {
			known = known || strings.EqualFold(m, h)
		}
		if !known && !strings.Contains(lh, "replay") && !strings.Contains(lh, "idempoten") {
			continue
		}
		if first.header.Get(h) == v || strings.EqualFold(v, "false") {
			continue // an echoed key, or the same on both
		}
		res.Got = h + ": " + v + " on the replay only"
		res.Verdict, res.Why = Pass, "a header tells the replay from the first answer"
		return res
	}
	res.Got = "no header differs"
	res.Verdict = Unknown
	res.Why = "no header tells the replay from the first answer (Idempotent-Replayed: true is the custom); a client cannot tell"
	return res
}

// retentionRun is a retention scenario under way.
type retentionRun struct {
	o     op
	first answer
	at    time.Time
}

// startRetention sends the retention scenario's operation.
func (c *checker) startRetention(ctx context.Context) *retentionRun {
	r := &retentionRun{o: c.newOp(c.cfg.Body), at: time.Now()}
	r.first = c.send(ctx, r.o, false)
	return r
}

// finishRetention waits until WaitRetention after the first send and
// sends the operation again.
func (c *checker) finishRetention(ctx context.Context, r *retentionRun) CheckResult {
	d := c.cfg.WaitRetention
	res := CheckResult{Scenario: ScenarioRetention, Requests: 1, Sent: fmt.Sprintf("%s, then again with its key %s later", c.method, d)}
	if !r.first.ok() {
		res.Got = r.first.String()
		res.Verdict, res.Why = Unknown, firstNotOK(r.first)
		return res
	}
	t := time.NewTimer(time.Until(r.at.Add(d)))
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		res.Verdict, res.Why = Unknown, "stopped while waiting"
		return res
	}
	again, n := c.sendSettled(ctx, r.o, 3)
	res.Requests += n
	res.Got = r.first.String() + ", then " + again.String()
	switch {
	case again.err != nil:
		res.Verdict, res.Why = Unknown, "no answer after the wait: "+shortErr(again.err)
	case again.same(r.first):
		res.Verdict, res.Why = Pass, fmt.Sprintf("still replayed after %s", d)
	case again.ok():
		res.Verdict = Fail
		res.Why = fmt.Sprintf("performed again after %s: the server keeps keys for less than that; keep a client's resend window below it (%s)", d, diffOrStatus(r.first, again))
	case again.status >= 500:
		res.Verdict, res.Why = Unknown, fmt.Sprintf("%d after the wait: %s", again.status, excerpt(again.body))
	default:
		res.Verdict, res.Why = Pass, fmt.Sprintf("refused with %d after %s, not performed again", again.status, d)
	}
	return res
}
