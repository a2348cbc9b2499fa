package webhook

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"
)

// Event classes a receiver subscribes to.
const (
	ClassMachineState = "machine.state"
	ClassAudit        = "audit"
	ClassHealth       = "health"
)

// Classes are the event classes, in the order `corral webhook add
// --events` names them.
var Classes = []string{ClassMachineState, ClassAudit, ClassHealth}

// CloudEvent types, one per class.
const (
	TypeMachineState = "io.corral.machine.state_changed"
	TypeAudit        = "io.corral.audit.event"
	TypeHealth       = "io.corral.health.condition"
)

// ContentType is the structured-mode CloudEvents media type.
const ContentType = "application/cloudevents+json"

// Event is one event to export. Its ID is derived from what it reports
// (the store key and the revision of the change), so the same change
// always gets the same ID: on every retry and when another appliance of a
// fleet sends it again after taking over.
type Event struct {
	ID      string
	Class   string
	Type    string
	Subject string
	Time    time.Time
	// Data is the event's JSON payload.
	Data json.RawMessage
	// body is the encoded envelope (set once, by Encode).
	body []byte
	// queued is when the dispatcher produced it (delivery latency).
	queued time.Time
	// rev is the store revision of the change it reports (the cursor).
	rev int64
}

// EventID is the ID of the change at key at store revision rev.
func EventID(class, key string, rev int64) string {
	h := sha256.New()
	h.Write([]byte(class))
	h.Write([]byte{0})
	h.Write([]byte(key))
	var b [8]byte
	for i := range 8 {
		b[i] = byte(rev >> (8 * i))
	}
	h.Write(b[:])
	return "evt_" + hex.EncodeToString(h.Sum(nil)[:16])
}

// envelope is the structured-mode CloudEvents 1.0 JSON object.
type envelope struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject,omitempty"`
	Time            string          `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	Data            json.RawMessage `json:"data"`
}

// Encode returns e as a CloudEvents 1.0 structured-mode JSON document
// (specversion, id, source, type, subject, time in RFC 3339 UTC,
// datacontenttype application/json, data).
func Encode(e *Event, source string) ([]byte, error) {
	data := e.Data
	if len(data) == 0 {
		data = json.RawMessage("{}")
	}
	return json.Marshal(envelope{SpecVersion: "1.0", ID: e.ID, Source: source, Type: e.Type, Subject: e.Subject,
		Time: e.Time.UTC().Format(time.RFC3339Nano), DataContentType: "application/json", Data: data})
}
