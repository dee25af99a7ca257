// warren-spawner starts sandbox agents for a warren process (the server,
// `warren run`, `warren bench`): each in new namespaces, born in its cgroup,
// with a narrowed capability bounding set. It is the host side's only fork
// of a sandbox; package spawner (internal/spawner) is its Go client and
// documents why it exists. In short: it is written in C so that it is one
// small, single-threaded process. A Go process cannot vfork a child that
// enters a new user namespace, so every spawn from Go copied the page tables
// of a multi-threaded runtime and paid copy-on-write faults and TLB
// shootdowns afterwards, and each spawn needed a fresh OS thread (the
// bounding set and the v1 cgroup are per thread). Here a spawn is a fork of
// a process of a few hundred KiB.
//
// Protocol. Descriptor 3 is one end of a SOCK_SEQPACKET socket pair whose
// other end the host holds. A request is one message: a struct request,
// then the strings it counts (path, args, env, each NUL-terminated), and
// as SCM_RIGHTS: a reply socket, the cgroup's spawn target (ncgroup
// descriptors: v2 the cgroup directory, v1 a `tasks` file per hierarchy)
// and the child's descriptors 1..nfiles (0 is /dev/null). The answer is
// one struct reply on the reply socket, with a pidfd of the child as
// SCM_RIGHTS on success. Requests are served one at a time, in order.
// The spawner reaps its children and exits when the host's end closes; the
// children keep running (a daemon's sandboxes outlive the daemon).
//
// A request with FLAG_IDMAP_NS asks for no child to run but for a user
// namespace to idmap mounts with (mount_setattr MOUNT_ATTR_IDMAP): its one
// string is the namespace's uid and gid map, in /proc/<pid>/uid_map's
// format, and it carries only the reply socket. The answer carries a
// descriptor of the namespace; the process made to hold it while its maps
// are written has exited by then.
//
// Only the host that started it can send requests (the socket pair is
// inherited, nothing is bound to a path), but every request is still
// checked against its own length and descriptor count: a bad one is
// answered with an error and never crashes the spawner.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/sched.h>
#include <linux/securebits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

// Keep in step with internal/spawner (encode, decodeReply).
#define REQUEST_MAGIC 0x31505357u // "WSP1" in little-endian byte order
#define FLAG_USERNS 2u // (bit 1, 1u, was "setsid": every child now gets its own session)
#define FLAG_CGROUP_V2 4u
#define FLAG_IDMAP_NS 8u
// The longest id map an FLAG_IDMAP_NS request may give.
#define MAX_IDMAP 256

#define MAX_REQUEST (64 << 10)
#define MAX_FILES 64
#define MAX_CGROUP_FDS 16
#define MAX_STRINGS 8192
// How long a child may take from its clone to its exec before the spawn
// is abandoned (the child is killed and the host told).
#define EXEC_TIMEOUT_MS 10000
// The only clone flags a request may ask for: new namespaces. Anything else
// (CLONE_VM, CLONE_FILES, CLONE_VFORK, ...) would share the spawner's own
// state with the child or stall the spawner.
#define NAMESPACE_FLAGS                                                                                  \
	((uint64_t)(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWCGROUP | \
		    CLONE_NEWUSER))

struct request {
	uint32_t magic;
	uint32_t flags;
	uint64_t cloneflags; // namespaces; CLONE_NEWUSER is added for FLAG_USERNS
	uint64_t keep_caps;  // bounding set the child keeps, a bit per capability
	uint32_t uid_host;   // FLAG_USERNS: ids 0..uid_size-1 map to uid_host..
	uint32_t uid_size;
	uint32_t ncgroup;
	uint32_t nfiles;
	uint32_t nargs;
	uint32_t nenv;
	uint32_t strbytes; // bytes of strings after the header: all the rest
	uint32_t timer_slack_ns; // the child's timer slack; 0 keeps the spawner's
};

struct reply {
	int32_t pid; // > 0 on success
	int32_t err; // errno of the failed step, 0 on success
	char what[200]; // the failed step, e.g. "exec /path"
};

// What a child that failed before its exec tells the spawner.
struct child_failure {
	int32_t err;
	int32_t step;
};

enum { STEP_SETGROUPS = 1, STEP_SETGID, STEP_SETUID, STEP_SETSID, STEP_BOUNDING, STEP_CAPS, STEP_FDS, STEP_SLACK, STEP_EXEC };

static const char *step_name(int step) {
	switch (step) {
	case STEP_SETGROUPS: return "setgroups";
	case STEP_SETGID: return "setresgid";
	case STEP_SETUID: return "setresuid";
	case STEP_SETSID: return "setsid";
	case STEP_BOUNDING: return "narrow the bounding set";
	case STEP_CAPS: return "clear inheritable and ambient capabilities";
	case STEP_FDS: return "set up descriptors";
	case STEP_SLACK: return "set the timer slack";
	default: return "exec";
	}
}

static int dev_null = -1;
static int no_clone3; // set once clone3 has failed with ENOSYS

static void logmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logmsg(const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	fputs("warren-spawner: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

// send_reply answers on fd; it returns 0 when the host got the answer.
static int send_reply(int fd, int pid, int pidfd, int err, const char *what) {
	struct reply r;
	memset(&r, 0, sizeof r);
	r.pid = pid;
	r.err = err;
	if (what != NULL)
		snprintf(r.what, sizeof r.what, "%s", what);
	struct iovec iov = {.iov_base = &r, .iov_len = sizeof r};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct msghdr mh;
	memset(&mh, 0, sizeof mh);
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	if (pidfd >= 0) {
		memset(&ctl, 0, sizeof ctl);
		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof ctl.buf;
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &pidfd, sizeof(int));
	}
	return sendmsg(fd, &mh, MSG_NOSIGNAL) == (ssize_t)sizeof r ? 0 : -1;
}

static int write_proc_file(long pid, const char *name, const char *data) {
	char path[64];
	snprintf(path, sizeof path, "/proc/%ld/%s", pid, name);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	size_t len = strlen(data);
	ssize_t n = write(fd, data, len);
	int saved = errno;
	close(fd);
	if (n == (ssize_t)len)
		return 0;
	errno = n < 0 ? saved : EIO;
	return -1;
}

// The kernel charges what a user namespace's processes hold against
// per-user limits (inotify instances, POSIX message queue bytes, queued
// signals, user namespaces, ...) at every level up to the host, at each
// level to the namespace's owner: the effective uid that created it. Made
// by the spawner as root, every sandbox's namespace was charged to host
// root, so a sandbox holding all its inotify instances left host root's
// daemons without any (issue #18, finding 8). So the spawner creates the
// namespace as the sandbox's own host uid (uid_host, what its root maps to):
// effective ids switched around the clone, with SECBIT_NO_SETUID_FIXUP so
// that the switch keeps the capabilities the clone needs (CLONE_INTO_CGROUP
// checks write access to the cgroup; the namespaces beside the user one).
// The real and saved ids stay root, and both are put back right after the
// clone, in the parent; the child's credentials in its new namespace start
// afresh (full capabilities there, default securebits).

// own_as makes the next user namespace this process creates owned by uid
// (and gid); 0 or an errno.
static void own_back(void);

static int own_as(uint32_t uid) {
	if (prctl(PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP, 0, 0, 0) < 0)
		return errno;
	if (syscall(SYS_setresgid, -1, uid, -1) < 0 || syscall(SYS_setresuid, -1, uid, -1) < 0) {
		int err = errno;
		own_back();
		return err;
	}
	return 0;
}

// own_back undoes own_as. Root's effective ids come back through the saved
// ones; failing that the spawner cannot go on safely.
static void own_back(void) {
	if (syscall(SYS_setresuid, -1, 0, -1) < 0 || syscall(SYS_setresgid, -1, 0, -1) < 0 ||
	    prctl(PR_SET_SECUREBITS, 0, 0, 0, 0) < 0) {
		logmsg("restore root's effective ids: %s", strerror(errno));
		abort();
	}
}

// child runs between the clone and the exec, in a copy of the spawner's
// memory: only system calls, no allocation, no stdio.
static void __attribute__((noreturn))
child(const struct request *req, const char *path, char *const argv[], char *const envp[],
      int sync_fd, int fail_fd, const int *files) {
	struct child_failure f = {0, 0};
	char go;
	// The spawner writes one byte once the id maps and the cgroup are in
	// place; EOF means it gave up.
	if (read(sync_fd, &go, 1) != 1)
		_exit(126);
#define FAIL(s)                  \
	do {                     \
		f.err = errno;   \
		f.step = (s);    \
		goto fail;       \
	} while (0)
	// No supplementary group of the host's comes along.
	if (setgroups(0, NULL) < 0)
		FAIL(STEP_SETGROUPS);
	if (req->flags & FLAG_USERNS) {
		// Become root of the new user namespace (uid 0 there is
		// uid_host on the host), or exec would drop every capability.
		if (syscall(SYS_setresgid, 0, 0, 0) < 0)
			FAIL(STEP_SETGID);
		if (syscall(SYS_setresuid, 0, 0, 0) < 0)
			FAIL(STEP_SETUID);
	}
	// Its own session: no controlling terminal of the host's.
	if (setsid() < 0)
		FAIL(STEP_SETSID);
	for (int cap = 0; cap < 64; cap++) {
		if (req->keep_caps & (1ULL << cap))
			continue;
		if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
			if (errno == EINVAL)
				break; // past the kernel's last capability
			FAIL(STEP_BOUNDING);
		}
	}
	// Nothing passes to what it execs but what its bounding set allows:
	// no inheritable or ambient capability of whoever started warren.
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
		FAIL(STEP_CAPS);
	struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
	struct __user_cap_data_struct caps[2];
	if (syscall(SYS_capget, &hdr, caps) < 0)
		FAIL(STEP_CAPS);
	caps[0].inheritable = caps[1].inheritable = 0;
	if (syscall(SYS_capset, &hdr, caps) < 0)
		FAIL(STEP_CAPS);
	// Address space randomisation on, whatever personality warren runs
	// with (setarch -R).
	personality(PER_LINUX);
	// Kept across the exec; what the child's threads and children inherit
	// (package internal/timerslack says why an agent wants a coarse one).
	if (req->timer_slack_ns != 0 && prctl(PR_SET_TIMERSLACK, (unsigned long)req->timer_slack_ns, 0, 0, 0) < 0)
		FAIL(STEP_SLACK);
	// Descriptors 0..nfiles: first the failure pipe and every source are
	// copied above all the targets, so that no dup2 overwrites one still
	// needed.
	int n = (int)req->nfiles;
	int fail_copy = fcntl(fail_fd, F_DUPFD_CLOEXEC, n + 1);
	if (fail_copy < 0)
		FAIL(STEP_FDS);
	fail_fd = fail_copy;
	int moved[MAX_FILES + 1];
	for (int i = 0; i <= n; i++) {
		moved[i] = fcntl(i == 0 ? dev_null : files[i - 1], F_DUPFD_CLOEXEC, n + 1);
		if (moved[i] < 0)
			FAIL(STEP_FDS);
	}
	for (int i = 0; i <= n; i++)
		if (dup2(moved[i], i) < 0)
			FAIL(STEP_FDS);
	// Everything else closes at exec, whatever the spawner inherited.
	if (syscall(SYS_close_range, n + 1, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
		FAIL(STEP_FDS);
	// Every signal to its default: the spawner ignores SIGPIPE and may
	// have inherited other ignored signals from whoever started warren;
	// none of that may reach the sandbox. A zeroed kernel sigaction is
	// SIG_DFL on every architecture's layout (the raw call also reaches
	// 32 and 33, which glibc's sigaction refuses to touch).
	for (int sig = 1; sig <= 64; sig++) {
		unsigned long dfl[4] = {0, 0, 0, 0};
		if (sig != SIGKILL && sig != SIGSTOP)
			syscall(SYS_rt_sigaction, sig, dfl, NULL, 8);
	}
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	execve(path, argv, envp);
	FAIL(STEP_EXEC);
fail:
	(void)!write(fail_fd, &f, sizeof f);
	_exit(127);
#undef FAIL
}

// wait_exec waits until the child has exec'd (fail_fd reads EOF) or
// reports why it could not; it returns 0, or an errno with *step set.
static int wait_exec(int fail_fd, int *step) {
	struct pollfd p = {.fd = fail_fd, .events = POLLIN};
	for (;;) {
		int n = poll(&p, 1, EXEC_TIMEOUT_MS);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			*step = -1;
			return n == 0 ? ETIMEDOUT : errno;
		}
		break;
	}
	struct child_failure f;
	ssize_t got = read(fail_fd, &f, sizeof f);
	if (got == 0)
		return 0;
	if (got == (ssize_t)sizeof f) {
		*step = f.step;
		return f.err != 0 ? f.err : EIO;
	}
	*step = -1;
	return got < 0 ? errno : EIO;
}

// serve_idmap answers a FLAG_IDMAP_NS request: a child is cloned into a
// new user namespace, does nothing but wait, and exits once the namespace
// has its maps and a descriptor; the descriptor keeps the namespace.
static void serve_idmap(const struct request *req, const char *map, int reply_fd, int nfds) {
	size_t n = req->strbytes;
	if (nfds != 1 || req->ncgroup != 0 || req->nfiles != 0 || req->nargs != 0 || req->nenv != 0 ||
	    n < 2 || n > MAX_IDMAP || map[n - 1] != '\0' || strlen(map) != n - 1) {
		send_reply(reply_fd, 0, -1, EINVAL, "malformed request: an id map request carries one map and no descriptors");
		return;
	}
	for (const char *c = map; *c != '\0'; c++) {
		if ((*c < '0' || *c > '9') && *c != ' ' && *c != '\n') {
			send_reply(reply_fd, 0, -1, EINVAL, "malformed request: an id map is digits, spaces and newlines");
			return;
		}
	}
	int sync_pipe[2];
	if (pipe2(sync_pipe, O_CLOEXEC) < 0) {
		send_reply(reply_fd, 0, -1, errno, "pipe");
		return;
	}
	long pid = syscall(SYS_clone, (unsigned long)(CLONE_NEWUSER | SIGCHLD), NULL, NULL, NULL, NULL);
	if (pid == 0) {
		// Only system calls here: wait for the parent to be done.
		char go;
		close(sync_pipe[1]);
		(void)!read(sync_pipe[0], &go, 1);
		_exit(0);
	}
	int err = pid < 0 ? errno : 0;
	char what[64] = "clone";
	close(sync_pipe[0]);
	const char *files[2] = {"uid_map", "gid_map"};
	for (int i = 0; i < 2 && err == 0; i++) {
		if (write_proc_file(pid, files[i], map) < 0) {
			err = errno;
			snprintf(what, sizeof what, "write %s", files[i]);
		}
	}
	int nsfd = -1;
	if (err == 0) {
		char path[64];
		snprintf(path, sizeof path, "/proc/%ld/ns/user", pid);
		nsfd = open(path, O_RDONLY | O_CLOEXEC);
		if (nsfd < 0) {
			err = errno;
			snprintf(what, sizeof what, "open the namespace");
		}
	}
	close(sync_pipe[1]); // the child exits
	if (pid > 0)
		waitpid((pid_t)pid, NULL, 0);
	if (err != 0)
		send_reply(reply_fd, 0, -1, err, what);
	else
		send_reply(reply_fd, 1, nsfd, 0, NULL);
	if (nsfd >= 0)
		close(nsfd);
}

// serve answers one request; fds[0] is its reply socket.
static void serve(char *msg, size_t len, const int *fds, int nfds) {
	int reply_fd = fds[0];
	struct request req;
	char what[160];
	if (len < sizeof req) {
		send_reply(reply_fd, 0, -1, EINVAL, "malformed request: shorter than its header");
		return;
	}
	memcpy(&req, msg, sizeof req);
	if (req.magic != REQUEST_MAGIC) {
		send_reply(reply_fd, 0, -1, EPROTO, "malformed request: not a warren spawner request (version mismatch?)");
		return;
	}
	if (req.flags & FLAG_IDMAP_NS) {
		if (req.strbytes != len - sizeof req) {
			send_reply(reply_fd, 0, -1, EINVAL, "malformed request: strings do not match the header");
			return;
		}
		serve_idmap(&req, msg + sizeof req, reply_fd, nfds);
		return;
	}
	if (req.ncgroup < 1 || req.ncgroup > MAX_CGROUP_FDS || req.nfiles > MAX_FILES ||
	    (int)(1 + req.ncgroup + req.nfiles) != nfds) {
		snprintf(what, sizeof what, "malformed request: names %u+%u descriptors, carries %d", req.ncgroup,
			 req.nfiles, nfds - 1);
		send_reply(reply_fd, 0, -1, EINVAL, what);
		return;
	}
	if (req.cloneflags & ~NAMESPACE_FLAGS) {
		send_reply(reply_fd, 0, -1, EINVAL, "malformed request: clone flags other than new namespaces");
		return;
	}
	uint64_t nstr = 1 + (uint64_t)req.nargs + req.nenv;
	if (req.strbytes != len - sizeof req || req.strbytes == 0 || msg[len - 1] != '\0' || req.nargs < 1 ||
	    nstr > MAX_STRINGS) {
		send_reply(reply_fd, 0, -1, EINVAL, "malformed request: strings do not match the header");
		return;
	}
	// path, argv..., NULL, envp..., NULL; the strings stay in msg.
	char **vec = calloc(nstr + 2, sizeof(char *));
	if (vec == NULL) {
		send_reply(reply_fd, 0, -1, ENOMEM, "allocate");
		return;
	}
	char *s = msg + sizeof req, *end = msg + len;
	for (uint64_t i = 0; i < nstr; i++) {
		if (s >= end) {
			free(vec);
			send_reply(reply_fd, 0, -1, EINVAL, "malformed request: fewer strings than counted");
			return;
		}
		vec[i < 1 + req.nargs ? i : i + 1] = s;
		s += strlen(s) + 1;
	}
	if (s != end || vec[0][0] == '\0') {
		free(vec);
		send_reply(reply_fd, 0, -1, EINVAL, s != end ? "malformed request: more strings than counted"
							     : "malformed request: no path");
		return;
	}
	const char *path = vec[0];
	char **argv = vec + 1, **envp = vec + 2 + req.nargs;

	int sync_pipe[2], fail_pipe[2];
	if (pipe2(sync_pipe, O_CLOEXEC) < 0) {
		send_reply(reply_fd, 0, -1, errno, "pipe");
		free(vec);
		return;
	}
	if (pipe2(fail_pipe, O_CLOEXEC) < 0) {
		send_reply(reply_fd, 0, -1, errno, "pipe");
		close(sync_pipe[0]);
		close(sync_pipe[1]);
		free(vec);
		return;
	}
	int pidfd = -1;
	struct clone_args ca;
	memset(&ca, 0, sizeof ca);
	ca.flags = req.cloneflags | CLONE_PIDFD;
	if (req.flags & FLAG_USERNS)
		ca.flags |= CLONE_NEWUSER;
	if (req.flags & FLAG_CGROUP_V2) {
		ca.flags |= CLONE_INTO_CGROUP;
		ca.cgroup = (uint64_t)fds[1];
	}
	ca.pidfd = (uint64_t)(uintptr_t)&pidfd;
	ca.exit_signal = SIGCHLD;
	long pid = -1;
	int into_cgroup = (ca.flags & CLONE_INTO_CGROUP) != 0;
	if (req.flags & FLAG_USERNS) {
		int e = own_as(req.uid_host);
		if (e != 0) {
			send_reply(reply_fd, 0, -1, e, "switch to the sandbox's uid to create its user namespace");
			close(sync_pipe[0]);
			close(sync_pipe[1]);
			close(fail_pipe[0]);
			close(fail_pipe[1]);
			free(vec);
			return;
		}
	}
	if (!no_clone3) {
		pid = syscall(SYS_clone3, &ca, sizeof ca);
		if (pid < 0 && errno == ENOSYS) {
			no_clone3 = 1;
			logmsg("clone3 unavailable (ENOSYS): using clone, and cgroup.procs on cgroup v2");
		}
	}
	if (no_clone3) {
		// clone(2) before Linux 5.3 or where a seccomp profile hides
		// clone3: no CLONE_INTO_CGROUP, so the child joins a v2 cgroup
		// through cgroup.procs before it is released, as on v1. The
		// pidfd comes back where the parent's tid would (CLONE_PIDFD).
		into_cgroup = 0;
		pid = syscall(SYS_clone, (unsigned long)((ca.flags & ~CLONE_INTO_CGROUP) | SIGCHLD), NULL, &pidfd, NULL, NULL);
	}
	int clone_errno = errno;
	if (pid != 0 && (req.flags & FLAG_USERNS))
		own_back();
	errno = clone_errno;
	if (pid == 0) {
		close(sync_pipe[1]);
		close(fail_pipe[0]);
		child(&req, path, argv, envp, sync_pipe[0], fail_pipe[1], fds + 1 + req.ncgroup);
	}
	close(sync_pipe[0]);
	close(fail_pipe[1]);
	int err = 0;
	if (pid < 0) {
		err = errno;
		snprintf(what, sizeof what, "clone");
	}
	if (err == 0 && (req.flags & FLAG_USERNS)) {
		char map[64];
		snprintf(map, sizeof map, "0 %u %u", req.uid_host, req.uid_size);
		const char *files[3][2] = {{"uid_map", map}, {"setgroups", "allow"}, {"gid_map", map}};
		for (int i = 0; i < 3 && err == 0; i++) {
			if (write_proc_file(pid, files[i][0], files[i][1]) < 0) {
				err = errno;
				snprintf(what, sizeof what, "write %s", files[i][0]);
			}
		}
	}
	if (err == 0) {
		// The child runs its life at the normal priority, in the normal
		// scheduling class and liable to the OOM killer like any other
		// process, whatever warren was started with (nice, chrt,
		// oom_score_adj). Before the cgroup join: a real-time task cannot
		// join a v1 cpu cgroup without a real-time budget.
		struct sched_param sp = {.sched_priority = 0};
		if (sched_setscheduler(pid, SCHED_OTHER, &sp) < 0 || setpriority(PRIO_PROCESS, pid, 0) < 0) {
			err = errno;
			snprintf(what, sizeof what, "reset the scheduling class and priority");
		} else if (write_proc_file(pid, "oom_score_adj", "0") < 0) {
			err = errno;
			snprintf(what, sizeof what, "reset oom_score_adj");
		}
	}
	if (err == 0 && !into_cgroup) {
		// The child joins every hierarchy before it runs anything of its
		// own: v1's tasks files, or v2's cgroup.procs without clone3.
		char num[24];
		int l = snprintf(num, sizeof num, "%ld", pid);
		for (uint32_t i = 0; i < req.ncgroup && err == 0; i++) {
			int fd = fds[1 + i], own = -1;
			if (req.flags & FLAG_CGROUP_V2)
				fd = own = openat(fds[1 + i], "cgroup.procs", O_WRONLY | O_CLOEXEC);
			if (fd < 0 || write(fd, num, l) != l) {
				err = errno;
				snprintf(what, sizeof what, "join cgroup");
			}
			if (own >= 0)
				close(own);
		}
	}
	if (err == 0 && write(sync_pipe[1], "x", 1) != 1) {
		err = errno;
		snprintf(what, sizeof what, "release child");
	}
	close(sync_pipe[1]);
	if (err == 0) {
		int step = 0;
		err = wait_exec(fail_pipe[0], &step);
		siginfo_t si;
		memset(&si, 0, sizeof si);
		if (err == 0 && waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid &&
		    si.si_code != CLD_EXITED) {
			// End of file on the pipe, but the child is already dead
			// of a signal: killed before or just as it exec'd (by the
			// OOM killer of a tiny memory cgroup, say). One that exec'd
			// and exited on its own is not a failed spawn. A best
			// effort: a kill that comes after this look is the host's
			// to see (the agent's setup fails). Left for the SIGCHLD
			// loop to reap.
			err = ECHILD;
			snprintf(what, sizeof what, "the child was killed before it ran (signal %d)", si.si_status);
			step = -2;
		}
		if (err != 0 && step == STEP_EXEC)
			snprintf(what, sizeof what, "exec %s", path);
		else if (err != 0 && step > 0)
			snprintf(what, sizeof what, "child: %s", step_name(step));
		else if (err != 0 && step == -1)
			snprintf(what, sizeof what, "wait for the child's exec");
	}
	close(fail_pipe[0]);
	if (err != 0) {
		if (pid > 0) {
			// Not waited for here: a child stuck in the kernel (an exec
			// from a hung file system) would stall every spawn. The
			// SIGCHLD loop reaps it when it goes.
			kill(pid, SIGKILL);
		}
		send_reply(reply_fd, 0, -1, err, what);
	} else if (send_reply(reply_fd, (int)pid, pidfd, 0, NULL) < 0) {
		// Nobody owns this child: the host gave up on the request.
		logmsg("reply for child %ld undelivered (%s); killing it", pid, strerror(errno));
		kill(pid, SIGKILL);
	}
	if (pidfd >= 0)
		close(pidfd);
	free(vec);
}

static int hung_up(int fd) {
	struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
	return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP)) != 0;
}

int main(void) {
	const int ctl = 3;
	if (fcntl(ctl, F_GETFD) < 0) {
		fprintf(stderr, "warren-spawner: no control socket; it is started by warren, not by hand\n");
		return 2;
	}
	fcntl(ctl, F_SETFD, FD_CLOEXEC);
	// Nothing of the environment warren was started in that its children
	// would inherit: a session and process group of its own (no terminal
	// signals), / as the working directory, the usual umask.
	setsid();
	if (chdir("/") < 0) {
		logmsg("chdir /: %s", strerror(errno));
		return 1;
	}
	umask(022);
	if (getenv("WARREN_SPAWNER_NO_CLONE3") != NULL) { // the tests' way to the fallback
		no_clone3 = 1;
		logmsg("clone3 disabled by WARREN_SPAWNER_NO_CLONE3: using clone, and cgroup.procs on cgroup v2");
	}
	// A child that dies before it is released closes its end of the sync
	// pipe: the write must fail with EPIPE, not kill the spawner. (The
	// child resets every signal before its exec.)
	signal(SIGPIPE, SIG_IGN);
	dev_null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (dev_null < 0) {
		logmsg("open /dev/null: %s", strerror(errno));
		return 1;
	}
	// Children are reaped from the main loop, through a signalfd.
	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, NULL);
	int sig_fd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sig_fd < 0) {
		logmsg("signalfd: %s", strerror(errno));
		return 1;
	}
	static char msg[MAX_REQUEST];
	union {
		char buf[CMSG_SPACE(sizeof(int) * (1 + MAX_CGROUP_FDS + MAX_FILES))];
		struct cmsghdr align;
	} oob;
	for (;;) {
		struct pollfd p[2] = {{.fd = ctl, .events = POLLIN}, {.fd = sig_fd, .events = POLLIN}};
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			logmsg("poll: %s", strerror(errno));
			return 1;
		}
		if (p[1].revents) {
			struct signalfd_siginfo si;
			while (read(sig_fd, &si, sizeof si) > 0) {
			}
			while (waitpid(-1, NULL, WNOHANG) > 0) {
			}
		}
		if (!p[0].revents)
			continue;
		struct iovec iov = {.iov_base = msg, .iov_len = sizeof msg};
		struct msghdr mh;
		memset(&mh, 0, sizeof mh);
		mh.msg_iov = &iov;
		mh.msg_iovlen = 1;
		mh.msg_control = oob.buf;
		mh.msg_controllen = sizeof oob.buf;
		ssize_t n = recvmsg(ctl, &mh, MSG_CMSG_CLOEXEC);
		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			logmsg("recvmsg: %s", strerror(errno));
			return 1;
		}
		int fds[1 + MAX_CGROUP_FDS + MAX_FILES];
		int nfds = 0;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < k; i++) {
				int fd;
				memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
				if (nfds < (int)(sizeof fds / sizeof fds[0]))
					fds[nfds++] = fd;
				else
					close(fd);
			}
		}
		if (n == 0 && nfds == 0 && hung_up(ctl))
			return 0; // the host closed its end
		if (nfds == 0) {
			logmsg("request without a reply socket dropped");
		} else if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
			send_reply(fds[0], 0, -1, EMSGSIZE, "malformed request: truncated");
		} else {
			serve(msg, (size_t)n, fds, nfds);
		}
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
	}
}
