package lifecycle

import (
	"fmt"
	"testing"
	"time"
)

// TestSeenTableBounded: the table of when each machine's last_seen was
// persisted never passes maxSeen, whatever number of machines register
// (each is a machine record, so bounded by the inventory's cap, but the
// table must not rely on that), and a full table forgets stale entries
// first.
func TestSeenTableBounded(t *testing.T) {
	s := &sessions{seen: map[string]time.Time{}}
	start := time.Unix(1_000_000, 0)
	for i := range maxSeen {
		s.noteSeenLocked(fmt.Sprint("old-", i), start)
	}
	later := start.Add(2 * seenEvery)
	if !s.seenDue("new-0", later) {
		t.Fatal("a machine never seen is not due")
	}
	if got := len(s.seen); got != 1 {
		t.Fatalf("after a full table of stale entries: %d entries, want 1 (the stale ones dropped)", got)
	}
	for i := range 2 * maxSeen {
		s.noteSeenLocked(fmt.Sprint("live-", i), later)
		if len(s.seen) > maxSeen {
			t.Fatalf("%d entries, more than %d", len(s.seen), maxSeen)
		}
	}
}
