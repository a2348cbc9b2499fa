// Package namelock serialises the node agent's operations per name (one
// VM, one volume) while different names proceed in parallel. It is an
// in-process guard, right only because the node agent is the one writer
// of its data directory. It imports only the standard library.
package namelock

import "sync"

// Table is a set of per-name mutexes. The zero value is ready to use; a
// Table must not be copied after first use. It is safe for concurrent use.
// Entries live only while a name is held or awaited, so the table does not
// grow with every name ever locked.
type Table struct {
	mu sync.Mutex
	m  map[string]*entry
}

type entry struct {
	mu   sync.Mutex
	refs int // holders and waiters
}

// Lock blocks until name is free, then holds it and returns the function
// that releases it; call that function exactly once.
func (t *Table) Lock(name string) (unlock func()) {
	t.mu.Lock()
	if t.m == nil {
		t.m = map[string]*entry{}
	}
	e := t.m[name]
	if e == nil {
		e = &entry{}
		t.m[name] = e
	}
	e.refs++
	t.mu.Unlock()

	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		t.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(t.m, name)
		}
		t.mu.Unlock()
	}
}
