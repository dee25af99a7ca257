package sandbox

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Log file bounds: past maxLog bytes the file is cut to its newest keepLog.
const (
	maxLog  = 1 << 20
	keepLog = 512 << 10
	maxLine = 4 << 10
)

// logFile is a sandbox's log: one line per event, newest last, bounded.
// It lives outside the sandbox's own directory so the sandbox cannot touch
// it, and survives daemon restarts.
type logFile struct {
	mu   sync.Mutex
	path string
	size int64
	f    *os.File // open for appending; nil until the first line
}

func openLog(dir, id string) *logFile {
	if dir == "" {
		return nil
	}
	l := &logFile{path: filepath.Join(dir, id+".log")}
	if fi, err := os.Stat(l.path); err == nil {
		l.size = fi.Size()
	}
	return l
}

func removeLog(dir, id string) {
	if dir != "" {
		_ = os.Remove(filepath.Join(dir, id+".log"))
	}
}

func (l *logFile) printf(format string, args ...any) {
	if l == nil {
		return
	}
	line := fmt.Sprintf(format, args...)
	if len(line) > maxLine {
		line = line[:maxLine] + "…"
	}
	line = strings.ReplaceAll(line, "\n", "\\n")
	rec := time.Now().UTC().Format(time.RFC3339Nano) + " " + line + "\n"
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		if err := os.MkdirAll(filepath.Dir(l.path), 0o700); err != nil {
			return
		}
		f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return
		}
		l.f = f
	}
	n, _ := l.f.WriteString(rec)
	l.size += int64(n)
	if l.size > maxLog {
		l.truncate()
	}
}

// truncate keeps the newest keepLog bytes, from a line start.
func (l *logFile) truncate() {
	b, err := os.ReadFile(l.path)
	if err != nil || len(b) <= keepLog {
		return
	}
	b = b[len(b)-keepLog:]
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	tmp := l.path + ".tmp"
	if os.WriteFile(tmp, b, 0o600) == nil && os.Rename(tmp, l.path) == nil {
		l.size = int64(len(b))
		l.closeLocked() // the next line opens the new file
	}
}

func (l *logFile) tail(n int) ([]string, error) {
	if l == nil {
		return []string{}, nil
	}
	l.mu.Lock()
	b, err := os.ReadFile(l.path)
	l.mu.Unlock()
	if os.IsNotExist(err) {
		return []string{}, nil
	}
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		lines = nil
	}
	if n > 0 && len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if lines == nil {
		lines = []string{}
	}
	return lines, nil
}

func (l *logFile) remove() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closeLocked()
	_ = os.Remove(l.path)
}

// close releases the file (the daemon is closing the manager).
func (l *logFile) close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closeLocked()
}

func (l *logFile) closeLocked() {
	if l.f != nil {
		_ = l.f.Close()
		l.f = nil
	}
}
