# Warren Python REPL driver. Run as `python3 -I -u -c <this file>` by the Go
# package internal/guest/repl; see protocol.go for the frame format.
#
# fd 3 carries commands from the agent, fd 4 carries frames to it. Both are
# moved to high close-on-exec descriptors at start so user code and its
# subprocesses do not trip over them. The driver never writes to fd 1/2
# except the per-run end marker the agent strips.


def _warren_main():
    import ast
    import builtins
    import fcntl
    import io
    import json
    import linecache
    import os
    import signal
    import struct
    import sys
    import threading
    import traceback

    main_ns = sys.modules["__main__"].__dict__
    main_ns.pop("_warren_main", None)

    # Out of the way of the low descriptors user code expects to be free;
    # under a small RLIMIT_NOFILE (warren serve --open-files) as high as
    # the limit allows.
    def _high(fd):
        try:
            return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100)
        except OSError:
            return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5)

    rfd = _high(3)
    wfd = _high(4)
    os.close(3)
    os.close(4)

    hdr = struct.Struct(">cI")
    max_repr = 1 << 20
    max_error = 4096

    class State:
        armed = False  # a SIGINT now raises KeyboardInterrupt in user code
        critical = False  # the main thread is writing a frame
        pending = False  # a SIGINT arrived while critical
        fired = False  # the driver raised KeyboardInterrupt for this run
        limit = 1 << 20  # the default; a run may set its own
        cur = 1 << 20  # the running run's
        fwd = 0
        trunc = False

    st = State
    lock = threading.Lock()
    main_ident = threading.get_ident()

    def fire():
        st.armed = False
        st.fired = True
        raise KeyboardInterrupt

    def on_sigint(signum, frame):
        if not st.armed:
            return
        if st.critical:
            st.pending = True
            return
        fire()

    def send(tag, payload):
        data = hdr.pack(tag, len(payload)) + payload
        is_main = threading.get_ident() == main_ident
        if is_main:
            st.critical = True
        try:
            with lock:
                view = memoryview(data)
                while view:
                    try:
                        n = os.write(wfd, view)
                    except OSError:
                        os._exit(0)  # the agent is gone
                    view = view[n:]
        finally:
            if is_main:
                st.critical = False
        if is_main and st.pending:
            st.pending = False
            if st.armed:
                fire()

    def emit(tag, b):
        if not b:
            return
        room = st.cur - st.fwd
        if room <= 0:
            st.trunc = True
            return
        if len(b) > room:
            b = b[:room]
            st.trunc = True
        st.fwd += len(b)
        for i in range(0, len(b), 65536):
            send(tag, b[i : i + 65536])

    class FrameWriter(io.RawIOBase):
        def __init__(self, tag, fd):
            self._tag = tag
            self._fd = fd

        def writable(self):
            return True

        def write(self, b):
            b = bytes(b)
            emit(self._tag, b)
            return len(b)

        def fileno(self):
            return self._fd

        def isatty(self):
            return False

    def text_stream(tag, fd):
        return io.TextIOWrapper(
            FrameWriter(tag, fd),
            encoding="utf-8",
            errors="surrogateescape",
            write_through=True,
        )

    sys.stdout = text_stream(b"o", 1)
    sys.stderr = text_stream(b"e", 2)
    signal.signal(signal.SIGINT, on_sigint)

    # Notebook-like imports: the working directory, PYTHONPATH and the user
    # site come back now that the driver's own imports are done (-I hid them).
    extra = [""]
    extra += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[0:0] = extra
    try:
        import site

        user_site = site.getusersitepackages()
        if os.path.isdir(user_site):
            site.addsitedir(user_site)
    except Exception:
        pass

    def fd_id(fd):
        try:
            s = os.fstat(fd)
            return (s.st_dev, s.st_ino)
        except OSError:
            return None

    orig = (fd_id(1), fd_id(2))

    def write_marker(fd, ident, marker):
        if ident is None or fd_id(fd) != ident:
            return False
        try:
            view = memoryview(marker)
            while view:
                view = view[os.write(fd, view) :]
            return True
        except OSError:
            return False

    def type_name(e):
        t = type(e)
        name = getattr(t, "__qualname__", t.__name__)
        mod = getattr(t, "__module__", None)
        if mod not in (None, "builtins", "__main__"):
            name = mod + "." + name
        return name

    def summary(e):
        name = type_name(e)
        try:
            msg = str(e)
        except BaseException:
            msg = "<exception str() failed>"
        line = name + ": " + msg if msg else name
        lines = line.splitlines()
        line = lines[0] if lines else name
        return line[:max_error]

    def report(e, skip):
        tb = e.__traceback__
        while skip > 0 and tb is not None:
            tb = tb.tb_next
            skip -= 1
        try:
            text = "".join(traceback.format_exception(type(e), e, tb))
        except BaseException:
            text = summary(e) + "\n"
        emit(b"e", text.encode("utf-8", "surrogateescape"))

    def display(value, r):
        # What sys.__displayhook__ does, with the repr already made; a
        # hook the user installed is called as the interpreter would.
        if sys.displayhook is not sys.__displayhook__:
            sys.displayhook(value)
            return
        if value is None:
            return
        builtins._ = None
        sys.stdout.write(r + "\n")
        builtins._ = value

    buf = bytearray()

    def read_frame():
        while True:
            if len(buf) >= 5:
                tag, n = hdr.unpack_from(buf)
                if len(buf) >= 5 + n:
                    payload = bytes(buf[5 : 5 + n])
                    del buf[: 5 + n]
                    return tag, payload
            chunk = os.read(rfd, 1 << 20)
            if not chunk:
                os._exit(0)  # the agent closed the channel
            buf.extend(chunk)

    def run(cmd):
        rid = cmd["id"]
        code = cmd["code"]
        st.cur = int(cmd.get("limit") or st.limit)
        st.fwd = 0
        st.trunc = False
        st.fired = False
        st.pending = False
        status = "ok"
        result = None
        error = ""
        rtrunc = False
        fname = "<cell %d>" % rid
        linecache.cache[fname] = (len(code), None, code.splitlines(True), fname)
        try:
            tree = ast.parse(code, fname, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            # Compiled as the interactive interpreter compiles what is typed
            # at its prompt: every expression statement outside a function
            # prints its value (not None) through sys.displayhook, in order
            # with the rest of the output. The last one is evaluated apart
            # so its value is also the run's result.
            body = compile(ast.Interactive(tree.body), fname, "single", dont_inherit=True)
            expr = None
            if last is not None:
                expr = compile(last, fname, "eval", dont_inherit=True)
        except BaseException as e:
            # A compile-time error: the frames are the driver's, the
            # exception-only lines (with the caret) say it all.
            body = None
            status = "error"
            error = summary(e)
            report(e, 1 << 30)
        if body is not None:
            try:
                try:
                    value = None
                    st.armed = True
                    exec(body, main_ns)
                    if expr is not None:
                        value = eval(expr, main_ns)
                    st.armed = False
                    r = None if value is None else repr(value)
                    if expr is not None:
                        display(value, r)
                    if r is not None:
                        rb = r.encode("utf-8", "surrogateescape")
                        if len(rb) > max_repr:
                            r = rb[:max_repr].decode("utf-8", "replace")
                            rtrunc = True
                        result = r
                finally:
                    st.armed = False
            except KeyboardInterrupt as e:
                if st.fired:
                    status = "interrupted"
                else:
                    status = "error"
                    error = summary(e)
                    report(e, 1)
            except BaseException as e:
                status = "error"
                error = summary(e)
                report(e, 1)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        marker = cmd["marker"].encode("ascii")
        marks = [write_marker(1, orig[0], marker), write_marker(2, orig[1], marker)]
        frame = {
            "id": rid,
            "status": status,
            "result": result,
            "error": error,
            "truncated": st.trunc or rtrunc,
            "marks": marks,
        }
        send(b"r", json.dumps(frame).encode("ascii"))

    while True:
        try:
            tag, payload = read_frame()
            if tag == b"x":
                run(json.loads(payload))
            elif tag == b"c":
                cfg = json.loads(payload)
                st.limit = int(cfg.get("limit", st.limit))
                send(b"h", b"{}")
        except KeyboardInterrupt:
            pass  # a late interrupt for a run that already ended


_warren_main()
