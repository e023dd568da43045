package sdktest_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
)

// The SDKs that Stainless generates (openai-go, anthropic-sdk-go) retry a
// failed call twice by default. Each retry is a fresh RoundTrip through
// idem, told apart from a new call only by X-Stainless-Retry-Count; neither
// SDK sends an idempotency key of its own. idem must still give the call
// one key and the provider one effect, and give a deliberate second call
// a key of its own.

// stainlessSDK is one SDK under test and the endpoint it posts to.
type stainlessSDK struct {
	name string
	// answer is the JSON body of a successful response; id names the
	// result, so that a replay is told apart from a second run.
	answer func(id string) string
	// idPrefix is how the provider's result IDs start.
	idPrefix string
	// call makes one SDK call, at the SDK's default retry settings, through
	// hc to the server at base, and returns the result's ID.
	call func(ctx context.Context, hc *http.Client, base string) (string, error)
	// retriesDroppedBody says whether the SDK retries a call whose 2xx
	// body was cut off mid-read (anthropic-sdk-go does, openai-go does not).
	retriesDroppedBody bool
}

var stainlessSDKs = []stainlessSDK{
	{
		name:     "openai-go",
		idPrefix: "chatcmpl-",
		answer: func(id string) string {
			return `{"id":"` + id + `","object":"chat.completion","created":1764374400,"model":"gpt-4o",` +
				`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}]}`
		},
		call: func(ctx context.Context, hc *http.Client, base string) (string, error) {
			c := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("sk-test"), option.WithHTTPClient(hc))
			cc, err := c.Chat.Completions.New(ctx, openaiParams())
			if err != nil {
				return "", err
			}
			return cc.ID, nil
		},
	},
	{
		name:     "anthropic-sdk-go",
		idPrefix: "msg_",
		answer: func(id string) string {
			return `{"id":"` + id + `","type":"message","role":"assistant","model":"claude-sonnet-5-5",` +
				`"content":[{"type":"text","text":"Hello"}],"stop_reason":"end_turn","stop_sequence":null,` +
				`"usage":{"input_tokens":3,"output_tokens":1}}`
		},
		call: func(ctx context.Context, hc *http.Client, base string) (string, error) {
			c := anthropic.NewClient(anthropicoption.WithoutEnvironmentDefaults(), anthropicoption.WithBaseURL(base+"/"),
				anthropicoption.WithAPIKey("sk-ant-test"), anthropicoption.WithHTTPClient(hc))
			m, err := c.Messages.New(ctx, anthropic.MessageNewParams{
				Model:     anthropic.ModelClaudeSonnet5_5,
				MaxTokens: 16,
				Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello"))},
			})
			if err != nil {
				return "", err
			}
			return m.ID, nil
		},
		retriesDroppedBody: true,
	},
}

func openaiParams() openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    openai.ChatModel("gpt-4.1"),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
	}
}

// provider is the handler behind an idemtest server: every run creates a
// new result, numbered.
func provider(sdk stainlessSDK) (http.Handler, *atomic.Int64) {
	var runs atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, sdk.answer(fmt.Sprintf("%s%d", sdk.idPrefix, n)))
	}), &runs
}

// newIdem returns an idem client over a memory journal that sends through
// base, with short backoffs, closed when the test ends.
func newIdem(t *testing.T, base http.RoundTripper) (*idem.Client, *idem.MemoryStore) {
	store := idem.NewMemoryStore()
	c := idem.New(store, idem.WithBaseTransport(base), idem.WithBackoff(time.Millisecond, 10*time.Millisecond))
	t.Cleanup(func() { c.Close() })
	return c, store
}

// firstKeyFaults injects faults into the requests of the first key the
// server sees, by attempt, and leaves every other key alone, so that a
// later call meets a clean network.
func firstKeyFaults(fault func(attempt int) idemtest.Fault) func(key string, attempt int) idemtest.Fault {
	var (
		mu    sync.Mutex
		first string
	)
	return func(key string, attempt int) idemtest.Fault {
		mu.Lock()
		defer mu.Unlock()
		if first == "" {
			first = key
		}
		if key != first {
			return idemtest.NoFault
		}
		return fault(attempt)
	}
}

// TestStainlessRetriesShareOneKey makes one SDK call against a provider
// that performs the first attempt but loses its response, then fails
// more attempts than idem makes in one RoundTrip, so that the call
// succeeds only through the SDK's own retry. The provider must see one key
// and perform the call once. A deliberate second identical call after the
// success is a new operation: a new key and a second effect.
func TestStainlessRetriesShareOneKey(t *testing.T) {
	// idem makes 4 attempts per RoundTrip by default; attempts 1 to 4 of
	// the first key fail, so only an SDK retry that reuses the key reaches
	// attempt 5.
	scripts := []struct {
		name  string
		fault func(attempt int) idemtest.Fault
	}{
		{
			// idem returns the last 503 to the SDK, which retries it.
			name: "lost response then 503s",
			fault: func(attempt int) idemtest.Fault {
				switch {
				case attempt == 1:
					return idemtest.DropAfter
				case attempt <= 4:
					return idemtest.Unavailable
				}
				return idemtest.NoFault
			},
		},
		{
			// idem returns an in-doubt error (no response at all) to the
			// SDK, which retries it as a connection error.
			name: "lost response then dropped connections",
			fault: func(attempt int) idemtest.Fault {
				switch {
				case attempt == 1:
					return idemtest.DropAfter
				case attempt <= 4:
					return idemtest.DropBefore
				}
				return idemtest.NoFault
			},
		},
	}
	for _, sdk := range stainlessSDKs {
		for _, sc := range scripts {
			t.Run(sdk.name+"/"+sc.name, func(t *testing.T) {
				h, _ := provider(sdk)
				srv := idemtest.NewServer(h, idemtest.WithRetryAfter(0), idemtest.WithScript(firstKeyFaults(sc.fault)))
				defer srv.Close()
				c, _ := newIdem(t, srv.Client().Transport)
				ctx := context.Background()

				id, err := sdk.call(ctx, c.HTTPClient(), srv.URL)
				assert.NoError(t, err, "the SDK's retry should have reached the stored result")
				assert.Equal(t, sdk.idPrefix+"1", id, "the call's result is the first run's, replayed")
				st := srv.Stats()
				assert.Len(t, st.AttemptsByKey, 1, "keys the provider saw for one SDK call: %v", st.AttemptsByKey)
				assert.Equal(t, 1, st.Runs, "effects of one SDK call")
				assert.Equal(t, 0, st.DuplicateKeys(), "keys performed more than once")
				assert.Equal(t, 0, st.DuplicatePayloads(), "payloads performed more than once (under several keys)")

				// A deliberate second identical call after the success.
				id, err = sdk.call(ctx, c.HTTPClient(), srv.URL)
				require.NoError(t, err)
				assert.Equal(t, fmt.Sprintf("%s%d", sdk.idPrefix, st.Runs+1), id, "a second call is performed again, not replayed")
				st2 := srv.Stats()
				assert.Len(t, st2.AttemptsByKey, len(st.AttemptsByKey)+1, "the second call has a key of its own")
				assert.Equal(t, st.Runs+1, st2.Runs, "the second call is one more effect")
				assert.Equal(t, st.Replays, st2.Replays, "the second call is not a replay")
			})
		}
	}
}

// TestStainlessSecondIdenticalCallIsNewOperation makes the same SDK call
// twice on a clean network: each call succeeded at once, so the second is a
// new operation with a key of its own, performed again.
func TestStainlessSecondIdenticalCallIsNewOperation(t *testing.T) {
	for _, sdk := range stainlessSDKs {
		t.Run(sdk.name, func(t *testing.T) {
			h, runs := provider(sdk)
			srv := idemtest.NewServer(h)
			defer srv.Close()
			c, _ := newIdem(t, srv.Client().Transport)

			for i := 1; i <= 2; i++ {
				id, err := sdk.call(context.Background(), c.HTTPClient(), srv.URL)
				require.NoError(t, err, "call %d", i)
				assert.Equal(t, fmt.Sprintf("%s%d", sdk.idPrefix, i), id, "call %d", i)
			}
			st := srv.Stats()
			assert.Len(t, st.AttemptsByKey, 2, "keys: %v", st.AttemptsByKey)
			assert.Equal(t, int64(2), runs.Load(), "effects")
			assert.Equal(t, 0, st.Replays)
		})
	}
}

// cutServer is a provider on loopback whose first response is a 2xx
// with its body cut off: the server performs the call, sends the status,
// headers and half the body, and closes the connection. Later requests
// with a key it has performed get that key's result again; a new key is a
// new effect.
type cutServer struct {
	*httptest.Server
	sdk stainlessSDK
	// journal is the client's journal, read when the request after the
	// cut-off one arrives.
	journal idem.KeyStore

	mu           sync.Mutex
	results      map[string]string // result body by key
	keys         []string          // key of each request, in arrival order
	effects      int
	stateAtRetry idem.State // the cut-off operation's state when the next request arrived
}

func newCutServer(sdk stainlessSDK, journal idem.KeyStore) *cutServer {
	s := &cutServer{sdk: sdk, journal: journal, results: make(map[string]string)}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

func (s *cutServer) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	s.keys = append(s.keys, key)
	n := len(s.keys)
	body, ok := s.results[key]
	if !ok {
		s.effects++
		body = s.sdk.answer(fmt.Sprintf("%s%d", s.sdk.idPrefix, s.effects))
		if key != "" {
			s.results[key] = body
		}
	}
	first := s.keys[0]
	s.mu.Unlock()

	if n == 2 {
		if op, err := s.journal.Get(r.Context(), first); err == nil {
			s.mu.Lock()
			s.stateAtRetry = op.State
			s.mu.Unlock()
		}
	}
	if n > 1 {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, body)
		return
	}
	// Read the request to its end first: closing a connection with unread
	// input resets it, which could discard the response before the client
	// reads its header.
	io.Copy(io.Discard, r.Body)
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	fmt.Fprintf(buf, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		len(body), body[:len(body)/2])
	buf.Flush()
}

// stats returns the keys of the requests received, the effects, and the
// cut-off operation's state in the journal when the next request arrived.
func (s *cutServer) stats() (keys []string, effects int, stateAtRetry idem.State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...), s.effects, s.stateAtRetry
}

// TestStainlessCutOffBodyStaysInDoubt: a 2xx whose body is cut off
// mid-read was not received, so the operation stays in doubt (pending in
// the journal), not settled, and the retry of the same call — the SDK's
// own where it retries a dropped body, else the application's — reuses the
// key and gets the one result.
func TestStainlessCutOffBodyStaysInDoubt(t *testing.T) {
	for _, sdk := range stainlessSDKs {
		t.Run(sdk.name, func(t *testing.T) {
			store := idem.NewMemoryStore()
			srv := newCutServer(sdk, store)
			defer srv.Close()
			c := idem.New(store, idem.WithBaseTransport(srv.Client().Transport), idem.WithBackoff(time.Millisecond, 10*time.Millisecond))
			defer c.Close()
			ctx := context.Background()

			id, err := sdk.call(ctx, c.HTTPClient(), srv.URL)
			if !sdk.retriesDroppedBody {
				require.Error(t, err, "the body was cut off")
				keys, _, _ := srv.stats()
				require.Len(t, keys, 1)
				op, gerr := store.Get(ctx, keys[0])
				require.NoError(t, gerr)
				assert.Equal(t, idem.StatePending, op.State, "a cut-off 2xx leaves the operation in doubt, not settled")
				// The application retries the call.
				id, err = sdk.call(ctx, c.HTTPClient(), srv.URL)
			}
			require.NoError(t, err)
			assert.Equal(t, sdk.idPrefix+"1", id, "the retry gets the first run's result")
			keys, effects, stateAtRetry := srv.stats()
			assert.Equal(t, idem.StatePending, stateAtRetry, "state of the cut-off operation when its retry arrived")
			require.Len(t, keys, 2, "requests")
			assert.Equal(t, keys[0], keys[1], "the retry reuses the cut-off operation's key")
			assert.Equal(t, 1, effects, "effects")
		})
	}
}

// TestOpenAIStreamingThroughIdem checks that an SSE response streams
// through idem chunk by chunk: the first chunk reaches the caller while
// the server still holds back the rest, which it writes only once the
// caller has read the first. A transport that buffered the body would
// deadlock here; the context's deadline only bounds that hang, it is not
// a timing assertion.
func TestOpenAIStreamingThroughIdem(t *testing.T) {
	firstRead := make(chan struct{})
	var keys []string
	var mu sync.Mutex
	chunk := func(content string) string {
		return `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764374400,"model":"gpt-4o",` +
			`"choices":[{"index":0,"delta":{"content":"` + content + `"},"finish_reason":null}]}` + "\n\n"
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, chunk("Hel"))
		w.(http.Flusher).Flush()
		select {
		case <-firstRead:
		case <-r.Context().Done():
			return
		}
		bw := bufio.NewWriter(w)
		fmt.Fprint(bw, chunk("lo"))
		fmt.Fprint(bw, "data: [DONE]\n\n")
		bw.Flush()
	}))
	defer srv.Close()
	c, store := newIdem(t, srv.Client().Transport)
	oc := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("sk-test"), option.WithHTTPClient(c.HTTPClient()))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream := oc.Chat.Completions.NewStreaming(ctx, openaiParams())
	defer stream.Close()

	require.True(t, stream.Next(), "the first chunk did not arrive while the server held back the rest: %v", stream.Err())
	require.Len(t, stream.Current().Choices, 1)
	assert.Equal(t, "Hel", stream.Current().Choices[0].Delta.Content)
	close(firstRead)

	require.True(t, stream.Next(), "second chunk: %v", stream.Err())
	require.Len(t, stream.Current().Choices, 1)
	assert.Equal(t, "lo", stream.Current().Choices[0].Delta.Content)
	assert.False(t, stream.Next(), "the stream ends at [DONE]")
	require.NoError(t, stream.Err())
	require.NoError(t, stream.Close())

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, keys, 1, "requests")
	require.NotEmpty(t, keys[0], "the streaming POST carried a key")
	op, err := store.Get(context.Background(), keys[0])
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, op.State, "a stream read to the end is settled")
}
