package audit

import (
	"context"
	"testing"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/store/mem"
)

// TestNote: a step of a long call (a console's attach) is an event of its
// own, on the machine, with the caller the auth interceptor found and the
// caller's fixed words.
func TestNote(t *testing.T) {
	a := newTestAudit(t, mem.New(), Config{})
	a.run(t)
	ctx := auth.NewContext(context.Background(), auth.Principal{Role: authv1.Role_ROLE_OPERATOR, ID: "tok1", Subject: "ops"})
	a.Note(ctx, "/corral.console.v1.ConsoleService/Attach", "m-1\x1b[2J", "console attach write")
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	evs, _, err := a.listPage(context.Background(), &auditv1.ListEventsRequest{PageSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 {
		t.Fatalf("%d events, want 1", len(evs))
	}
	e := evs[0]
	if e.GetAction() != "console attach write" || e.GetWho() != "token:tok1 (ops)" || e.GetCode() != "OK" ||
		e.GetMethod() != "/corral.console.v1.ConsoleService/Attach" || e.GetObject() != "machine/m-1\\x1b[2J" || e.GetMachine() != "m-1\\x1b[2J" {
		t.Fatalf("event %v", e)
	}
}

// TestNoteVM: a VM console's step is an event on the virtual machine
// (the object VirtualMachineService's calls record), on no machine.
func TestNoteVM(t *testing.T) {
	a := newTestAudit(t, mem.New(), Config{})
	a.run(t)
	ctx := auth.NewContext(context.Background(), auth.Principal{Role: authv1.Role_ROLE_OPERATOR, ID: "tok1", Subject: "ops"})
	a.NoteVM(ctx, "/corral.console.v1.ConsoleService/Attach", "web\x1b[2J", "console detach")
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	evs, _, err := a.listPage(context.Background(), &auditv1.ListEventsRequest{PageSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 {
		t.Fatalf("%d events, want 1", len(evs))
	}
	if e := evs[0]; e.GetAction() != "console detach" || e.GetWho() != "token:tok1 (ops)" || e.GetObject() != "virtualmachine/web\\x1b[2J" || e.GetMachine() != "" {
		t.Fatalf("event %v", e)
	}
}
