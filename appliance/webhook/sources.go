package webhook

// The sources of events: what the dispatcher's one store watch turns into
// webhook events (machine state changes and BMC health, node readiness,
// audit records).

import (
	"encoding/json"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// machineFollower turns machine records into state changes and BMC
// health conditions, in each machine's order.
type machineFollower struct {
	d      *Dispatcher
	state  map[string]string
	health map[string]string
	// unreachable: the machine's power state reads UNKNOWN (its BMC did
	// not answer the last poll).
	unreachable map[string]bool
}

func (m *machineFollower) seed(kvs []store.KV) {
	for _, kv := range kvs {
		mc := &inventoryv1.Machine{}
		if record.Unmarshal(kv.Value, mc) == nil {
			name := strings.TrimPrefix(kv.Key, store.MachinesPrefix)
			m.state[name] = mc.GetState().String()
			m.health[name] = mc.GetBmc().GetHealth().GetStatus()
			m.unreachable[name] = mc.GetPowerState() == inventoryv1.PowerState_POWER_STATE_UNKNOWN
		}
	}
}

func (m *machineFollower) handle(ev store.Event) {
	name := strings.TrimPrefix(ev.KV.Key, store.MachinesPrefix)
	prev, known := m.state[name]
	if ev.Type == store.EventDelete {
		delete(m.state, name)
		delete(m.health, name)
		delete(m.unreachable, name)
		m.d.publish(&Event{ID: EventID(ClassMachineState, ev.KV.Key, ev.KV.Revision), Class: ClassMachineState, Type: TypeMachineState,
			Subject: "machine/" + name, Time: time.Now(), Data: jsonData(map[string]any{"machine": name, "state": "DELETED", "previous_state": prev, "store_revision": ev.KV.Revision})})
		return
	}
	mc := &inventoryv1.Machine{}
	if err := record.Unmarshal(ev.KV.Value, mc); err != nil {
		return
	}
	st := mc.GetState().String()
	m.state[name] = st
	if !known || prev != st {
		data := map[string]any{"machine": name, "state": st, "previous_state": prev, "reason": mc.GetStateReason(),
			"power_state": mc.GetPowerState().String(), "store_revision": ev.KV.Revision}
		m.d.publish(&Event{ID: EventID(ClassMachineState, ev.KV.Key, ev.KV.Revision), Class: ClassMachineState, Type: TypeMachineState,
			Subject: "machine/" + name, Time: time.Now(), Data: jsonData(data)})
	}
	if un, was := mc.GetPowerState() == inventoryv1.PowerState_POWER_STATE_UNKNOWN, m.unreachable[name]; un != was {
		m.unreachable[name] = un
		cond := "bmc_reachable"
		if un {
			cond = "bmc_unreachable"
		}
		data := map[string]any{"condition": cond, "machine": name, "power_state": mc.GetPowerState().String(), "store_revision": ev.KV.Revision}
		m.d.publish(&Event{ID: EventID(ClassHealth+".bmc", ev.KV.Key, ev.KV.Revision), Class: ClassHealth, Type: TypeHealth,
			Subject: "machine/" + name, Time: time.Now(), Data: jsonData(data)})
	}
	h := mc.GetBmc().GetHealth().GetStatus()
	if ph := m.health[name]; h != ph {
		m.health[name] = h
		if h != "" || ph != "" {
			data := map[string]any{"condition": "bmc_health", "machine": name, "status": h, "previous_status": ph,
				"log_critical": mc.GetBmc().GetHealth().GetLogCritical(), "store_revision": ev.KV.Revision}
			m.d.publish(&Event{ID: EventID(ClassHealth, ev.KV.Key, ev.KV.Revision), Class: ClassHealth, Type: TypeHealth,
				Subject: "machine/" + name, Time: time.Now(), Data: jsonData(data)})
		}
	}
}

// nodeFollower turns node records into READY / NOT_READY conditions.
type nodeFollower struct {
	d     *Dispatcher
	state map[string]string
}

func (n *nodeFollower) seed(kvs []store.KV) {
	for _, kv := range kvs {
		nd := &poolv1.Node{}
		if record.Unmarshal(kv.Value, nd) == nil {
			n.state[strings.TrimPrefix(kv.Key, store.NodesPrefix)] = nd.GetState().String()
		}
	}
}

func (n *nodeFollower) handle(ev store.Event) {
	name := strings.TrimPrefix(ev.KV.Key, store.NodesPrefix)
	prev := n.state[name]
	st := "DELETED"
	if ev.Type == store.EventPut {
		nd := &poolv1.Node{}
		if err := record.Unmarshal(ev.KV.Value, nd); err != nil {
			return
		}
		st = nd.GetState().String()
		n.state[name] = st
	} else {
		delete(n.state, name)
	}
	if st == prev {
		return
	}
	data := map[string]any{"condition": "node_state", "node": name, "state": st, "previous_state": prev, "store_revision": ev.KV.Revision}
	n.d.publish(&Event{ID: EventID(ClassHealth, ev.KV.Key, ev.KV.Revision), Class: ClassHealth, Type: TypeHealth,
		Subject: "node/" + name, Time: time.Now(), Data: jsonData(data)})
}

// auditEvent exports each new audit record.
func (d *Dispatcher) auditEvent(ev store.Event) {
	if ev.Type != store.EventPut {
		return
	}
	a := &auditv1.AuditEvent{}
	if err := record.Unmarshal(ev.KV.Value, a); err != nil {
		return
	}
	data, err := protojson.Marshal(a)
	if err != nil {
		return
	}
	// The audit record is written once under its own key: the key alone
	// identifies it.
	at := time.Now()
	if a.GetAt() != nil {
		at = a.GetAt().AsTime()
	}
	d.publish(&Event{ID: EventID(ClassAudit, ev.KV.Key, 0), Class: ClassAudit, Type: TypeAudit, Subject: a.GetObject(),
		Time: at, Data: data})
}

func jsonData(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}
