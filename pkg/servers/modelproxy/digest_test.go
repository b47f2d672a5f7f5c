package modelproxy

import (
	"strings"
	"testing"
)

// digestCase is a request's messages and tools, and whether the
// canonicalizer digests them itself (fast) rather than handing them to
// digestDecoded.
type digestCase struct {
	name            string
	messages, tools string
	fast            bool
}

// toolCall is an assistant message calling get_weather with arguments, a
// JSON string's contents as written.
func toolCall(arguments string) string {
	return `[{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"` + arguments + `"}}]}]`
}

const weatherTools = `[{"type":"function","function":{"name":"get_weather","description":"Get the current weather of a city.","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`

var digestCases = []digestCase{
	{"tool arguments, escaped quotes", toolCall(`{\"city\": \"Paris\"}`), weatherTools, true},
	{"escapes", toolCall(`line\nbreak \t tab \r \b \f \/ slash \\ backslash \" quote`), weatherTools, true},
	{"unicode escapes", toolCall(`caf\u00e9 \u00E9 \u0041 \uffff \ufffd`), weatherTools, true},
	{"surrogate pair", toolCall(`\ud83d\ude00 \uD83D\uDE00`), "", true},
	{"raw UTF-8", toolCall("café 😀 日本 \u00ad"), "", true},
	{"HTML characters", toolCall(`<b>&amp;</b> \u003c\u003e\u0026`), "", true},
	{"line and paragraph separators", toolCall("raw \u2028 \u2029 escaped \\u2028 \\u2029"), "", true},
	{"control characters", toolCall(`\u0000 \u0001 \u001f \u0008 \u000b`), "", true},
	{"DEL", toolCall("raw \x7f escaped \\u007f"), "", true},
	{"duplicate keys", `[{"role":"user","role":"assistant","content":"a","content":"b"}]`, `[{"type":"function","function":{"name":"f"},"function":{"name":"g"}}]`, true},
	{"duplicate keys, object values", `[{"a":{"x":1,"y":[1]},"a":{"z":2}}]`, "", true},
	{"duplicate keys, equal when decoded", `[{"é":1,"\u00e9":2,"\u00E9":3}]`, "", true},
	{"keys sorted as decoded", `[{"\u00e9":1,"z":2,"\u0041":3,"B":4,"\u003c":5,";":6,"a\u0000":7,"a":8,"aa":9}]`, "", true},
	{"keys with escapes", `[{"a\nb":1,"a\"b":2,"a\\b":3,"<&>":4,"\u2028":5}]`, "", true},
	{"nested", `[{"content":[{"type":"text","text":"t"},[[[{"b":{"d":[{"f":1,"e":2}],"c":null}}]]]]}]`, "", true},
	{"numbers", `[1.0,-0,0,1e5,1E+05,1e-5,-1.5e-10,0.1,5e-324,1e400,-1e400,123456789012345678901234567890,9007199254740993,-0.0,0e0]`, "", true},
	{"numbers in tools", "", `[{"type":"function","function":{"name":"f","parameters":{"maximum":1.50,"minimum":-2E3}}}]`, true},
	{"literals", `[true,false,null,{"a":true,"b":false,"c":null}]`, "", true},
	{"empty objects and arrays", `[{},[],[{}],[[]],{"a":{},"b":[]}]`, `[{}]`, true},
	{"white space", " \n\t[ { \"role\" : \"user\" , \"content\" : \"hi\" } ] \r\n", "\n [ ] \t", true},
	{"no tools", `[]`, "", true},
	{"tools white space", `[]`, " \n\t ", true},
	{"tools empty array", `[]`, `[]`, true},
	{"tools empty array, white space", `[]`, " [ \n ] ", true},
	{"tools null", `[]`, `null`, true},
	{"tools empty object", `[]`, `{}`, true},
	{"messages empty", "", "", true},
	{"messages null", "null", weatherTools, true},
	{"messages not an array", `{"role":"user"}`, `"tools"`, true},
	{"top-level number", `12.50`, `-0`, true},
	{"unicode white space only", "\u00a0\u2003", "\u0085", true},

	// The canonicalizer is not sure of these: digestDecoded digests them,
	// or refuses them, as it always did.
	{"trailing value", `[] []`, "", false},
	{"trailing garbage after an array", `[{"a":1}]x`, "", false},
	{"trailing garbage after a number", `123abc`, "", false},
	{"trailing garbage in tools", `[]`, `[]]`, false},
	{"invalid UTF-8 in a string", "[\"a\xffb\"]", "", false},
	{"invalid UTF-8 in a key", "[{\"\xfe\":1,\"a\":2}]", "", false},
	{"truncated UTF-8", "[\"\xe2\x80\"]", "", false},
	{"surrogate half as UTF-8", "[\"\xed\xa0\x80\"]", "", false},
	{"lone high surrogate", `["\ud800"]`, "", false},
	{"lone low surrogate", `["\udc00"]`, "", false},
	{"reversed surrogates", `["\udc00\ud800"]`, "", false},
	{"high surrogate then a letter", `["\ud800\u0041"]`, "", false},
	{"lone surrogate in a key", `[{"\ud800":1}]`, "", false},
	{"escaped backslash before a surrogate", `["\\ud800\udc00"]`, "", false},
	{"invalid JSON", `[1,]`, "", false},
	{"invalid JSON in tools", `[]`, `[{"type":}]`, false},
	{"unquoted key", `[{a:1}]`, "", false},
	{"truncated", `[{"role":"user"`, "", false},
	{"bad escape", `["\x"]`, "", false},
	{"short unicode escape", `["\u12"]`, "", false},
	{"control character in a string", "[\"a\x01b\"]", "", false},
	{"leading zero", `[01]`, "", false},
	{"bare minus", `[-]`, "", false},
	{"vertical tab", "\v[]", "", false},
	{"byte order mark", "\ufeff[]", "", false},
	{"nested too deep", strings.Repeat("[", 10001) + strings.Repeat("]", 10001), "", false},
	{"nested as deep as allowed", strings.Repeat("[", 10000) + strings.Repeat("]", 10000), "", true},
}

// TestDigest_MatchesDecoded: the canonicalizer's digest is digestDecoded's
// for every case, and the canonicalizer digests itself what it is meant to.
func TestDigest_MatchesDecoded(t *testing.T) {
	var d requestDigests
	for _, tc := range digestCases {
		t.Run(tc.name, func(t *testing.T) {
			want, werr := digestDecoded([]byte(tc.messages), []byte(tc.tools))
			got, gerr := d.request([]byte(tc.messages), []byte(tc.tools))
			if got != want || errorText(gerr) != errorText(werr) {
				t.Fatalf("digest %q, %v; decoded %q, %v", got, gerr, want, werr)
			}
			g := d.get()
			defer d.put(g, 0)
			fast, ok := g.digest([]byte(tc.messages), []byte(tc.tools))
			if ok != tc.fast {
				t.Fatalf("canonicalizer sure: %v, want %v", ok, tc.fast)
			}
			if ok && fast != want {
				t.Fatalf("canonicalizer %q, decoded %q", fast, want)
			}
		})
	}
}

// TestDigest_Values: every case digests, or is refused, as main's build
// at c61e6c7 did (digestedAtC61e6c7), so that neither path drifts from
// what ledgers and checkpoints already hold, on this toolchain or the next.
func TestDigest_Values(t *testing.T) {
	var d requestDigests
	for _, tc := range digestCases {
		want, ok := digestedAtC61e6c7[tc.name]
		if !ok {
			t.Errorf("%s: no digest recorded", tc.name)
			continue
		}
		got, err := d.request([]byte(tc.messages), []byte(tc.tools))
		if err != nil {
			got = "error: " + err.Error()
		}
		if got != want {
			t.Errorf("%s: %q, want %q", tc.name, got, want)
		}
	}
}

// digestedAtC61e6c7 is what digestRequest of c61e6c7 returned for each
// case (or "error: " and its error).
var digestedAtC61e6c7 = map[string]string{
	"tool arguments, escaped quotes":       "4377033fc31b1bb10a8def1357ec071fc3e6d41e267df77f1ae52c6ecb716d98",
	"escapes":                              "be3521f2cf44df2746febb46446121ce863a035894189e63237af11618f134b6",
	"unicode escapes":                      "d3d7f4efd9b3f96007d33a35acfcb1fdd1c5e4647407ea0ac6f024780326722d",
	"surrogate pair":                       "874c727115da3772cfef46d7325599dde3f0f1d794d39869495fce1457f0410e",
	"raw UTF-8":                            "f9cf39a0d82e29e99a658d98ff642757a2a6c4ade65c4cff01f65b7525dfae49",
	"HTML characters":                      "9d44dfe9ffe6cc06a644925f1c0ad580465081b4f911740cc1716244e9cf4384",
	"line and paragraph separators":        "ae2cdc176c5c1eed65172a8b8b9809d14707a88611de4fbac538121acecbe5f6",
	"control characters":                   "ea0e88a9cb78d64b5a740753622fd9e5cd6ebd8bd46ea22f18410167b47b56b0",
	"DEL":                                  "8bd72a3d1bca9a7cbf129b0daff0c9c185fa6223721b38d26dd07e0db8acc0e3",
	"duplicate keys":                       "1153b0e6e31205942e526b0a00fcd881ffbd9b3919123ff4bffddf8124a1261b",
	"duplicate keys, object values":        "7af093039e1889bb8fe465fc6ff11f8771f2bd190e4e23539b8b8167b03a0598",
	"duplicate keys, equal when decoded":   "7ee3713ee23c638c49afe557aa11d46bff6d971f0b7e76b2fbec3b7aa871de2b",
	"keys sorted as decoded":               "41eb47150751edbee0759a97b4b6100b132b40abfa367468419f493b3c26557d",
	"keys with escapes":                    "5da4101cf42c9e18d05fa61792cc34ab0b343d18001a2020ff8414c7d1ef51b0",
	"nested":                               "c0752a557a80cb5c56ab08aea794e99138894e1584bfd8ef536d5ee0f6e8e044",
	"numbers":                              "1af9de3ba8433089044624504fd3b4c2d93e109264a597d1920e13a666340db9",
	"numbers in tools":                     "2dac5e865d8ba249949f695eab33704e710f5cbbcefdd4b95dfcf4f710415930",
	"literals":                             "cc13496e1a4b9962bb91029108cef706775a29bff66d421de26b0747d99c14df",
	"empty objects and arrays":             "9dd4c316842a9971d7eada2da91b4a2849d3fc208296d7f7cc3907daad9eda0f",
	"white space":                          "1e310e19a25fc41952488207bc9bcf225892990936f3dfe0e95bef6e265c62a1",
	"no tools":                             "3e0b223a647b6e8aa26c5247af4492c075651216920ea8b9c3d957f8ce10d340",
	"tools white space":                    "3e0b223a647b6e8aa26c5247af4492c075651216920ea8b9c3d957f8ce10d340",
	"tools empty array":                    "3e0b223a647b6e8aa26c5247af4492c075651216920ea8b9c3d957f8ce10d340",
	"tools empty array, white space":       "3e0b223a647b6e8aa26c5247af4492c075651216920ea8b9c3d957f8ce10d340",
	"tools null":                           "3e0b223a647b6e8aa26c5247af4492c075651216920ea8b9c3d957f8ce10d340",
	"tools empty object":                   "bf22c1ff4938a51a90ce74654ad1b50b17b8a8002530d207de2e48a28bbc23e3",
	"messages empty":                       "958013b188d28da64c5011b03e164257cc549d56833dfd671703394638bbbbb2",
	"messages null":                        "8f5b46aa51c417c505e29c6cf2e0a41d812ed68951b3485310c1a3c9961fde99",
	"messages not an array":                "bb9b0105f359599d17e5bf2f5a0eb38ea1d8ed63356306021cbea5ac097807af",
	"top-level number":                     "6325782ff079c6752c3e9ffcb43ee32e61bb264b69a9fa4d7eb3650238c99752",
	"unicode white space only":             "958013b188d28da64c5011b03e164257cc549d56833dfd671703394638bbbbb2",
	"trailing value":                       "3e0b223a647b6e8aa26c5247af4492c075651216920ea8b9c3d957f8ce10d340",
	"trailing garbage after an array":      "8c68407f5c3c4122cbb8cadb75f42d416a29f299e2188696cb926f37937bf34e",
	"trailing garbage after a number":      "2478b08508c931f5cd252a4d6403c4de1e1ff4624c5491d083af98c9a31d830f",
	"trailing garbage in tools":            "3e0b223a647b6e8aa26c5247af4492c075651216920ea8b9c3d957f8ce10d340",
	"invalid UTF-8 in a string":            "3702ddec76cdd25f23f6782174da932d31edb72ec88c9b149f85355ab96db575",
	"invalid UTF-8 in a key":               "adf5abc86fa8231035b681aa4129926310bdfb5e2614da1038c5735271de43ad",
	"truncated UTF-8":                      "040857e3164edc6f021950308f03120f9a75919319abc2d9121eb3a3c40ae9bd",
	"surrogate half as UTF-8":              "52ede95111fa507307dc575ed84dc4c25df564da4919579958a07f1e7649a120",
	"lone high surrogate":                  "2a6717a2f4bf77fb73e8330b1918680c41cf79b63e4d09268c1e34f4f03c0fb0",
	"lone low surrogate":                   "2a6717a2f4bf77fb73e8330b1918680c41cf79b63e4d09268c1e34f4f03c0fb0",
	"reversed surrogates":                  "040857e3164edc6f021950308f03120f9a75919319abc2d9121eb3a3c40ae9bd",
	"high surrogate then a letter":         "4b92b2ead706f3c3f01a7aeb760416bf27abd69e0e4567e02332b6ff554d1060",
	"lone surrogate in a key":              "5436a371a8c371c7c613766d9c67d2ed05b6f4cad2f4990ebf72606ac7dd0cb6",
	"escaped backslash before a surrogate": "97e01961de5f207b43db7883a041da1c5951cfe1019a17c40fc86a399fd94887",
	"invalid JSON":                         "error: invalid character ']' looking for beginning of value",
	"invalid JSON in tools":                "error: invalid character '}' looking for beginning of value",
	"unquoted key":                         "error: invalid character 'a' looking for beginning of object key string",
	"truncated":                            "error: unexpected EOF",
	"bad escape":                           "error: invalid character 'x' in string escape code",
	"short unicode escape":                 "error: invalid character '\"' in \\u hexadecimal character escape",
	"control character in a string":        "error: invalid character '\\x01' in string literal",
	"leading zero":                         "error: invalid character '1' after array element",
	"bare minus":                           "error: invalid character ']' in numeric literal",
	"vertical tab":                         "error: invalid character '\\v' looking for beginning of value",
	"byte order mark":                      "error: invalid character 'ï' looking for beginning of value",
	"nested too deep":                      "error: invalid character '[' exceeded max depth",
	"nested as deep as allowed":            "c0c0dcbf7ba6a0afe2f34ba83d780d5d5dc64499b6943742fe0598a477af4dd7",
}

func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// FuzzDigestRequest: for any messages and tools, the request digest is
// digestDecoded's, or both refuse them alike.
func FuzzDigestRequest(f *testing.F) {
	for _, tc := range digestCases {
		if len(tc.messages)+len(tc.tools) < 4096 {
			f.Add([]byte(tc.messages), []byte(tc.tools))
		}
	}
	var d requestDigests
	f.Fuzz(func(t *testing.T, messages, tools []byte) {
		want, werr := digestDecoded(messages, tools)
		got, gerr := d.request(messages, tools)
		if got != want || errorText(gerr) != errorText(werr) {
			t.Fatalf("messages %q tools %q: digest %q, %v; decoded %q, %v", messages, tools, got, gerr, want, werr)
		}
	})
}
