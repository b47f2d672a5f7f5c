package fakeinference_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

func TestPieces(t *testing.T) {
	tests := []struct {
		text string
		want []string
	}{
		{"", nil},
		{"Hello, world!", []string{"Hello", ",", " ", "world", "!"}},
		{"get_weather  {\"city\": 42}\n", []string{"get_weather", "  ", "{", "\"", "city", "\"", ":", " ", "42", "}", "\n"}},
		{"héllo wörld", []string{"héllo", " ", "wörld"}},
		{"a\xffb", []string{"a", "\xff", "b"}},
		{"!!", []string{"!", "!"}},
	}
	for _, tt := range tests {
		if got := fakeinference.Pieces(tt.text); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Pieces(%q) = %q, want %q", tt.text, got, tt.want)
		}
	}
}

// The ids are part of the wire contract tests elsewhere pin; a change here
// changes every golden reply.
func TestTokenize_PinnedIDs(t *testing.T) {
	got := fakeinference.Tokenize("Hello, world!")
	want := []int{26063, 15347, 26803, 15875, 21692}
	if !slices.Equal(got, want) {
		t.Errorf("Tokenize(%q) = %v, want %v", "Hello, world!", got, want)
	}
	if id := fakeinference.NewTokenizer(1000).PieceID("Hello"); id < fakeinference.FirstTextTokenID || id >= 1000 {
		t.Errorf("PieceID with vocab 1000 = %d, want in [100, 1000)", id)
	}
}

func TestTokenize_Properties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		text := rapid.String().Draw(t, "text")
		vocab := rapid.IntRange(fakeinference.MinVocabSize, 200000).Draw(t, "vocab")
		tok := fakeinference.NewTokenizer(vocab)
		pieces := fakeinference.Pieces(text)
		if strings.Join(pieces, "") != text {
			t.Fatalf("pieces %q do not join back to %q", pieces, text)
		}
		ids := tok.Tokenize(text)
		if !slices.Equal(ids, tok.Tokenize(text)) {
			t.Fatal("tokenize is not deterministic")
		}
		if len(ids) != len(pieces) {
			t.Fatalf("%d ids for %d pieces", len(ids), len(pieces))
		}
		for _, id := range ids {
			if id < fakeinference.FirstTextTokenID || id >= vocab {
				t.Fatalf("id %d outside [%d, %d)", id, fakeinference.FirstTextTokenID, vocab)
			}
		}
		// Any prefix of the pieces tokenizes to itself, which keeps a
		// truncated reply's ids stable when it comes back as history.
		k := rapid.IntRange(0, len(pieces)).Draw(t, "k")
		if got := tok.Tokenize(strings.Join(pieces[:k], "")); !slices.Equal(got, ids[:k]) {
			t.Fatalf("prefix of %d pieces tokenizes to %v, want %v", k, got, ids[:k])
		}
	})
}

func TestPromptIDs_Template(t *testing.T) {
	content := openai.TextContent("Hi")
	req := &openai.ChatRequest{Messages: []openai.ChatMessage{{Role: "user", Content: content}}}
	hi := fakeinference.Tokenize("Hi")
	want := append(append([]int{fakeinference.TokenIMStart, fakeinference.TokenRoleUser}, hi...),
		fakeinference.TokenIMEnd, fakeinference.TokenIMStart, fakeinference.TokenRoleAssistant)
	if got := fakeinference.PromptIDs(req); !slices.Equal(got, want) {
		t.Errorf("PromptIDs = %v, want %v", got, want)
	}
	withTools := *req
	withTools.Tools = []openai.ChatTool{{Type: "function", Function: openai.ChatFunction{Name: "f"}}}
	got := fakeinference.PromptIDs(&withTools)
	if got[0] != fakeinference.TokenIMStart || got[1] != fakeinference.TokenRoleSystem || got[2] != fakeinference.TokenToolsBegin {
		t.Errorf("a request with tools starts with %v, want the tools block", got[:3])
	}
	if !slices.Equal(got[len(got)-len(want):], want) {
		t.Errorf("the messages follow the tools block: got tail %v, want %v", got[len(got)-len(want):], want)
	}
}

func TestPrefixDigest(t *testing.T) {
	// sha256("[1,2,3]")
	const want = "a615eeaee21de5179de080de8c3052c8da901138406ba71c38c032845f7d54f4"
	if got := fakeinference.PrefixDigest([]int{1, 2, 3}); got != want {
		t.Errorf("PrefixDigest([1,2,3]) = %s, want %s", got, want)
	}
	if got := fakeinference.PrefixDigest(nil); got != "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945" {
		t.Errorf("PrefixDigest(nil) = %s, want sha256(\"[]\")", got)
	}
}
