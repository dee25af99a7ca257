package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"
)

// Severity of a Problem.
const (
	// Tampered: the log is not what its writers wrote (a line edited,
	// removed, reordered, added, a forged checkpoint).
	Tampered = "tampered"
	// Unanchored: the log's end is not covered by a signature and no
	// writer has it open: a crash, or records removed from its end. The
	// two cannot be told apart.
	Unanchored = "unanchored"
	// Note: worth knowing, no damage (a torn line a writer recorded).
	Note = "note"
)

// Problem is one finding, with where it is.
type Problem struct {
	File     string `json:"file,omitempty"`
	Line     int    `json:"line,omitempty"`
	Seq      uint64 `json:"seq,omitempty"`
	Severity string `json:"severity"`
	What     string `json:"what"`
}

func (p Problem) String() string {
	loc := p.File
	if p.Line > 0 {
		loc += fmt.Sprintf(":%d", p.Line)
	}
	if p.Seq > 0 {
		loc += fmt.Sprintf(" (seq %d)", p.Seq)
	}
	if loc == "" {
		return p.Severity + ": " + p.What
	}
	return loc + ": " + p.Severity + ": " + p.What
}

// Report is what Verify found.
type Report struct {
	Files       int
	Records     int
	Checkpoints int
	// LastSeq is the last record's sequence number, SignedSeq the last
	// checkpoint's (everything up to it is signed).
	LastSeq, SignedSeq uint64
	// Live: a server holds the log open, so unsigned records at its end
	// are expected.
	Live     bool
	Problems []Problem
}

// Worst is the most serious severity found ("" for none).
func (r *Report) Worst() string {
	worst := ""
	for _, p := range r.Problems {
		switch {
		case p.Severity == Tampered:
			return Tampered
		case p.Severity == Unanchored:
			worst = Unanchored
		case worst == "":
			worst = p.Severity
		}
	}
	return worst
}

// VerifyOptions configure Verify.
type VerifyOptions struct {
	// PublicKey checks checkpoints (nil: the log's checkpoint.pub, which
	// whoever can write the log can also replace: keep a copy elsewhere).
	PublicKey ed25519.PublicKey
	// Anchors are checkpoint lines kept outside the log (warren audit
	// checkpoints); each must be in the log as it is.
	Anchors [][]byte
	// MaxProblems bounds the problems reported (default 1000); the rest
	// are counted in the last one.
	MaxProblems int
}

type place struct {
	file string
	line int
	seq  uint64
}

// gap is a range of sequence numbers not found where they belonged.
type gap struct {
	from, to uint64
	at       place
}

type verifier struct {
	pub      ed25519.PublicKey
	rep      *Report
	max      int
	dropped  int
	expect   uint64 // the next seq; 0 before the first record
	head     [32]byte
	last     place
	lastKind Kind
	gaps     []gap
	anchors  map[uint64][32]byte
	// pending is a line that is no record: damage, unless the record
	// after it is a recovery record naming it (a torn line).
	pending *place
	pendLen int
}

func (v *verifier) problem(p place, sev, format string, args ...any) {
	if len(v.rep.Problems) >= v.max {
		v.dropped++
		return
	}
	v.rep.Problems = append(v.rep.Problems, Problem{File: p.file, Line: p.line, Seq: p.seq, Severity: sev, What: fmt.Sprintf(format, args...)})
}

// Verify checks the log in dir: the chain of hashes, the sequence, every
// checkpoint's signature, and its end. It reads the files only.
func Verify(dir string, o VerifyOptions) (*Report, error) {
	segs, err := segments(dir)
	if err != nil {
		return nil, err
	}
	pub := o.PublicKey
	if pub == nil {
		if pub, err = ReadPublicKey(filepath.Join(dir, PubFile)); err != nil {
			return nil, fmt.Errorf("checkpoint key: %w (give one with --pub)", err)
		}
	}
	v := &verifier{pub: pub, rep: &Report{Files: len(segs), Live: live(dir)}, max: o.MaxProblems, anchors: map[uint64][32]byte{}}
	if v.max <= 0 {
		v.max = 1000
	}
	for i, a := range o.Anchors {
		seq, _, kind, ok := parsePrefix(bytes.TrimSpace(a))
		if !ok || kind != KindCheckpoint {
			return nil, fmt.Errorf("anchor %d is not a checkpoint line", i+1)
		}
		v.anchors[seq] = sha256.Sum256(bytes.TrimSpace(a))
	}
	if len(segs) == 0 {
		v.problem(place{}, Tampered, "no segment files: the log is gone")
	}
	for i, n := range segs {
		if i > 0 && n != segs[i-1]+1 {
			v.problem(place{file: segmentName(n)}, Tampered, "segments %s to %s are missing", segmentName(segs[i-1]+1), segmentName(n-1))
		}
		if err := v.file(dir, n, i == len(segs)-1); err != nil {
			return nil, err
		}
	}
	v.finish()
	return v.rep, nil
}

// live reports whether a server's writer holds the log.
func live(dir string) bool {
	f, err := os.Open(filepath.Join(dir, liveLock)) //nolint:gosec // in the log's directory
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

func (v *verifier) file(dir string, n int, lastFile bool) error {
	name := segmentName(n)
	f, err := os.Open(SegmentPath(dir, n))
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	lr := newLineReader(f)
	for {
		line, terminated, long, err := lr.next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		at := place{file: name, line: lr.line}
		if !terminated {
			v.flushPending()
			if lastFile {
				v.problem(at, Unanchored, "the last line is torn (%d bytes without an end): a crash while it was written, or the file was cut; the next writer records it", len(line))
			} else {
				v.problem(at, Tampered, "the segment ends inside a line: cut short")
			}
			return nil
		}
		if long {
			v.flushPending()
			v.problem(at, Tampered, "a line longer than %d bytes: not a record", MaxLine)
			continue
		}
		v.line(line, at)
	}
}

func (v *verifier) flushPending() {
	if v.pending != nil {
		v.problem(*v.pending, Tampered, "the line is not a record (edited or damaged)")
		v.pending = nil
	}
}

func (v *verifier) line(line []byte, at place) {
	seq, prev, kind, ok := parsePrefix(line)
	if !ok {
		v.flushPending()
		v.pending, v.pendLen = &at, len(line)
		return
	}
	at.seq = seq
	v.rep.Records++
	h := sha256.Sum256(line)
	if v.pending != nil {
		p := *v.pending
		v.pending = nil
		var e Entry
		if kind == KindRecovery && json.Unmarshal(line, &e) == nil && e.Recovery != nil && e.Recovery.Reason == "torn" &&
			e.Recovery.File == p.file && e.Recovery.Line == p.line && e.Recovery.Bytes == v.pendLen {
			v.problem(p, Note, "a torn line (%d bytes) left by a crash; the writer recorded it at seq %d and went on", v.pendLen, seq)
		} else {
			v.problem(p, Tampered, "the line is not a record (edited or damaged)")
		}
	}
	switch {
	case v.expect == 0:
		if seq != 1 {
			v.problem(at, Tampered, "the log starts at seq %d: the records before it were removed", seq)
		} else if prev != zeroHash {
			v.problem(at, Tampered, "the first record's prev is not zero: edited")
		}
	case seq == v.expect && prev != v.head:
		v.problem(v.last, Tampered, "the record does not hash to what seq %d (%s:%d) commits to: one of the two lines was edited", seq, at.file, at.line)
	case seq > v.expect:
		v.gaps = append(v.gaps, gap{v.expect, seq - 1, at})
	case seq < v.expect:
		if v.fillGap(seq) {
			v.problem(at, Tampered, "out of order: seq %d comes after seq %d (records reordered)", seq, v.last.seq)
		} else {
			v.problem(at, Tampered, "seq %d again after seq %d: a record duplicated or inserted", seq, v.last.seq)
		}
		// The chain goes on from the line before this one.
		return
	}
	if kind == KindCheckpoint {
		v.checkpoint(line, at)
	}
	if want, ok := v.anchors[seq]; ok {
		if want != h {
			v.problem(at, Tampered, "the anchored checkpoint seq %d differs from the one kept outside the log: rewritten", seq)
		}
		delete(v.anchors, seq)
	}
	if kind == KindRecovery {
		var e Entry
		if json.Unmarshal(line, &e) == nil && e.Recovery != nil && e.Recovery.Reason == "unclosed" {
			v.problem(at, Note, "the writer before did not close the log (a crash or a kill): seq %d to %d were not signed by it", v.rep.SignedSeq+1, e.Recovery.LastSeq)
		}
	}
	v.expect, v.head, v.last, v.lastKind = seq+1, h, at, kind
	v.rep.LastSeq = seq
}

// fillGap takes seq out of the gaps; it reports whether it was in one.
func (v *verifier) fillGap(seq uint64) bool {
	for i, g := range v.gaps {
		if seq < g.from || seq > g.to {
			continue
		}
		switch {
		case g.from == g.to:
			v.gaps = append(v.gaps[:i], v.gaps[i+1:]...)
		case seq == g.from:
			v.gaps[i].from++
		case seq == g.to:
			v.gaps[i].to--
		default:
			v.gaps[i].to = seq - 1
			v.gaps = append(v.gaps, gap{seq + 1, g.to, g.at})
		}
		return true
	}
	return false
}

func (v *verifier) checkpoint(line []byte, at place) {
	i := bytes.LastIndex(line, sigMarker)
	ok := false
	if i > 0 && bytes.HasSuffix(line, []byte(`"}`)) {
		sig, err := base64.StdEncoding.DecodeString(string(line[i+len(sigMarker) : len(line)-2]))
		ok = err == nil && ed25519.Verify(v.pub, line[:i], sig)
	}
	if !ok {
		v.problem(at, Tampered, "the checkpoint's signature does not verify with this public key: forged or edited")
		return
	}
	v.rep.Checkpoints++
	v.rep.SignedSeq = at.seq
}

func (v *verifier) finish() {
	v.flushPending()
	sort.Slice(v.gaps, func(i, j int) bool { return v.gaps[i].from < v.gaps[j].from })
	for _, g := range v.gaps {
		if g.from == g.to {
			v.problem(g.at, Tampered, "seq %d is missing before this record: removed", g.from)
		} else {
			v.problem(g.at, Tampered, "seq %d to %d are missing before this record: removed", g.from, g.to)
		}
	}
	seqs := make([]uint64, 0, len(v.anchors))
	for s := range v.anchors {
		seqs = append(seqs, s)
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	for _, s := range seqs {
		v.problem(place{seq: s}, Tampered, "the anchored checkpoint seq %d is not in the log: it was cut short or rewritten", s)
	}
	if v.rep.Records > 0 && v.lastKind != KindCheckpoint {
		n := v.rep.LastSeq - v.rep.SignedSeq
		if v.rep.Live {
			v.problem(v.last, Note, "%d records after the last checkpoint (seq %d) are not signed yet: a server is writing the log", n, v.rep.SignedSeq)
		} else {
			v.problem(v.last, Unanchored, "the log ends %d records after its last checkpoint (seq %d) and no server is writing it: a crash, or records removed from its end", n, v.rep.SignedSeq)
		}
	}
	if v.dropped > 0 {
		v.rep.Problems = append(v.rep.Problems, Problem{Severity: Note, What: fmt.Sprintf("%d more problems not listed", v.dropped)})
	}
}
