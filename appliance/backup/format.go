package backup

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"time"

	"github.com/corralhq/corral/internal/apierr"
)

// The backup file is an age file (filippo.io/age, passphrase recipient:
// scrypt) whose plaintext is:
//
//	"corral-backup\n"                      magic
//	frame*                                 kind byte, uvarint length, payload
//
// with the frames in this order: one header ('H', JSON backupHeader), the
// files ('F': uvarint name length, name, content), the records ('R':
// uvarint key length, key, value bytes exactly as stored), and one end
// frame ('E', JSON backupEnd) repeating the counts. age authenticates
// every 64 KiB chunk and the last one, so a truncated or altered file
// fails to decrypt; the end frame and the counts catch a writer that
// stopped between frames.
const (
	backupMagic = "corral-backup\n"
	// Format is the version of the layout above.
	Format = 1
	// maxBackupFrame bounds one frame (a record or a file) when reading.
	maxBackupFrame = 64 << 20

	frameHeader = 'H'
	frameFile   = 'F'
	frameRecord = 'R'
	frameEnd    = 'E'
)

// Files a backup may hold, by their name in the backup; restore writes
// them to the same path under the data directory, and refuses any other
// name.
const (
	backupCACert = "pki/ca.crt"
	backupCAKey  = "pki/ca.key"
	// The boot CA (HTTPS boot) is kept too: machines' firmware has it
	// enrolled, and a new one would make every enrolment stale.
	backupBootCACert  = "pki/boot/ca.crt"
	backupBootCAKey   = "pki/boot/ca.key"
	backupSealKey     = "bmc-seal.key"
	backupClusterKey  = "cluster.key"
	backupAdminConf   = "admin.conf"
	backupImagesIndex = "images-manifest.json"
)

// backupFiles are the names above, with the mode restore gives each.
var backupFiles = map[string]uint32{
	backupCACert: 0o644, backupCAKey: 0o600, backupBootCACert: 0o644, backupBootCAKey: 0o600, backupSealKey: 0o600,
	backupClusterKey: 0o600, backupAdminConf: 0o600, backupImagesIndex: 0o644,
}

// Header opens a backup.
type Header struct {
	Format        int       `json:"format"`
	CorralVersion string    `json:"corral_version"`
	SchemaVersion uint32    `json:"schema_version"`
	Store         string    `json:"store"`
	StoreRevision int64     `json:"store_revision"`
	Records       int64     `json:"records"`
	Created       time.Time `json:"created"`
	Appliance     string    `json:"appliance"`
	Files         []string  `json:"files"`
}

// backupEnd closes a backup.
type backupEnd struct {
	Records     int64 `json:"records"`
	RecordBytes int64 `json:"record_bytes"`
	Files       int   `json:"files"`
}

// ImageManifestEntry is one artifact of the catalog as the backup lists it
// (the artifacts themselves are not in the backup).
type ImageManifestEntry struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// frameWriter writes frames to the plaintext stream.
type frameWriter struct {
	w   io.Writer
	buf [binary.MaxVarintLen64 + 1]byte
}

func (f *frameWriter) frame(kind byte, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	f.buf[0] = kind
	l := binary.PutUvarint(f.buf[1:], uint64(n))
	if _, err := f.w.Write(f.buf[:1+l]); err != nil {
		return err
	}
	for _, p := range parts {
		if _, err := f.w.Write(p); err != nil {
			return err
		}
	}
	return nil
}

func (f *frameWriter) json(kind byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return f.frame(kind, b)
}

// named writes a name-prefixed frame (a file or a record).
func (f *frameWriter) named(kind byte, name string, data []byte) error {
	l := binary.AppendUvarint(nil, uint64(len(name)))
	return f.frame(kind, l, []byte(name), data)
}

// frameReader reads frames from the decrypted stream.
type frameReader struct {
	r *bufio.Reader
}

func newFrameReader(r io.Reader) (*frameReader, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	magic := make([]byte, len(backupMagic))
	if _, err := io.ReadFull(br, magic); err != nil {
		return nil, unexpected(err)
	}
	if string(magic) != backupMagic {
		return nil, apierr.Invalidf("not a Corral backup (the decrypted file does not start with %q)", backupMagic[:len(backupMagic)-1])
	}
	return &frameReader{r: br}, nil
}

// next reads one frame. io.EOF means the stream ended cleanly between
// frames.
func (f *frameReader) next() (kind byte, payload []byte, err error) {
	kind, err = f.r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	n, err := binary.ReadUvarint(f.r)
	if err != nil {
		return 0, nil, unexpected(err)
	}
	if n > maxBackupFrame {
		return 0, nil, apierr.DataLossf("backup frame of %d bytes is over the %d-byte limit", n, maxBackupFrame)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(f.r, payload); err != nil {
		return 0, nil, unexpected(err)
	}
	return kind, payload, nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// splitNamed splits a name-prefixed payload.
func splitNamed(p []byte) (string, []byte, error) {
	n, l := binary.Uvarint(p)
	if l <= 0 || n > uint64(len(p)-l) {
		return "", nil, apierr.DataLossf("backup frame: bad name length")
	}
	return string(p[l : l+int(n)]), p[l+int(n):], nil
}

// checkBackupFile refuses a file name restore would not write.
func checkBackupFile(name string) error {
	_, ok := backupFiles[name]
	if !ok || path.Clean(name) != name {
		return apierr.DataLossf("backup holds a file %q that restore does not know", name)
	}
	return nil
}

func (h *Header) check() error {
	switch {
	case h.Format != Format:
		return apierr.Invalidf("backup format %d: this corrald reads format %d (written by corrald %s)", h.Format, Format, h.CorralVersion)
	case h.Records < 0 || h.StoreRevision < 0:
		return apierr.DataLossf("backup header: records %d, revision %d", h.Records, h.StoreRevision)
	}
	for _, f := range h.Files {
		if err := checkBackupFile(f); err != nil {
			return err
		}
	}
	return nil
}

// String is the header as restore prints it.
func (h *Header) String() string {
	return fmt.Sprintf("backup of appliance %q (%s store, revision %d, %d records, schema %d) made %s by corrald %s",
		h.Appliance, h.Store, h.StoreRevision, h.Records, h.SchemaVersion, h.Created.UTC().Format(time.RFC3339), h.CorralVersion)
}
