//go:build unix

package pipeline

import (
	"path/filepath"
	"testing"
	"time"
)

// TestProfileLockExcludes: the profile's lock is a flock per open file, so
// a second open (another process's, or this one's) cannot take it while
// the first holds it, and can once it is released. With no wait allowed,
// the second attempt fails at once instead of merging beside the first.
func TestProfileLockExcludes(t *testing.T) {
	defer func(d time.Duration) { profileLockWait = d }(profileLockWait)
	profileLockWait = 0
	path := filepath.Join(t.TempDir(), "experts-x.json.lock")
	unlock, err := lockProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	if u2, err := lockProfile(path); err == nil {
		u2()
		t.Fatal("a second lock taken while the first is held")
	}
	unlock()
	u3, err := lockProfile(path)
	if err != nil {
		t.Fatalf("the lock after its release: %v", err)
	}
	u3()
}
