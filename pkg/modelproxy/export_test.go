package modelproxy

import (
	"github.com/gymfleet/gymfleet/pkg/codec"
	"github.com/gymfleet/gymfleet/pkg/openai"
)

// Test access to the decoders and the stream splitter.

func DecodeResponsesRequest(body []byte) (*openai.ResponsesRequest, error) {
	return decodeResponsesRequest(body)
}

func DecodeChatRequest(body []byte) (map[string]codec.RawMessage, error) {
	return decodeChatRequest(body)
}

func EncodeObject(f map[string]codec.RawMessage) ([]byte, error) { return encodeObject(f) }

func ExtractTokens(c *openai.ChatCompletion) (openai.TokenFields, error) { return extractTokens(c) }

// SplitThinkStream feeds content to the stream's <think> filter in the given
// pieces and returns the visible text and the blocks, as streamed.
func SplitThinkStream(pieces []string) (visible string, blocks []string) {
	var f thinkFilter
	for _, p := range pieces {
		for _, seg := range f.feed(p) {
			if seg.think {
				blocks = append(blocks, seg.text)
			} else {
				visible += seg.text
			}
		}
	}
	return visible + f.flush(), blocks
}

// ConstrainedChat reports whether a decoded chat body uses constrained
// decoding (such calls are never cut).
func ConstrainedChat(f map[string]codec.RawMessage) bool { return constrainedChat(f) }

// ConstrainedResponses is ConstrainedChat for a Responses body.
func ConstrainedResponses(body []byte) (bool, error) {
	req, err := decodeResponsesRequest(body)
	if err != nil {
		return false, err
	}
	chat, err := openai.ResponsesToChat(req, "m")
	if err != nil {
		return false, err
	}
	return constrainedResponses(req, chat), nil
}
