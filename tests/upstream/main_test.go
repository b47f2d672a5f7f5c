package upstream_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that closing every server leaves no goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
