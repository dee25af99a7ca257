// Tests of the README and docs against the tree they describe: the package
// map (docs/development.md) names every package of the module and nothing
// else, the README opens with the two commands, and relative links lead to
// files that exist. Documentation that drifts from the code fails here
// instead of misleading its reader.
package warren_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/warren-sandbox/warren"

func readme(t *testing.T) string {
	t.Helper()
	return readFile(t, "README.md")
}

// mapFile holds the package map.
const mapFile = "docs/development.md"

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// packageMap returns the entries of the fenced block under mapFile's
// "## Package map" heading: package directory -> its one-line description.
func packageMap(t *testing.T, text string) map[string]string {
	t.Helper()
	_, section, ok := strings.Cut(text, "\n## Package map\n")
	if !ok {
		t.Fatal(mapFile + ` has no "## Package map" section`)
	}
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	entries := map[string]string{}
	inBlock := false
	sc := bufio.NewScanner(strings.NewReader(section))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			if inBlock {
				break // the map is the first block of the section
			}
			inBlock = true
			continue
		}
		if !inBlock || strings.TrimSpace(line) == "" {
			continue
		}
		dir, desc, _ := strings.Cut(strings.TrimSpace(line), " ")
		dir = strings.TrimSuffix(dir, "/")
		if _, dup := entries[dir]; dup {
			t.Errorf("%s package map: %s is listed twice", mapFile, dir)
		}
		if strings.TrimSpace(desc) == "" {
			t.Errorf("%s package map: %s has no description", mapFile, dir)
		}
		entries[dir] = strings.TrimSpace(desc)
	}
	if !inBlock {
		t.Fatal(mapFile + `: no fenced block under "## Package map"`)
	}
	return entries
}

// modulePackages lists the module's packages as directories relative to its
// root, leaving out the root itself (it holds only this test).
func modulePackages(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-e", "-f", "{{.ImportPath}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	var pkgs []string
	for p := range strings.FieldsSeq(string(out)) {
		if rel, ok := strings.CutPrefix(p, module+"/"); ok {
			pkgs = append(pkgs, rel)
		} else if p != module {
			t.Fatalf("go list: %s is not in module %s", p, module)
		}
	}
	if len(pkgs) == 0 {
		t.Fatal("go list ./... listed no packages")
	}
	return pkgs
}

func TestPackageMap(t *testing.T) {
	mapped := packageMap(t, readFile(t, mapFile))
	pkgs := modulePackages(t)
	for _, p := range pkgs {
		if _, ok := mapped[p]; !ok {
			t.Errorf("%s: the package map is missing package %s: add a line for it", mapFile, p)
		}
	}
	var stale []string
	for dir := range mapped {
		if !slices.Contains(pkgs, dir) {
			stale = append(stale, dir)
		}
	}
	slices.Sort(stale)
	for _, dir := range stale {
		t.Errorf("%s: the package map lists %s, which is not a package of the module: remove or rename it", mapFile, dir)
	}
}

// TestREADMEStartsWithTheTwoCommands: the first thing a reader meets after the
// title is the block with `make run` and `make test`.
func TestREADMEStartsWithTheTwoCommands(t *testing.T) {
	text := readme(t)
	if !strings.HasPrefix(text, "# ") {
		t.Fatal("README.md does not start with its title")
	}
	_, rest, _ := strings.Cut(text, "\n")
	fence := strings.Index(rest, "```")
	if fence < 0 {
		t.Fatal("README.md has no code block")
	}
	if strings.Contains(rest[:fence], "\n#") {
		t.Error("README.md: a heading comes before the first commands")
	}
	block, _, _ := strings.Cut(rest[fence+3:], "```")
	var cmds []string
	for _, line := range strings.Split(block, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "make" {
			cmds = append(cmds, f[0]+" "+f[1])
		}
	}
	if !slices.Equal(cmds, []string{"make run", "make test"}) {
		t.Errorf("README.md's first code block runs %q, want [make run, make test]", cmds)
	}
}

var linkRE = regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)

// TestREADMELinks: the README's and docs' relative links lead to files.
func TestREADMELinks(t *testing.T) {
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range append([]string{"README.md"}, docs...) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range linkRE.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(file), target)); err != nil {
				t.Errorf("%s links to %s: %v", file, target, err)
			}
		}
	}
}
