package fakeinference

import (
	"unicode"
	"unicode/utf8"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// Special token ids of the chat template. Every id below FirstTextTokenID is
// special; text pieces hash into [FirstTextTokenID, vocab_size).
const (
	TokenIMStart           = 1 // <|im_start|>: opens a message
	TokenIMEnd             = 2 // <|im_end|>: closes a message; a finished generation ends with it
	TokenRoleSystem        = 3
	TokenRoleUser          = 4
	TokenRoleAssistant     = 5
	TokenRoleTool          = 6
	TokenRoleDeveloper     = 7
	TokenRoleOther         = 8
	TokenToolsBegin        = 9  // <tools>: the offered tools' JSON follows
	TokenToolsEnd          = 10 // </tools>
	TokenToolCallBegin     = 11 // <tool_call>
	TokenToolCallEnd       = 12 // </tool_call>
	TokenToolResponseBegin = 13 // <tool_response>
	TokenToolResponseEnd   = 14 // </tool_response>

	FirstTextTokenID = 100
	// MinVocabSize leaves room for a useful number of text ids.
	MinVocabSize = 1000
)

// SpecialTokenText is the text of a special token id, as it appears in
// logprobs; "" for ids that are not special.
func SpecialTokenText(id int) string {
	switch id {
	case TokenIMStart:
		return "<|im_start|>"
	case TokenIMEnd:
		return "<|im_end|>"
	case TokenRoleSystem:
		return "system"
	case TokenRoleUser:
		return "user"
	case TokenRoleAssistant:
		return "assistant"
	case TokenRoleTool:
		return "tool"
	case TokenRoleDeveloper:
		return "developer"
	case TokenRoleOther:
		return "other"
	case TokenToolsBegin:
		return "<tools>"
	case TokenToolsEnd:
		return "</tools>"
	case TokenToolCallBegin:
		return "<tool_call>"
	case TokenToolCallEnd:
		return "</tool_call>"
	case TokenToolResponseBegin:
		return "<tool_response>"
	case TokenToolResponseEnd:
		return "</tool_response>"
	}
	return ""
}

// Tokenizer is the fake model's deterministic tokenizer: text splits into
// pieces (runs of word characters, runs of white space, and single other
// characters), and a piece's id is FirstTextTokenID + fnv-1a(piece) mod
// (vocab_size - FirstTextTokenID). Concatenating a text's pieces gives the
// text back, and any prefix of a text's pieces tokenizes to itself, which
// keeps a conversation's prompt ids an extension of the previous call's
// prompt plus generation.
type Tokenizer struct {
	vocab int
}

// NewTokenizer returns a tokenizer over vocabSize ids (at least MinVocabSize).
func NewTokenizer(vocabSize int) Tokenizer {
	if vocabSize < MinVocabSize {
		vocabSize = MinVocabSize
	}
	return Tokenizer{vocab: vocabSize}
}

// Tokenize tokenizes text with DefaultVocabSize.
func Tokenize(text string) []int { return NewTokenizer(DefaultVocabSize).Tokenize(text) }

// PromptIDs returns a chat request's prompt ids with DefaultVocabSize.
func PromptIDs(req *openai.ChatRequest) []int { return NewTokenizer(DefaultVocabSize).PromptIDs(req) }

// VocabSize is the number of ids.
func (t Tokenizer) VocabSize() int { return t.vocab }

// Tokenize returns the ids of text's pieces.
func (t Tokenizer) Tokenize(text string) []int { return t.appendText(nil, text) }

// PieceID is the id of one piece.
func (t Tokenizer) PieceID(piece string) int {
	h := uint64(14695981039346656037)
	for i := 0; i < len(piece); i++ {
		h ^= uint64(piece[i])
		h *= 1099511628211
	}
	return FirstTextTokenID + int(h%uint64(t.vocab-FirstTextTokenID))
}

// Pieces splits text into the pieces Tokenize gives ids to.
func Pieces(text string) []string {
	var out []string
	forEachPiece(text, func(p string) { out = append(out, p) })
	return out
}

func (t Tokenizer) appendText(ids []int, text string) []int {
	forEachPiece(text, func(p string) { ids = append(ids, t.PieceID(p)) })
	return ids
}

type pieceClass uint8

const (
	classWord pieceClass = iota
	classSpace
	classOther
)

func classOf(r rune) pieceClass {
	switch {
	case r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
		return classWord
	case unicode.IsSpace(r):
		return classSpace
	}
	return classOther
}

// forEachPiece calls f with each piece of text in order. Invalid UTF-8 bytes
// are pieces of their own, so every byte of text is in exactly one piece.
func forEachPiece(text string, f func(string)) {
	start := 0
	var cur pieceClass
	for i := 0; i < len(text); {
		r, size := utf8.DecodeRuneInString(text[i:])
		c := classOf(r)
		if r == utf8.RuneError && size <= 1 {
			c = classOther
		}
		if i > start && (c != cur || c == classOther) {
			f(text[start:i])
			start = i
		}
		cur = c
		i += size
	}
	if start < len(text) {
		f(text[start:])
	}
}

// PromptIDs renders a chat request through the fake chat template, with the
// generation prompt (what the model is asked to continue).
func (t Tokenizer) PromptIDs(req *openai.ChatRequest) []int {
	return t.ChatPromptIDs(req.Messages, req.Tools, true)
}

// ChatPromptIDs renders messages and tools through the fake chat template:
//
//	[<|im_start|> system <tools> tools-json </tools> <|im_end|>]   when tools are offered
//	<|im_start|> role content [tool calls] <|im_end|>               per message
//	<|im_start|> assistant                                          the generation prompt
//
// A tool call renders exactly as the model generates it (<tool_call>
// {"name": "<name>", "arguments": <arguments>} </tool_call>), and a tool
// result as <tool_response> content </tool_response>, so the next call's prompt
// extends this call's prompt and generation.
func (t Tokenizer) ChatPromptIDs(messages []openai.ChatMessage, tools []openai.ChatTool, addGenerationPrompt bool) []int {
	ids := make([]int, 0, 64)
	if len(tools) > 0 {
		ids = append(ids, TokenIMStart, TokenRoleSystem, TokenToolsBegin)
		ids = t.appendText(ids, toolsJSON(tools))
		ids = append(ids, TokenToolsEnd, TokenIMEnd)
	}
	for i := range messages {
		m := &messages[i]
		ids = append(ids, TokenIMStart, roleToken(m.Role))
		switch m.Role {
		case "tool":
			ids = append(ids, TokenToolResponseBegin)
			ids = t.appendText(ids, m.Content.String())
			ids = append(ids, TokenToolResponseEnd)
		default:
			ids = t.appendText(ids, m.Content.String())
			for _, tc := range m.ToolCalls {
				ids = append(ids, TokenToolCallBegin)
				ids = t.appendText(ids, toolCallHead(tc.Function.Name))
				ids = t.appendText(ids, tc.Function.Arguments)
				ids = t.appendText(ids, toolCallTail)
				ids = append(ids, TokenToolCallEnd)
			}
		}
		ids = append(ids, TokenIMEnd)
	}
	if addGenerationPrompt {
		ids = append(ids, TokenIMStart, TokenRoleAssistant)
	}
	return ids
}

func roleToken(role string) int {
	switch role {
	case "system":
		return TokenRoleSystem
	case "user":
		return TokenRoleUser
	case "assistant":
		return TokenRoleAssistant
	case "tool":
		return TokenRoleTool
	case "developer":
		return TokenRoleDeveloper
	}
	return TokenRoleOther
}

// toolCallHead and toolCallTail wrap a tool call's arguments the way a
// hermes-style model writes a call.
func toolCallHead(name string) string {
	q, _ := codec.MarshalStable(name)
	return `{"name": ` + string(q) + `, "arguments": `
}

const toolCallTail = "}"

// toolsJSON is the tools as the template shows them. encoding/json is used
// so the text (and so the prompt ids) never changes with the data-path codec.
func toolsJSON(tools []openai.ChatTool) string {
	b, err := codec.MarshalStable(tools)
	if err != nil {
		// A decoded request always re-encodes; names alone keep the prompt
		// deterministic should that ever fail.
		var s string
		for _, tl := range tools {
			s += tl.Function.Name + "\n"
		}
		return s
	}
	return string(b)
}

// PrefixDigest is the sha256 (hex) of token ids written as a compact JSON
// array, e.g. "[1,2,3]". Generation-cut receipts carry it as prefix_digest,
// and prompt digests use it too.
func PrefixDigest(ids []int) string { return gencut.PrefixDigest(ids) }
