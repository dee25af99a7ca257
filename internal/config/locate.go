package config

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// The TOML decoder keeps where each key was defined to itself, so the
// lines of problems found after decoding come from here: the decoder's
// keys, in document order, are found in the file's lines with a cursor
// that only moves forward. A key that cannot be found on a line of its
// own (inside an inline table, a dotted key written differently) gets the
// line of the key before it, which is the table or line that holds it.
// Entries of arrays of tables get their index in the path
// ("namespaces.team-a.secrets[1].mode").

type locator struct {
	line  map[string]int      // indexed path → line
	paths map[string][]string // raw key → its indexed paths, in order
	used  map[string]int      // raw key → paths handed out by next
}

func locate(md toml.MetaData, data []byte) *locator {
	l := &locator{line: map[string]int{}, paths: map[string][]string{}, used: map[string]int{}}
	// Each line's defined name, and each name's lines in order: finding
	// the next line of a key is a binary search, whatever the file.
	at := map[string][]int{}
	for i, ln := range strings.Split(string(data), "\n") {
		if name, ok := defines(ln); ok {
			at[name] = append(at[name], i)
		}
	}
	count := map[string]int{} // array-of-tables key → entries seen
	cur, last := 0, 0
	for _, k := range md.Keys() {
		if md.Type(k...) == "ArrayHash" {
			count[k.String()]++
		}
		p := indexed(k, count)
		line := last
		ls := at[k[len(k)-1]]
		if j, _ := slices.BinarySearch(ls, cur); j < len(ls) {
			line, cur = ls[j]+1, ls[j]
		}
		last = line
		l.line[p] = line
		raw := k.String()
		l.paths[raw] = append(l.paths[raw], p)
	}
	return l
}

// indexed is k's path, with the entry index after each array of tables.
func indexed(k toml.Key, count map[string]int) string {
	var b strings.Builder
	for i, piece := range k {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(piece)
		if n := count[k[:i+1].String()]; n > 0 {
			b.WriteString("[" + strconv.Itoa(n-1) + "]")
		}
	}
	return b.String()
}

// next returns the indexed path and line of the next occurrence of k
// (Undecoded lists keys in document order too).
func (l *locator) next(k toml.Key) (string, int) {
	raw := k.String()
	n := l.used[raw]
	l.used[raw]++
	if ps := l.paths[raw]; n < len(ps) {
		return ps[n], l.line[ps[n]]
	}
	return raw, 0
}

// at is the line of path, or of its nearest ancestor found.
func (l *locator) at(path string) int {
	for path != "" {
		if n, ok := l.line[path]; ok && n > 0 {
			return n
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

// defines returns the key line defines: the last piece of a table
// header, or the key of an assignment (the first piece of a dotted one).
func defines(line string) (string, bool) {
	s := strings.TrimSpace(line)
	if strings.HasPrefix(s, "[") {
		s = strings.TrimLeft(s, "[")
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", false
		}
		h := s[:end]
		if i := strings.LastIndexByte(h, '.'); i >= 0 {
			h = h[i+1:]
		}
		return unquote(h), true
	}
	eq := strings.IndexByte(s, '=')
	if eq < 0 {
		return "", false
	}
	lhs := s[:eq]
	if i := strings.IndexByte(lhs, '.'); i >= 0 && !strings.ContainsAny(lhs[:i], `"'`) {
		lhs = lhs[:i]
	}
	return unquote(lhs), true
}

func unquote(s string) string {
	s = strings.TrimSpace(s)
	if len(s) >= 2 && (s[0] == '"' || s[0] == '\'') && s[len(s)-1] == s[0] {
		return s[1 : len(s)-1]
	}
	return s
}

// The TOML decoder matches keys to fields ignoring case, where TOML keys
// are case-sensitive: "Max_Memory" would set max_memory, and "Type" and
// "type" in one table would both set it, the last one winning. caseProblems
// finds the keys that name a field in another case.

// tags are the schema's field names.
var tags = func() map[string]bool {
	m := map[string]bool{}
	for _, v := range []any{raw{}, Defaults{}, Audit{}, Secrets{}, Provider{}, Workspaces{}, Store{}, Namespace{}, Grant{}} {
		t := reflect.TypeOf(v)
		for i := range t.NumField() {
			if tag := t.Field(i).Tag.Get("toml"); tag != "" {
				m[tag] = true
			}
		}
	}
	return m
}()

// fieldPieces are the indexes of k's pieces that name fields (the others
// name namespaces, stores, or [server]'s keys, which are exact already).
func fieldPieces(k toml.Key) []int {
	out := []int{0}
	if len(k) < 2 {
		return out
	}
	switch k[0] {
	case "defaults", "audit":
		out = append(out, 1)
	case "secrets":
		out = append(out, 1, 2)
	case "workspaces":
		out = append(out, 1, 3)
	case "namespaces":
		out = append(out, 2)
		if len(k) > 2 && k[2] == "secrets" {
			out = append(out, 3)
		}
	}
	return out
}

// caseProblems reports every key a field matched in another case.
func caseProblems(md toml.MetaData, l *locator) []Problem {
	var out []Problem
	seen := map[string]bool{}
	count := map[string]int{} // as locate counts entries of arrays of tables
	for _, k := range md.Keys() {
		if md.Type(k...) == "ArrayHash" {
			count[k.String()]++
		}
		for _, i := range fieldPieces(k) {
			if i >= len(k) || tags[k[i]] {
				continue
			}
			for tag := range tags {
				if strings.EqualFold(tag, k[i]) {
					p := indexed(k[:i+1], count)
					if !seen[p] {
						seen[p] = true
						out = append(out, Problem{Line: l.at(p), Key: p, Msg: fmt.Sprintf("keys are case-sensitive: write %q", tag)})
					}
				}
			}
		}
	}
	return out
}
