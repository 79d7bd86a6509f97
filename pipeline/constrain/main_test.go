package constrain

import (
	"testing"

	"go.uber.org/goleak"
)

// A Matcher's background walks end with it (Close waits for them).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
