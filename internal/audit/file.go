package audit

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The file format, shared by the writer (log.go) and the readers.
//
// A log is a directory of segment files named NNNNNNNN.jsonl (1, 2, ...),
// one record per line. Every line is exactly
//
//	{"seq":S,"prev":"P","kind":"K",...the rest of the record...}
//
// where S counts records from 1 across segments, P is the lowercase hex
// SHA-256 of the previous line's bytes (without its newline; 64 zeros for
// the first record), and K the record's kind. A line's hash is SHA-256 of
// its bytes as stored: no re-encoding is involved, so what is verified is
// exactly what is on disk. A checkpoint line ends ,"sig":"B"} where B is
// the base64 ed25519 signature of every byte of the line before ,"sig":
// — which includes its seq and prev, so it signs the whole chain before
// it.

const (
	segmentExt = ".jsonl"
	// KeyFile and PubFile hold the checkpoint signing key, in the log's
	// directory unless Options.KeyFile says otherwise.
	KeyFile = "checkpoint.key"
	PubFile = "checkpoint.pub"
	// liveLock is held exclusively by the writer of the log, for its
	// life; inboxDir holds the records of one-off writers that found it
	// held.
	liveLock = "writer.lock"
	inboxDir = "inbox"
	// MaxLine bounds a line the readers take; a longer one is damage.
	MaxLine = 1 << 20
)

var (
	linePrefix = []byte(`{"seq":`)
	prevPrefix = []byte(`,"prev":"`)
	kindPrefix = []byte(`","kind":"`)
	sigMarker  = []byte(`,"sig":"`)
	zeroHash   [32]byte
)

func segmentName(n int) string { return fmt.Sprintf("%08d%s", n, segmentExt) }

// segments lists the segment numbers in dir, ascending.
func segments(dir string) ([]int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		name := e.Name()
		base, ok := strings.CutSuffix(name, segmentExt)
		if !ok || len(base) != 8 || !e.Type().IsRegular() {
			continue
		}
		n, err := strconv.Atoi(base)
		if err != nil || n <= 0 {
			continue
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// parsePrefix reads the chain fields of a line; ok is false when the line
// does not have the format's prefix.
func parsePrefix(line []byte) (seq uint64, prev [32]byte, kind Kind, ok bool) {
	rest, found := bytes.CutPrefix(line, linePrefix)
	if !found {
		return 0, prev, "", false
	}
	i := 0
	for i < len(rest) && i < 20 && rest[i] >= '0' && rest[i] <= '9' {
		i++
	}
	if i == 0 || (i > 1 && rest[0] == '0') {
		return 0, prev, "", false
	}
	seq, err := strconv.ParseUint(string(rest[:i]), 10, 64)
	if err != nil || seq == 0 {
		return 0, prev, "", false
	}
	rest, found = bytes.CutPrefix(rest[i:], prevPrefix)
	if !found || len(rest) < 64 {
		return 0, prev, "", false
	}
	for _, c := range rest[:64] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return 0, prev, "", false
		}
	}
	if _, err := hex.Decode(prev[:], rest[:64]); err != nil {
		return 0, prev, "", false
	}
	rest, found = bytes.CutPrefix(rest[64:], kindPrefix)
	if !found {
		return 0, prev, "", false
	}
	end := bytes.IndexByte(rest, '"')
	if end <= 0 || end > 32 {
		return 0, prev, "", false
	}
	if len(line) < 2 || line[len(line)-1] != '}' {
		return 0, prev, "", false
	}
	return seq, prev, Kind(rest[:end]), true
}

// appendPrefix appends the chain fields of a line to b.
func appendPrefix(b []byte, seq uint64, prev [32]byte) []byte {
	b = append(b, linePrefix...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, prevPrefix...)
	b = hex.AppendEncode(b, prev[:])
	return append(b, '"', ',')
}

// lineReader reads lines of at most MaxLine bytes; a longer line is
// returned cut, with long set.
type lineReader struct {
	r    *bufio.Reader
	buf  []byte
	line int
}

func newLineReader(r io.Reader) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, 256<<10)}
}

// next returns the next line without its newline; terminated is false
// for bytes at the end of the file after its last newline. The slice is
// valid until the next call.
func (lr *lineReader) next() (line []byte, terminated, long bool, err error) {
	lr.buf = lr.buf[:0]
	for {
		frag, err := lr.r.ReadSlice('\n')
		if len(lr.buf)+len(frag) <= MaxLine+1 {
			if err == nil && len(lr.buf) == 0 {
				lr.line++
				return frag[:len(frag)-1], true, false, nil
			}
			lr.buf = append(lr.buf, frag...)
		} else {
			long = true
		}
		switch {
		case err == nil:
			lr.line++
			return bytes.TrimSuffix(lr.buf, []byte{'\n'}), true, long, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if len(lr.buf) == 0 && !long {
				return nil, false, false, io.EOF
			}
			lr.line++
			return lr.buf, false, long, nil
		default:
			return nil, false, false, err
		}
	}
}

// loadKey reads the signing key from path, or makes one (and writes its
// public half beside it, as PubFile in pubDir) when there is none.
func loadKey(path, pubPath string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path) //nolint:gosec // the operator's path
	switch {
	case err == nil:
		seed, derr := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
		if derr != nil || len(seed) != ed25519.SeedSize {
			return nil, fmt.Errorf("audit signing key %s: not a base64 ed25519 seed", path)
		}
		k := ed25519.NewKeyFromSeed(seed)
		// The public key is written again if it is missing or differs:
		// it is derived, and verification reads it.
		pub := []byte(PublicKeyText(k.Public().(ed25519.PublicKey)))
		if old, err := os.ReadFile(pubPath); err != nil || !bytes.Equal(old, pub) { //nolint:gosec // beside the key
			if err := os.WriteFile(pubPath, pub, 0o644); err != nil { //nolint:gosec // a public key
				return nil, err
			}
		}
		return k, nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	}
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600) //nolint:gosec // the operator's path
	if err != nil {
		if errors.Is(err, os.ErrExist) { // another writer made it meanwhile
			return loadKey(path, pubPath)
		}
		return nil, err
	}
	_, err = f.WriteString(base64.StdEncoding.EncodeToString(k.Seed()) + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(pubPath, []byte(PublicKeyText(k.Public().(ed25519.PublicKey))), 0o644); err != nil { //nolint:gosec // a public key
		return nil, err
	}
	return k, nil
}

// PublicKeyText is the text of a public key file: "ed25519 BASE64\n".
func PublicKeyText(pub ed25519.PublicKey) string {
	return "ed25519 " + base64.StdEncoding.EncodeToString(pub) + "\n"
}

// ReadPublicKey reads a public key file.
func ReadPublicKey(path string) (ed25519.PublicKey, error) {
	b, err := os.ReadFile(path) //nolint:gosec // the operator's path
	if err != nil {
		return nil, err
	}
	s, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "ed25519 ")
	raw, err := base64.StdEncoding.DecodeString(s)
	if !ok || err != nil || len(raw) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%s: not an audit public key (want \"ed25519 BASE64\")", path)
	}
	return ed25519.PublicKey(raw), nil
}

// keyID names a public key in checkpoints: the first 8 bytes of its
// SHA-256, in hex.
func keyID(pub ed25519.PublicKey) string {
	s := sha256.Sum256(pub)
	return hex.EncodeToString(s[:8])
}

// SegmentPath is the path of segment n of the log in dir.
func SegmentPath(dir string, n int) string { return filepath.Join(dir, segmentName(n)) }
