// Warren Node.js REPL driver. Run as `node -e <this file>` by the Go package
// internal/guest/repl; see protocol.go for the frame format.
//
// fd 3 carries commands from the agent, fd 4 carries frames to it. Both are
// reopened as close-on-exec descriptors at start so subprocesses do not
// inherit them. The driver never writes to fd 1/2 except the per-run end
// marker the agent strips.
(function warrenDriver() {
  'use strict';
  const fs = require('fs');
  const net = require('net');
  const stream = require('stream');
  const util = require('util');
  const vm = require('vm');

  const MAX_REPR = 1 << 20;
  const MAX_ERROR = 4096;

  // reopen gives a close-on-exec copy of an inherited pipe (node opens every
  // file with O_CLOEXEC) and closes the original.
  function reopen(fd, flags) {
    try {
      const nfd = fs.openSync('/proc/self/fd/' + fd, flags);
      fs.closeSync(fd);
      return nfd;
    } catch (e) {
      return fd;
    }
  }
  const rfd = reopen(3, 'r');
  const wfd = reopen(4, 'w');

  // limit is the default; a run may set its own (cur).
  const st = { limit: 1 << 20, cur: 1 << 20, fwd: 0, trunc: false };

  function writeAll(fd, buf) {
    let off = 0;
    while (off < buf.length) {
      off += fs.writeSync(fd, buf, off, buf.length - off);
    }
  }

  function send(tag, payload) {
    const frame = Buffer.allocUnsafe(5 + payload.length);
    frame[0] = tag;
    frame.writeUInt32BE(payload.length, 1);
    payload.copy(frame, 5);
    try {
      writeAll(wfd, frame);
    } catch (e) {
      process.reallyExit(0); // the agent is gone
    }
  }

  const TAG_OUT = 0x6f; // 'o'
  const TAG_ERR = 0x65; // 'e'

  function emit(tag, chunk, encoding) {
    let b;
    if (typeof chunk === 'string') {
      b = Buffer.from(chunk, Buffer.isEncoding(encoding) ? encoding : 'utf8');
    } else if (chunk instanceof Uint8Array) {
      b = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    } else {
      b = Buffer.from(String(chunk), 'utf8');
    }
    if (b.length === 0) return;
    const room = st.cur - st.fwd;
    if (room <= 0) {
      st.trunc = true;
      return;
    }
    if (b.length > room) {
      b = b.subarray(0, room);
      st.trunc = true;
    }
    st.fwd += b.length;
    for (let i = 0; i < b.length; i += 65536) {
      send(tag, b.subarray(i, i + 65536));
    }
  }

  // Replacement process.stdout/stderr: the real streams are never created,
  // so fd 1/2 stay blocking for subprocesses that inherit them.
  function frameStream(tag, fd) {
    const w = new stream.Writable({
      decodeStrings: false,
      write(chunk, encoding, cb) {
        emit(tag, chunk, encoding);
        cb();
      },
    });
    // Write synchronously, bypassing the Writable buffering, so frames keep
    // their order with writes made straight to fd 1/2.
    w.write = function (chunk, encoding, cb) {
      if (typeof encoding === 'function') {
        cb = encoding;
        encoding = undefined;
      }
      emit(tag, chunk, encoding);
      if (typeof cb === 'function') process.nextTick(cb);
      return true;
    };
    w.fd = fd;
    w.isTTY = false;
    w._isStdio = true;
    w.destroySoon = w.destroy;
    w._destroy = function (err, cb) {
      cb(err); // never close the channel
    };
    return w;
  }
  const out = frameStream(TAG_OUT, 1);
  const err = frameStream(TAG_ERR, 2);
  Object.defineProperty(process, 'stdout', { configurable: true, enumerable: true, get: () => out });
  Object.defineProperty(process, 'stderr', { configurable: true, enumerable: true, get: () => err });

  function errText(s) {
    emit(TAG_ERR, s.endsWith('\n') ? s : s + '\n');
  }

  // cleanStack drops the driver's and node's frames from an error's stack.
  function cleanStack(e) {
    let s;
    try {
      s = e && typeof e === 'object' && typeof e.stack === 'string' ? e.stack : 'Uncaught ' + util.inspect(e);
    } catch (x) {
      s = 'Uncaught exception';
    }
    return s
      .split('\n')
      .filter((l) => !/^\s+at .*(node:vm|node:internal|\[eval\]|warrenDriver)/.test(l))
      .join('\n');
  }

  function summary(e) {
    let s;
    try {
      if (e instanceof Error || (e && typeof e === 'object' && 'message' in e && 'name' in e)) {
        s = e.message ? String(e.name) + ': ' + String(e.message) : String(e.name);
      } else {
        s = 'Uncaught ' + util.inspect(e);
      }
    } catch (x) {
      s = 'Uncaught exception';
    }
    s = s.split('\n')[0];
    return s.length > MAX_ERROR ? s.slice(0, MAX_ERROR) : s;
  }

  // Errors thrown outside of a run keep the interpreter alive.
  process.on('uncaughtException', (e) => errText('Uncaught ' + cleanStack(e)));
  process.on('unhandledRejection', (e) => errText('Unhandled rejection: ' + cleanStack(e)));
  // SIGINT stops synchronous code via breakOnSigint; at other times it must
  // not kill the interpreter. Async waits are interrupted by 'i' frames.
  process.on('SIGINT', () => {});

  function compiles(src, filename) {
    try {
      new vm.Script(src, { filename });
      return true;
    } catch (e) {
      return false;
    }
  }

  // wrapAsync turns code that uses top-level await into an async function
  // call. When the trailing lines form an expression, it is returned so its
  // value becomes the result. Declarations inside are local to the run.
  function wrapAsync(code, filename) {
    const lines = code.split('\n');
    const head = '(async () => {';
    for (let k = lines.length - 1; k >= 0 && k >= lines.length - 50; k--) {
      const tail = lines.slice(k).join('\n').replace(/[\s;]+$/, '');
      if (!tail.trim()) continue;
      const src = head + lines.slice(0, k).join('\n') + '\nreturn (' + tail + '\n);\n})()';
      if (compiles(src, filename)) return src;
    }
    const src = head + code + '\n})()';
    return compiles(src, filename) ? src : null;
  }

  const INTERRUPT = Symbol('interrupt');
  let running = null; // {id, reject} while awaiting a promise

  function bounded(r) {
    let trunc = false;
    if (r.length > MAX_REPR || Buffer.byteLength(r) > MAX_REPR) {
      r = Buffer.from(r.slice(0, MAX_REPR)).subarray(0, MAX_REPR).toString();
      trunc = true;
    }
    return [r, trunc];
  }

  let stdoutId = null;
  let stderrId = null;
  function fdId(fd) {
    try {
      const s = fs.fstatSync(fd);
      return s.dev + ':' + s.ino;
    } catch (e) {
      return null;
    }
  }
  function writeMarker(fd, ident, marker) {
    if (ident === null || fdId(fd) !== ident) return false;
    try {
      writeAll(fd, marker);
      return true;
    } catch (e) {
      return false;
    }
  }

  async function run(cmd) {
    const id = cmd.id;
    const filename = 'cell-' + id;
    st.cur = Number.isInteger(cmd.limit) && cmd.limit > 0 ? cmd.limit : st.limit;
    st.fwd = 0;
    st.trunc = false;
    let status = 'ok';
    let result = null;
    let error = '';
    let rtrunc = false;
    try {
      let script;
      try {
        script = new vm.Script(cmd.code, { filename });
      } catch (e) {
        const src = e instanceof SyntaxError && /\bawait\b/.test(cmd.code) ? wrapAsync(cmd.code, filename) : null;
        if (src === null) throw e;
        script = new vm.Script(src, { filename });
      }
      let v = script.runInThisContext({ breakOnSigint: !!cmd.interruptible });
      if (util.types.isPromise(v)) {
        v = await new Promise((resolve, reject) => {
          running = { id, reject };
          v.then(resolve, reject);
        });
      }
      if (v !== undefined) {
        // Printed as node's REPL prints a completion value (undefined is
        // not), in order with the run's output; and kept as the result.
        const shown = util.inspect(v, { showProxy: true });
        emit(TAG_OUT, shown + '\n');
        [result, rtrunc] = bounded(shown);
      }
    } catch (e) {
      if (e === INTERRUPT || (e instanceof Error && e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED')) {
        status = 'interrupted';
      } else {
        status = 'error';
        error = summary(e);
        errText(cleanStack(e));
      }
    } finally {
      running = null;
    }
    const marker = Buffer.from(cmd.marker, 'latin1');
    const marks = [writeMarker(1, stdoutId, marker), writeMarker(2, stderrId, marker)];
    const frame = { id, status, result, error, truncated: st.trunc || rtrunc, marks };
    send(0x72 /* 'r' */, Buffer.from(JSON.stringify(frame)));
  }

  let queue = Promise.resolve();
  let chunks = []; // unparsed input, joined only once a frame is complete
  let total = 0;
  function onFrame(tag, payload) {
    let msg;
    try {
      msg = JSON.parse(payload.toString('utf8'));
    } catch (e) {
      return;
    }
    switch (tag) {
      case 0x78: // 'x': run code
        queue = queue.then(() => run(msg)).catch(() => {});
        break;
      case 0x69: // 'i': interrupt the run awaiting a promise
        if (running && running.id === msg.id) running.reject(INTERRUPT);
        break;
      case 0x63: // 'c': configure
        if (Number.isInteger(msg.limit)) st.limit = msg.limit;
        stdoutId = fdId(1);
        stderrId = fdId(2);
        send(0x68 /* 'h' */, Buffer.from('{}'));
        break;
    }
  }

  const ctl = new net.Socket({ fd: rfd, readable: true, writable: false });
  ctl.on('data', (chunk) => {
    chunks.push(chunk);
    total += chunk.length;
    while (total >= 5) {
      let head = chunks[0];
      if (head.length < 5) {
        head = Buffer.concat(chunks, total);
        chunks = [head];
      }
      const n = head.readUInt32BE(1);
      if (total < 5 + n) break;
      const all = chunks.length === 1 ? head : Buffer.concat(chunks, total);
      const rest = all.subarray(5 + n);
      chunks = rest.length ? [rest] : [];
      total = rest.length;
      onFrame(all[0], all.subarray(5, 5 + n));
    }
  });
  ctl.on('end', () => process.reallyExit(0));
  ctl.on('error', () => process.reallyExit(0));
})();
