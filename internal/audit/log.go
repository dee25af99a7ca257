package audit

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Options configure a Log.
type Options struct {
	// Dir holds the segments (made 0700 if missing).
	Dir string
	// KeyFile is the checkpoint signing key (default Dir/checkpoint.key,
	// made on first use, 0600); its public half is written beside the
	// segments as Dir/checkpoint.pub.
	KeyFile string
	// CheckpointEvery signs a checkpoint after this many records
	// (default 10000); CheckpointInterval after this long with records
	// unsigned (default 1m; negative: none). Close always signs one.
	CheckpointEvery    int
	CheckpointInterval time.Duration
	// SegmentBytes starts a new segment once the current one holds this
	// many bytes (default 64 MiB).
	SegmentBytes int64
	// Redact is given every record's JSON encoding before it is hashed
	// and may replace bytes in it (known secret values, in their JSON
	// string form); it must return valid JSON of the record.
	Redact func([]byte) []byte
	// OneOff is a writer that appends a few records and closes (warren
	// key). Alone, it appends like a server's writer; beside a server's
	// writer it leaves each record in the log's inbox, which that writer
	// appends within a second (and the next writer at its start).
	OneOff bool
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Log appends records to an audit log. It is safe for concurrent use.
// One Log writes a directory at a time (an exclusive flock on
// Dir/writer.lock for its life), so an append needs no lock but the
// Log's mutex; a one-off writer beside it goes through the inbox.
//
// An append is one write(2) of a whole line, made before Append returns;
// a record is never buffered, queued or dropped. When a write fails the
// Log keeps that error (Err) and refuses every later record: callers
// refuse the work they cannot record (the rpc server answers
// unavailable). Data reach the disk at checkpoints (fsync) and whenever
// the kernel writes them back: a crash of the machine can lose the
// records after the last synced checkpoint, and a crash can tear the last
// line, which the next Open detects and records.
type Log struct {
	opts  Options
	priv  ed25519.PrivateKey
	keyID string

	mu     sync.Mutex
	liveF  *os.File // writer.lock, held exclusively; nil for an inbox writer
	seg    int
	f      *os.File
	size   int64
	seq    uint64
	head   [32]byte
	since  int // records since the last checkpoint
	line   []byte
	err    error
	closed bool
	// inbox: a one-off writer that found a server's writer, and hands
	// its records to it.
	inbox bool

	stop chan struct{}
	done chan struct{}
}

// ErrClosed is Append's error after Close.
var ErrClosed = errors.New("audit: log closed")

// Open opens the log in opts.Dir for appending, creating it if needed. A
// log whose last line was torn by a crash, or whose previous writer did
// not close it, gets a recovery record saying so before anything else.
func Open(opts Options) (*Log, error) {
	if opts.Dir == "" {
		return nil, errors.New("audit: no directory")
	}
	if opts.CheckpointEvery <= 0 {
		opts.CheckpointEvery = 10000
	}
	if opts.CheckpointInterval == 0 {
		opts.CheckpointInterval = time.Minute
	}
	if opts.SegmentBytes <= 0 {
		opts.SegmentBytes = 64 << 20
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if opts.KeyFile == "" {
		opts.KeyFile = filepath.Join(opts.Dir, KeyFile)
	}
	priv, err := loadKey(opts.KeyFile, filepath.Join(opts.Dir, PubFile))
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	l := &Log{opts: opts, priv: priv, keyID: keyID(priv.Public().(ed25519.PublicKey))}
	if l.liveF, err = lockLive(opts.Dir, opts.OneOff); err != nil {
		return nil, err
	}
	if l.liveF == nil {
		l.inbox = true
		return l, nil
	}
	if err := l.open(); err != nil {
		_ = l.liveF.Close()
		if l.f != nil {
			_ = l.f.Close()
		}
		return nil, err
	}
	if !opts.OneOff {
		l.stop, l.done = make(chan struct{}), make(chan struct{})
		go l.ticker()
	}
	return l, nil
}

// lockLive takes the writer lock, exclusively. A server's writer waits
// for it up to half a second (a one-off writer holds it for
// milliseconds); a one-off writer that finds it held gets nil: it writes
// to the inbox.
func lockLive(dir string, oneOff bool) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, liveLock), os.O_RDWR|os.O_CREATE, 0o600) //nolint:gosec // in the log's directory
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	for i := 0; ; i++ {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil || !errors.Is(err, unix.EWOULDBLOCK) || oneOff || i >= 50 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	switch {
	case err == nil:
		return f, nil
	case oneOff && errors.Is(err, unix.EWOULDBLOCK):
		_ = f.Close()
		return nil, nil
	case errors.Is(err, unix.EWOULDBLOCK):
		_ = f.Close()
		return nil, fmt.Errorf("audit: %s is being written by another server", dir)
	}
	_ = f.Close()
	return nil, fmt.Errorf("audit: lock %s: %w", dir, err)
}

// open loads the log's end, records a torn or unclosed end, and appends
// what one-off writers left in the inbox.
func (l *Log) open() error {
	st, err := l.load()
	if err != nil {
		return err
	}
	var rec *Recovery
	switch {
	case st.torn > 0:
		// The torn bytes stay in the file as they are (evidence); a
		// newline ends them, and the chain continues from the last whole
		// record, which the recovery record names.
		if _, err := l.f.Write([]byte{'\n'}); err != nil {
			return fmt.Errorf("audit: %w", err)
		}
		l.size++
		rec = &Recovery{Reason: "torn", LastSeq: l.seq, File: segmentName(st.tornSeg), Line: st.tornLine, Bytes: st.torn}
	case l.seq > 0 && st.lastKind != KindCheckpoint:
		rec = &Recovery{Reason: "unclosed", LastSeq: l.seq}
	}
	if rec != nil {
		if err := l.appendLocked(&Record{Kind: KindRecovery, Time: l.opts.Now().UTC(), Recovery: rec}); err != nil {
			return err
		}
	}
	return l.drainLocked()
}

// tailState is what load found at the log's end.
type tailState struct {
	lastKind Kind
	torn     int // bytes after the last newline
	tornSeg  int
	tornLine int
}

// load finds the newest segment and the last record (seq and hash),
// opening the newest segment for appending.
func (l *Log) load() (tailState, error) {
	var st tailState
	segs, err := segments(l.opts.Dir)
	if err != nil {
		return st, fmt.Errorf("audit: %w", err)
	}
	l.seq, l.head, l.seg = 0, zeroHash, 1
	if len(segs) > 0 {
		l.seg = segs[len(segs)-1]
	}
	f, err := os.OpenFile(SegmentPath(l.opts.Dir, l.seg), os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600) //nolint:gosec // in the log's directory
	if err != nil {
		return st, fmt.Errorf("audit: %w", err)
	}
	l.f = f
	// The last record: in the newest segment, or in an older one when
	// the newest is empty (just rotated).
	for i := len(segs) - 1; i >= 0; i-- {
		t, err := scanTail(SegmentPath(l.opts.Dir, segs[i]))
		if err != nil {
			return st, fmt.Errorf("audit: %w", err)
		}
		if i == len(segs)-1 && t.torn > 0 {
			st.torn, st.tornSeg, st.tornLine = t.torn, segs[i], t.lines+1
		}
		if t.last != nil {
			l.seq, l.head, st.lastKind = t.seq, sha256.Sum256(t.last), t.kind
			break
		}
	}
	fi, err := f.Stat()
	if err != nil {
		return st, fmt.Errorf("audit: %w", err)
	}
	l.size = fi.Size()
	return st, nil
}

// tail is the end of one segment.
type tail struct {
	last  []byte // the last whole line with a record's prefix
	seq   uint64
	kind  Kind
	lines int // whole lines
	torn  int // bytes after the last newline
}

func scanTail(path string) (tail, error) {
	var t tail
	f, err := os.Open(path) //nolint:gosec // in the log's directory
	if err != nil {
		return t, err
	}
	defer func() { _ = f.Close() }()
	lr := newLineReader(f)
	for {
		line, terminated, long, err := lr.next()
		if errors.Is(err, io.EOF) {
			return t, nil
		}
		if err != nil {
			return t, err
		}
		if !terminated {
			t.torn = len(line)
			return t, nil
		}
		t.lines++
		if long {
			continue
		}
		if seq, _, kind, ok := parsePrefix(line); ok {
			t.last, t.seq, t.kind = append(t.last[:0], line...), seq, kind
		}
	}
}

// Append writes r as the next record. It fills r.Time when zero.
func (l *Log) Append(r *Record) error {
	if r.Time.IsZero() {
		r.Time = l.opts.Now().UTC()
	}
	body, err := appendRecord(make([]byte, 0, 1024), r)
	if err != nil {
		return fmt.Errorf("audit: encode record: %w", err)
	}
	if l.opts.Redact != nil {
		body = l.opts.Redact(body)
	}
	if len(body) > MaxRecord {
		return fmt.Errorf("audit: %s record of %d bytes is larger than %d", r.Kind, len(body), MaxRecord)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	if l.inbox {
		return l.toInbox(body)
	}
	if err := l.writeLine(body, false); err != nil {
		return err
	}
	if l.since >= l.opts.CheckpointEvery {
		return l.checkpointLocked("count", false)
	}
	return nil
}

func (l *Log) usable() error {
	if l.closed {
		return ErrClosed
	}
	return l.err
}

// Err is the error that stopped the log, or nil while it takes records.
func (l *Log) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.usable()
}

func (l *Log) fail(err error) error {
	l.err = fmt.Errorf("audit: the log stopped taking records: %w", err)
	return l.err
}

// appendLocked writes r; holds l.mu.
func (l *Log) appendLocked(r *Record) error {
	body, err := appendRecord(nil, r)
	if err != nil {
		return err
	}
	return l.writeLine(body, false)
}

// writeLine writes body (a record's JSON object) as the next line; a
// signed line is a checkpoint's, whose signature is appended. Holds l.mu.
func (l *Log) writeLine(body []byte, signed bool) error {
	if l.size >= l.opts.SegmentBytes {
		if err := l.rotate(); err != nil {
			return l.fail(err)
		}
	}
	seq := l.seq + 1
	b := appendPrefix(l.line[:0], seq, l.head)
	b = append(b, body[1:]...)
	if signed {
		b = b[:len(b)-1] // the closing brace
		sig := ed25519.Sign(l.priv, b)
		b = append(b, sigMarker...)
		b = base64.StdEncoding.AppendEncode(b, sig)
		b = append(b, '"', '}')
	}
	h := sha256.Sum256(b)
	b = append(b, '\n')
	l.line = b
	n, err := l.f.Write(b)
	l.size += int64(n)
	if err != nil {
		return l.fail(err)
	}
	l.seq, l.head = seq, h
	if signed {
		l.since = 0
	} else {
		l.since++
	}
	return nil
}

func (l *Log) rotate() error {
	if err := l.f.Sync(); err != nil {
		return err
	}
	f, err := os.OpenFile(SegmentPath(l.opts.Dir, l.seg+1), os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600) //nolint:gosec // in the log's directory
	if err != nil {
		return err
	}
	_ = l.f.Close()
	l.f, l.seg, l.size = f, l.seg+1, 0
	return nil
}

// checkpointLocked signs a checkpoint; durable ones are synced to disk
// (the timer's and Close's, off the request path).
func (l *Log) checkpointLocked(reason string, durable bool) error {
	body, err := appendRecord(nil, &Record{Kind: KindCheckpoint, Time: l.opts.Now().UTC(),
		Checkpoint: &Checkpoint{Reason: reason, KeyID: l.keyID}})
	if err != nil {
		return err
	}
	if err := l.writeLine(body, true); err != nil {
		return err
	}
	if durable {
		if err := l.f.Sync(); err != nil {
			return l.fail(err)
		}
	}
	return nil
}

// Checkpoint signs a checkpoint now if records are unsigned.
func (l *Log) Checkpoint() error {
	return l.checkpoint("interval")
}

func (l *Log) checkpoint(reason string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(); err != nil || l.inbox {
		return err
	}
	if l.since == 0 && reason != "close" {
		return nil
	}
	return l.checkpointLocked(reason, true)
}

// ticker signs interval checkpoints and appends what one-off writers
// leave in the inbox, every inboxEvery.
func (l *Log) ticker() {
	defer close(l.done)
	t := time.NewTicker(inboxEvery)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-l.stop:
			return
		case now := <-t.C:
			// Failures are sticky: Err and every Append report them.
			l.mu.Lock()
			if l.usable() == nil {
				_ = l.drainLocked()
			}
			l.mu.Unlock()
			if l.opts.CheckpointInterval > 0 && now.Sub(last) >= l.opts.CheckpointInterval {
				_ = l.checkpoint("interval")
				last = now
			}
		}
	}
}

// Close signs a final checkpoint, syncs and closes the log.
func (l *Log) Close() error {
	if l.stop != nil {
		close(l.stop)
		<-l.done
		l.stop = nil
	}
	l.mu.Lock()
	var err error
	if l.usable() == nil && !l.inbox {
		err = l.drainLocked()
	}
	l.mu.Unlock()
	if cerr := l.checkpoint("close"); err == nil {
		err = cerr
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if l.f != nil {
		if cerr := l.f.Close(); err == nil {
			err = cerr
		}
	}
	if l.liveF != nil {
		_ = l.liveF.Close()
	}
	if errors.Is(err, ErrClosed) {
		err = nil
	}
	return err
}

// Head returns the last record's sequence number and hash.
func (l *Log) Head() (uint64, [32]byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq, l.head
}

// inboxEvery is how often a server's writer looks in the inbox.
const inboxEvery = time.Second

// toInbox leaves body, one record, in the inbox for the writer that holds
// the log: written to a temporary name, then renamed, so the writer never
// sees half of it.
func (l *Log) toInbox(body []byte) error {
	dir := filepath.Join(l.opts.Dir, inboxDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	name := fmt.Sprintf("%020d-%x.json", l.opts.Now().UnixNano(), rnd)
	tmp := filepath.Join(dir, "."+name)
	if err := os.WriteFile(tmp, body, 0o600); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	return nil
}

// drainLocked appends the records in the inbox, oldest first, and removes
// them. A file that is no record (it can only come from someone with
// write access to the log's directory) is renamed *.bad and left there,
// and a recovery record says so. Holds l.mu.
func (l *Log) drainLocked() error {
	dir := filepath.Join(l.opts.Dir, inboxDir)
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) == 0 {
		return nil //nolint:nilerr // no inbox yet
	}
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".json") {
			continue
		}
		p := filepath.Join(dir, name)
		body, err := readBounded(p, MaxRecord)
		var r Record
		if err == nil {
			err = json.Unmarshal(body, &r)
		}
		if err != nil || r.Kind == KindCheckpoint || r.Kind == KindRecovery || r.Kind == "" {
			_ = os.Rename(p, p+".bad")
			if err := l.appendLocked(&Record{Kind: KindRecovery, Time: l.opts.Now().UTC(),
				Recovery: &Recovery{Reason: "bad inbox file", LastSeq: l.seq, File: Clip(name, 64)}}); err != nil {
				return err
			}
			continue
		}
		if err := l.appendLocked(&r); err != nil {
			return err
		}
		if l.since >= l.opts.CheckpointEvery {
			if err := l.checkpointLocked("count", false); err != nil {
				return err
			}
		}
		if err := os.Remove(p); err != nil {
			return l.fail(err)
		}
	}
	return nil
}

func readBounded(p string, n int64) ([]byte, error) {
	f, err := os.Open(p) //nolint:gosec // in the log's inbox
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(io.LimitReader(f, n+1))
	if err == nil && int64(len(b)) > n {
		err = fmt.Errorf("larger than %d bytes", n)
	}
	return b, err
}
