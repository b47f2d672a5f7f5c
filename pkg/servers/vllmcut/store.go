package vllmcut

import (
	"container/list"
	"net/http"
	"strings"
	"sync"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// staged is one prefix in the token store: what the cut call's reply held.
type staged struct {
	key        string
	callID     string
	captureKey string
	promptIDs  []int
	tokenIDs   []int
	// content is the reply's message text for the prefix.
	content string
	// logprobs are the reply's logprobs.content entries, one per token
	// (nil when the call did not ask for logprobs).
	logprobs []codec.RawMessage
	// reply is the cut reply, the shape the continued reply keeps.
	reply []byte
	// limit is the cut call's max_tokens (0: none set).
	limit int
}

// StagedPrefix is a staged prefix as GET /_vllmcut/staged/<key> shows it.
type StagedPrefix struct {
	StagingKey   string `json:"staging_key"`
	ModelCallID  string `json:"model_call_id"`
	CaptureKey   string `json:"capture_key"`
	PromptIDs    []int  `json:"prompt_token_ids"`
	TokenIDs     []int  `json:"token_ids"`
	PrefixDigest string `json:"prefix_digest"`
}

// tokenStore holds staged prefixes, at most max of them (the oldest go
// first: a lost prefix only costs regeneration).
type tokenStore struct {
	max int

	mu    sync.Mutex
	byKey map[string]*list.Element
	order *list.List // of *staged, oldest first
}

func newTokenStore(max int) *tokenStore {
	return &tokenStore{max: max, byKey: map[string]*list.Element{}, order: list.New()}
}

func (t *tokenStore) put(st *staged) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byKey[st.key]; ok {
		t.order.Remove(e)
	}
	t.byKey[st.key] = t.order.PushBack(st)
	for t.order.Len() > t.max {
		oldest := t.order.Front()
		t.order.Remove(oldest)
		delete(t.byKey, oldest.Value.(*staged).key)
	}
}

func (t *tokenStore) get(key string) (*staged, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byKey[key]
	if !ok {
		return nil, false
	}
	return e.Value.(*staged), true
}

// handleStaged shows a staged prefix (tests and operators read the token
// store through it).
func (s *Server) handleStaged(r *http.Request) (any, error) {
	key := strings.TrimPrefix(r.URL.Path, "/_vllmcut/staged/")
	st, ok := s.store.get(key)
	if !ok {
		return nil, apierror.New(apierror.NotFound, "no prefix is staged under %q", key).WithStatus(http.StatusNotFound)
	}
	return StagedPrefix{
		StagingKey: st.key, ModelCallID: st.callID, CaptureKey: st.captureKey,
		PromptIDs: st.promptIDs, TokenIDs: st.tokenIDs, PrefixDigest: PrefixDigest(st.tokenIDs),
	}, nil
}

// StagingKey is where a cut call's prefix is staged.
func StagingKey(captureKey, callID string) string { return gencut.StagingKey(captureKey, callID) }
