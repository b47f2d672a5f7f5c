package environment

import (
	"bytes"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// FuzzBoundaryAppendJSON: a boundary appends what codec.Marshal writes for
// it, and fails where codec.Marshal fails (a raw reply that is not JSON).
func FuzzBoundaryAppendJSON(f *testing.F) {
	f.Add("invoke_agent", "resources-session-1", "agent-session-1", "wait", "", []byte(nil), []byte(nil), []byte(nil))
	f.Add("verify", "r<&>", "a\"\\\u2028", "replay", `Counter___c=s1; X="a b"`, []byte(`{"output":[{"type":"message","content":"it is < 3 & > 1"}]}`), []byte(`{"steps": 2}`), []byte{})
	f.Add("return", "\xff", "", "", "\xff<&>", []byte(`{"reward":1.0}`), []byte(" [1, 2] "), []byte(`{"reward":1,"response":{"id":"x"}}`))
	f.Add("close_agent", "r", "a", "wait", "", []byte(`{`), []byte(`null`), []byte(`"\u2028"`))
	f.Fuzz(func(t *testing.T, next, rs, as, mode, cookies string, resp, obs, result []byte) {
		b := Boundary{Next: Stage(next), Handles: Handles{ResourcesSessionID: rs, AgentSessionID: as, ResourcesVerify: Mode(mode), ResourcesCookies: cookies, AgentInstance: cookies},
			Response: resp, Observations: obs, Result: result}
		want, werr := codec.Marshal(b)
		got, gerr := b.AppendJSON([]byte("prefix:"))
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("%+v: AppendJSON error %v, codec.Marshal error %v", b, gerr, werr)
		}
		if werr != nil {
			return
		}
		if !bytes.Equal(got, append([]byte("prefix:"), want...)) {
			t.Fatalf("AppendJSON wrote\n%s\ncodec.Marshal writes\nprefix:%s", got, want)
		}
	})
}
