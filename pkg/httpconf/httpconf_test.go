package httpconf

import "testing"

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero value is lean without TLS", Config{}, true},
		{"nethttp", Config{Stack: StackNetHTTP}, true},
		{"unknown stack", Config{Stack: "quic"}, false},
		{"cert without key", Config{TLS: TLS{CertFile: "c.pem"}}, false},
		{"key without cert", Config{TLS: TLS{KeyFile: "k.pem"}}, false},
		{"cert and key", Config{TLS: TLS{CertFile: "c.pem", KeyFile: "k.pem"}}, true},
		{"CA only (a client)", Config{TLS: TLS{CAFile: "ca.pem"}}, true},
	} {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
	if got := (Config{}).EffectiveStack(); got != StackLean {
		t.Errorf("default stack = %q, want lean", got)
	}
}
