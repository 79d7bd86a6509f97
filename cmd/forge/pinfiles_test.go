package main

import (
	"strings"
	"testing"
)

// TestPinFilesFlag: auto pins nothing for a server of one model, a quarter
// of the host's memory otherwise; sizes and 0 are taken as given; anything
// else is refused naming the flag.
func TestPinFilesFlag(t *testing.T) {
	quarter := hostMemory() / 4
	for _, tc := range []struct {
		s      string
		models int
		want   int64
	}{
		{"auto", 1, 0},
		{"auto", 2, quarter},
		{"auto", 0, quarter},
		{"0", 2, 0},
		{"1GiB", 1, 1 << 30},
	} {
		got, err := pinFilesFlag(tc.s, tc.models)
		if err != nil || got != tc.want {
			t.Errorf("--pin-files %s with %d models: %d, %v; want %d", tc.s, tc.models, got, err, tc.want)
		}
	}
	if _, err := pinFilesFlag("lots", 2); err == nil || !strings.Contains(err.Error(), "--pin-files") {
		t.Errorf("a bad size: %v", err)
	}
}
