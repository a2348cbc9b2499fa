package redfishtest

import (
	"encoding/json"
	"net/http"
	"path"
)

// Virtual media, shaped after the VirtualMedia schema and DMTF's public
// mockups: the manager has one CD slot (Managers/1/VirtualMedia/CD1) with
// the InsertMedia and EjectMedia actions. InsertMedia really GETs the
// Image URL (Fetches records it) and refuses one it cannot fetch; a slot
// already holding media refuses another until ejected, as many BMCs do.

const (
	virtualMediaURI = "/redfish/v1/Managers/1/VirtualMedia"
	cdURI           = "/redfish/v1/Managers/1/VirtualMedia/CD1"
	insertMediaURI  = cdURI + "/Actions/VirtualMedia.InsertMedia"
	ejectMediaURI   = cdURI + "/Actions/VirtualMedia.EjectMedia"
)

type mediaState struct {
	image    string
	inserted bool
	fetches  []Fetch
}

func newMedia() mediaState { return mediaState{} }

// Media returns the CD slot's image URL and whether media is inserted.
func (s *Server) Media() (image string, inserted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.media.image, s.media.inserted
}

// serveMedia answers the virtual media collection, the CD slot and its
// actions; false for other paths.
func (s *Server) serveMedia(w http.ResponseWriter, r *http.Request, p string) bool {
	switch {
	case p == virtualMediaURI && r.Method == http.MethodGet:
		writeJSON(w, 200, collection(virtualMediaURI, "#VirtualMediaCollection.VirtualMediaCollection", cdURI))
	case p == cdURI && r.Method == http.MethodGet:
		s.mu.Lock()
		m := s.media
		s.mu.Unlock()
		name := ""
		if m.image != "" {
			name = path.Base(m.image)
		}
		writeJSON(w, 200, map[string]any{"@odata.id": cdURI, "@odata.type": "#VirtualMedia.v1_3_0.VirtualMedia", "Id": "CD1",
			"Name": "Virtual CD", "MediaTypes": []string{"CD", "DVD"}, "Image": m.image, "ImageName": name, "Inserted": m.inserted,
			"WriteProtected": true, "ConnectedVia": map[bool]string{true: "URI", false: "NotConnected"}[m.inserted],
			"TransferProtocolType": "HTTP",
			"Actions": map[string]any{
				"#VirtualMedia.InsertMedia": map[string]string{"target": insertMediaURI},
				"#VirtualMedia.EjectMedia":  map[string]string{"target": ejectMediaURI},
			}})
	case p == insertMediaURI && r.Method == http.MethodPost:
		var body struct {
			Image          string
			Inserted       *bool
			WriteProtected *bool
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Image == "" {
			redfishError(w, 400, "InsertMedia wants an Image")
			return true
		}
		s.mu.Lock()
		busy := s.media.inserted
		s.mu.Unlock()
		if busy {
			redfishError(w, 409, "Media is already inserted in CD1: eject it first")
			return true
		}
		_, f := download(body.Image, 1<<30)
		s.mu.Lock()
		s.media.fetches = append(s.media.fetches, f)
		if f.Err == "" {
			s.media.image, s.media.inserted = body.Image, body.Inserted == nil || *body.Inserted
		}
		s.mu.Unlock()
		if f.Err != "" {
			redfishError(w, 400, "The image at "+body.Image+" could not be fetched: "+f.Err)
			return true
		}
		w.WriteHeader(http.StatusNoContent)
	case p == ejectMediaURI && r.Method == http.MethodPost:
		s.mu.Lock()
		s.media.image, s.media.inserted = "", false
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	default:
		return false
	}
	return true
}
