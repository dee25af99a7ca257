package cgroup

import (
	"maps"
	"strings"
	"testing"
)

func TestParseProcSelf(t *testing.T) {
	cases := []struct {
		name, in string
		want     map[string]string
	}{
		{
			name: "v1",
			in: `12:pids:/user.slice/user-1000.slice/session-2.scope
11:cpu,cpuacct:/user.slice
4:memory:/user.slice/user-1000.slice/session-2.scope
3:freezer:/
1:name=systemd:/user.slice/user-1000.slice/session-2.scope
`,
			want: map[string]string{
				"pids": "/user.slice/user-1000.slice/session-2.scope", "cpu": "/user.slice", "cpuacct": "/user.slice",
				"memory": "/user.slice/user-1000.slice/session-2.scope", "freezer": "/",
				"name=systemd": "/user.slice/user-1000.slice/session-2.scope",
			},
		},
		{
			name: "v2",
			in:   "0::/system.slice/warren.service\n",
			want: map[string]string{"": "/system.slice/warren.service"},
		},
		{
			name: "hybrid (build machine)",
			in: `9:name=systemd:/
8:pids:/
4:memory:/process_api/f53ffc353014ac0fa2bd41d44cdf7012
2:cpuacct:/
1:cpu:/
0::/
`,
			want: map[string]string{
				"name=systemd": "/", "pids": "/", "memory": "/process_api/f53ffc353014ac0fa2bd41d44cdf7012",
				"cpuacct": "/", "cpu": "/", "": "/",
			},
		},
		{
			name: "path with colon",
			in:   "0::/a:b/c\n",
			want: map[string]string{"": "/a:b/c"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseProcSelf(strings.NewReader(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	for _, bad := range []string{"garbage\n", "x:memory:/a\n", "3:memory:relative\n", "2::/a\n"} {
		if _, err := ParseProcSelf(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseProcSelf(%q) succeeded, want error", bad)
		}
	}
}

func TestParseMountinfo(t *testing.T) {
	in := `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:7 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/uni\040fied rw,relatime shared:9 master:2 - cgroup2 cgroup2 rw,nsdelegate
`
	got, err := parseMountinfo(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("got %d mounts, want 4: %+v", len(got), got)
	}
	if g := got[0]; g.point != "/sys/fs/cgroup/cpu,cpuacct" || strings.Join(g.ctrls, ",") != "cpu,cpuacct" {
		t.Errorf("co-mounted: %+v", g)
	}
	if g := got[1]; g.root != "/docker/abc" || strings.Join(g.ctrls, ",") != "memory" {
		t.Errorf("memory: %+v", g)
	}
	if g := got[2]; len(g.ctrls) != 0 {
		t.Errorf("named hierarchy has controllers: %+v", g)
	}
	if g := got[3]; g.fstype != "cgroup2" || g.point != "/sys/fs/cgroup/uni fied" {
		t.Errorf("cgroup2: %+v", g)
	}
}

func TestRelTo(t *testing.T) {
	for _, tc := range []struct{ p, root, want string }{
		{"/a/b", "/", "/a/b"},
		{"/docker/abc", "/docker/abc", "/"},
		{"/docker/abc/x", "/docker/abc", "/x"},
	} {
		if got, err := relTo(tc.p, tc.root); err != nil || got != tc.want {
			t.Errorf("relTo(%q, %q) = %q, %v; want %q", tc.p, tc.root, got, err, tc.want)
		}
	}
	if _, err := relTo("/docker/abcd", "/docker/abc"); err == nil {
		t.Error("relTo outside the mount succeeded")
	}
}

func TestValidName(t *testing.T) {
	for _, ok := range []string{"a", "sb-1.2_x", strings.Repeat("x", 128)} {
		if err := validName(ok); err != nil {
			t.Errorf("validName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a/b", "a b", "ä", strings.Repeat("x", 129), "x\n"} {
		if validName(bad) == nil {
			t.Errorf("validName(%q) accepted", bad)
		}
	}
	if validPrefix("warren/sandboxes") != nil || validPrefix("/warren") == nil || validPrefix("a/../b") == nil {
		t.Error("validPrefix")
	}
}
