package redfishtest

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The UpdateService, shaped after the UpdateService, SoftwareInventory
// and Task schemas and DMTF's public mockups: FirmwareInventory lists
// the BMC's and the BIOS's firmware; the SimpleUpdate action takes an
// ImageURI (and optional Targets), answers 202 Accepted with the Task
// that carries it out (Location names it), and the task, in the
// background, really downloads the image over HTTP (Fetches records
// what it got), checks it is a firmware package for a component, and
// ends Completed (the component's Version is the package's) or
// Exception (a message says why).
//
// A firmware package, here, is text: its first line is
// "CORRAL-FIRMWARE <component Id> <version>"; anything may follow.

const (
	updateServiceURI = "/redfish/v1/UpdateService"
	fwInventoryURI   = "/redfish/v1/UpdateService/FirmwareInventory"
	simpleUpdateURI  = "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate"
	taskServiceURI   = "/redfish/v1/TaskService"
	tasksURI         = "/redfish/v1/TaskService/Tasks"
)

// FirmwarePackage makes a package the test server accepts for component
// (BMC or BIOS) at version, padded with size bytes.
func FirmwarePackage(component, version string, size int) []byte {
	return append([]byte("CORRAL-FIRMWARE "+component+" "+version+"\n"), bytes.Repeat([]byte{0x5a}, size)...)
}

// Fetch is one download the service made of an ImageURI or a virtual
// media Image.
type Fetch struct {
	URI    string
	Bytes  int64
	SHA256 string
	Err    string
}

type firmwareItem struct {
	ID, Name, Version string
	Updateable        bool
}

type task struct {
	ID       string
	State    string // New, Running, Completed, Exception
	Status   string // OK, Warning, Critical
	Percent  int
	Messages []string
	Start    time.Time
	End      time.Time
}

type firmwareState struct {
	items   []firmwareItem
	tasks   []*task
	fetches []Fetch
	updates []map[string]any
	// step is the time between a task's progress steps.
	step time.Duration
}

func newFirmware() firmwareState {
	return firmwareState{items: []firmwareItem{
		{ID: "BMC", Name: "BMC Firmware", Version: "1.00", Updateable: true},
		{ID: "BIOS", Name: "System BIOS", Version: "2.1.0", Updateable: true},
		{ID: "CPLD", Name: "CPLD", Version: "0.9", Updateable: false},
	}, step: 20 * time.Millisecond}
}

// Firmware returns each component's version by Id.
func (s *Server) Firmware() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for _, it := range s.firmware.items {
		out[it.ID] = it.Version
	}
	return out
}

// Fetches returns every download the service made (update images and
// virtual media), in order.
func (s *Server) Fetches() []Fetch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append(slices.Clone(s.firmware.fetches), s.media.fetches...)
}

// SimpleUpdates returns the bodies of the SimpleUpdate actions received.
func (s *Server) SimpleUpdates() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.firmware.updates)
}

// download GETs uri (plain HTTP, as a BMC fetches an ImageURI), at most
// max bytes, and records it.
func download(uri string, limit int64) ([]byte, Fetch) {
	f := Fetch{URI: uri}
	hc := &http.Client{Timeout: 30 * time.Second}
	resp, err := hc.Get(uri)
	if err != nil {
		f.Err = err.Error()
		return nil, f
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		f.Err = "HTTP " + resp.Status
		return nil, f
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		f.Err = err.Error()
	}
	sum := sha256.Sum256(b)
	f.Bytes, f.SHA256 = int64(len(b)), hex.EncodeToString(sum[:])
	return b, f
}

func (s *Server) taskJSON(t *task) map[string]any {
	msgs := []map[string]any{}
	for _, m := range t.Messages {
		msgs = append(msgs, map[string]any{"MessageId": "Update.1.0.UpdateInProgress", "Message": m})
	}
	if t.State == "Exception" && len(msgs) > 0 {
		msgs[len(msgs)-1]["MessageId"] = "Update.1.0.ApplyFailed"
	}
	body := map[string]any{"@odata.id": tasksURI + "/" + t.ID, "@odata.type": "#Task.v1_4_3.Task", "Id": t.ID, "Name": "Firmware update task",
		"TaskState": t.State, "TaskStatus": t.Status, "PercentComplete": t.Percent, "Messages": msgs,
		"StartTime": t.Start.UTC().Format(time.RFC3339)}
	if !t.End.IsZero() {
		body["EndTime"] = t.End.UTC().Format(time.RFC3339)
	}
	return body
}

// runUpdate carries out one SimpleUpdate as its task.
func (s *Server) runUpdate(t *task, uri string, targets []string) {
	set := func(f func()) {
		s.mu.Lock()
		f()
		s.mu.Unlock()
	}
	fail := func(msg string) {
		set(func() {
			t.State, t.Status, t.End, t.Messages = "Exception", "Critical", time.Now(), append(t.Messages, msg)
		})
	}
	set(func() { t.State, t.Percent, t.Messages = "Running", 5, append(t.Messages, "Downloading "+uri) })
	b, f := download(uri, 256<<20)
	s.mu.Lock()
	s.firmware.fetches = append(s.firmware.fetches, f)
	step := s.firmware.step
	s.mu.Unlock()
	if f.Err != "" {
		fail("The image at " + uri + " could not be fetched: " + f.Err)
		return
	}
	line, _, _ := bufio.NewReader(bytes.NewReader(b)).ReadLine()
	fields := strings.Fields(string(line))
	if len(fields) != 3 || fields[0] != "CORRAL-FIRMWARE" {
		fail(fmt.Sprintf("The image (%d bytes, sha256 %s) is not a firmware package this BMC accepts.", f.Bytes, f.SHA256))
		return
	}
	component, version := fields[1], fields[2]
	s.mu.Lock()
	i := slices.IndexFunc(s.firmware.items, func(it firmwareItem) bool { return it.ID == component })
	s.mu.Unlock()
	if i < 0 {
		fail("The image is for component " + component + ", which this system does not have.")
		return
	}
	if len(targets) > 0 && !slices.Contains(targets, fwInventoryURI+"/"+component) {
		fail("The image is for " + fwInventoryURI + "/" + component + ", not among the Targets.")
		return
	}
	for p := 25; p < 100; p += 25 {
		time.Sleep(step)
		set(func() {
			t.Percent = p
			t.Messages = append(t.Messages, fmt.Sprintf("Applying %s %s: %d%%", component, version, p))
		})
	}
	set(func() {
		if !s.firmware.items[i].Updateable {
			t.State, t.Status, t.End = "Exception", "Critical", time.Now()
			t.Messages = append(t.Messages, "Component "+component+" is not updateable.")
			return
		}
		s.firmware.items[i].Version = version
		t.State, t.Status, t.Percent, t.End = "Completed", "OK", 100, time.Now()
		t.Messages = append(t.Messages, "The update of "+component+" to "+version+" completed.")
	})
}

// serveFirmware answers the UpdateService, its inventory and action, and
// the TaskService; false for other paths.
func (s *Server) serveFirmware(w http.ResponseWriter, r *http.Request, path string) bool {
	get := r.Method == http.MethodGet
	switch {
	case path == updateServiceURI && get:
		writeJSON(w, 200, map[string]any{"@odata.id": updateServiceURI, "@odata.type": "#UpdateService.v1_8_0.UpdateService",
			"Id": "UpdateService", "Name": "Update Service", "ServiceEnabled": true, "Status": status(""),
			"FirmwareInventory": map[string]string{"@odata.id": fwInventoryURI},
			"Actions": map[string]any{"#UpdateService.SimpleUpdate": map[string]any{"target": simpleUpdateURI,
				"TransferProtocol@Redfish.AllowableValues": []string{"HTTP", "HTTPS"}}}})
	case path == fwInventoryURI && get:
		s.mu.Lock()
		var ids []string
		for _, it := range s.firmware.items {
			ids = append(ids, fwInventoryURI+"/"+it.ID)
		}
		s.mu.Unlock()
		writeJSON(w, 200, collection(fwInventoryURI, "#SoftwareInventoryCollection.SoftwareInventoryCollection", ids...))
	case strings.HasPrefix(path, fwInventoryURI+"/") && get:
		s.mu.Lock()
		i := slices.IndexFunc(s.firmware.items, func(it firmwareItem) bool { return fwInventoryURI+"/"+it.ID == path })
		var it firmwareItem
		if i >= 0 {
			it = s.firmware.items[i]
		}
		s.mu.Unlock()
		if i < 0 {
			return false
		}
		writeJSON(w, 200, map[string]any{"@odata.id": path, "@odata.type": "#SoftwareInventory.v1_3_0.SoftwareInventory", "Id": it.ID,
			"Name": it.Name, "Version": it.Version, "Updateable": it.Updateable, "SoftwareId": "corral-" + strings.ToLower(it.ID), "Status": status("")})
	case path == simpleUpdateURI && r.Method == http.MethodPost:
		var raw map[string]any
		if err := json.NewDecoder(r.Body).Decode(&raw); err != nil {
			redfishError(w, 400, "malformed JSON")
			return true
		}
		var body struct {
			ImageURI         string
			Targets          []string
			TransferProtocol string
		}
		b, _ := json.Marshal(raw)
		_ = json.Unmarshal(b, &body)
		s.mu.Lock()
		s.firmware.updates = append(s.firmware.updates, raw)
		s.mu.Unlock()
		if !strings.HasPrefix(body.ImageURI, "http://") && !strings.HasPrefix(body.ImageURI, "https://") {
			writeJSON(w, 400, map[string]any{"error": map[string]any{"code": "Base.1.8.ActionParameterValueFormatError",
				"message": fmt.Sprintf("The value %q for the parameter ImageURI in the action SimpleUpdate is of a different format than the parameter can accept.", body.ImageURI)}})
			return true
		}
		s.mu.Lock()
		t := &task{ID: strconv.Itoa(len(s.firmware.tasks) + 1), State: "New", Status: "OK", Start: time.Now()}
		s.firmware.tasks = append(s.firmware.tasks, t)
		js := s.taskJSON(t)
		s.mu.Unlock()
		go s.runUpdate(t, body.ImageURI, body.Targets)
		w.Header().Set("Location", tasksURI+"/"+t.ID)
		writeJSON(w, http.StatusAccepted, js)
	case path == taskServiceURI && get:
		writeJSON(w, 200, map[string]any{"@odata.id": taskServiceURI, "@odata.type": "#TaskService.v1_1_4.TaskService", "Id": "TaskService",
			"Name": "Task Service", "ServiceEnabled": true, "CompletedTaskOverWritePolicy": "Oldest", "Status": status(""),
			"Tasks": map[string]string{"@odata.id": tasksURI}})
	case path == tasksURI && get:
		s.mu.Lock()
		var ids []string
		for _, t := range s.firmware.tasks {
			ids = append(ids, tasksURI+"/"+t.ID)
		}
		s.mu.Unlock()
		writeJSON(w, 200, collection(tasksURI, "#TaskCollection.TaskCollection", ids...))
	case strings.HasPrefix(path, tasksURI+"/") && get:
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, t := range s.firmware.tasks {
			if path == tasksURI+"/"+t.ID {
				writeJSON(w, 200, s.taskJSON(t))
				return true
			}
		}
		return false
	default:
		return false
	}
	return true
}
