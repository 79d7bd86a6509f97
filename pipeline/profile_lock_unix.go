//go:build unix

package pipeline

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// profileLockWait (a variable for tests) bounds how long a model's Close waits for another
// process's profile write (a merge of a few KB takes milliseconds).
var profileLockWait = 10 * time.Second

// lockProfile takes an exclusive flock on the file at path (made if new)
// and returns its release. flock is per open file, so it serialises two
// opens in one process as well as two processes, and the kernel drops it
// when a process dies: no stale lock. The file is left in place (removing
// it would let a third writer lock a new file beside a held one).
func lockProfile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(profileLockWait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("locking %s: still held by another writer after %v", path, profileLockWait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
