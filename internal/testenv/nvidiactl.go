package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

const (
	nvidiactl     = "/dev/nvidiactl"
	nvidiactlRdev = 195<<8 | 255 // makedev(195, 255): major and minor below 256
)

// GuardNvidiactl covers a test that runs NVIDIA's nvmlInit or cuInit: as
// root, where /dev/nvidiactl is missing, either creates it (mknod c 195:255) and, where
// it is there, makes it root:root mode 0666, before failing with "Driver Not
// Loaded". The node is removed again if and only if it was not there
// before; one that was there gets its owner and mode back. A file lock keeps
// other test processes that do the same (the agent's) from seeing the node
// in between. The returned check, called after the library ran, does this at
// once and fails the test if it cannot; a cleanup does it again. Without
// root the library can change nothing in /dev, and nothing is guarded.
func GuardNvidiactl(t testing.TB) (check func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		return func() {}
	}
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "lanewatch-nvidiactl.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		lock.Close()
		t.Fatal(err)
	}
	before, err := os.Lstat(nvidiactl)
	existed := err == nil
	restore := func() error {
		fi, err := os.Lstat(nvidiactl)
		if err != nil {
			if existed {
				return fmt.Errorf("%s was there before and is gone: %v", nvidiactl, err)
			}
			return nil
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if fi.Mode()&os.ModeCharDevice == 0 || !ok || st.Rdev != nvidiactlRdev {
			return fmt.Errorf("%s is not the character device 195:255 (%v): left alone", nvidiactl, fi.Mode())
		}
		if !existed {
			t.Logf("NVIDIA's library created %s (char 195:255, %v, uid %d); removed, as it was not there before", nvidiactl, fi.Mode().Perm(), st.Uid)
			return os.Remove(nvidiactl)
		}
		was := before.Sys().(*syscall.Stat_t)
		if fi.Mode() != before.Mode() || st.Uid != was.Uid || st.Gid != was.Gid {
			t.Logf("NVIDIA's library changed %s to %v %d:%d; put back to %v %d:%d", nvidiactl, fi.Mode().Perm(), st.Uid, st.Gid, before.Mode().Perm(), was.Uid, was.Gid)
			if err := os.Lchown(nvidiactl, int(was.Uid), int(was.Gid)); err != nil {
				return err
			}
			return os.Chmod(nvidiactl, before.Mode().Perm())
		}
		return nil
	}
	t.Cleanup(func() {
		defer lock.Close() // and with it the lock
		if err := restore(); err != nil {
			t.Error(err)
		}
	})
	return func() {
		t.Helper()
		if err := restore(); err != nil {
			t.Error(err)
		}
		if _, err := os.Lstat(nvidiactl); (err == nil) != existed {
			t.Errorf("%s: there before %v, now %v", nvidiactl, existed, err == nil)
		}
	}
}
