# The session supervisor: the program of a session's sandbox (Python 3.9+, stdlib only).
#
# fd 0: call frames from the node; fd 1: event frames to the node; fd 2: diagnostics. A frame
# is a 4-byte big-endian length and a JSON object of at most 1 MiB. Calls are served one at a
# time, in order; `interrupt` and `kill` are served at once, even while a call runs.
# `run_code` runs in a kernel process forked from this one (its state lives apart; a dead
# kernel is replaced, `state_lost`), `exec` as a child in a process group of its own,
# `files_*` here, confined to /work. `fork_freeze` has the kernel fork a frozen copy of
# itself (it stops at once) for the node's twin copy; a branch's supervisor (started with
# FORKBOX_SESSION_TWIN=1) forks a kernel that stops where the twin is expected, and
# `fork_join` waits for that kernel to come back as the copy. See docs/protocol.md and
# docs/architecture.md.

# What every start needs; the rest (ast, base64, linecache, shutil, subprocess, traceback) is
# imported where it is first used, so the supervisor's start (and a session's open) does not
# wait for it: the kernel imports its own right after its fork.
import builtins
import codecs
import collections
import fcntl
import io
import json
import os
import resource
import select
import signal
import stat
import struct
import sys
import time
import types

MAX_FRAME = 1024 * 1024
# A result frame's room for outputs and data, below MAX_FRAME with a margin for the rest.
RESULT_ROOM = MAX_FRAME - 16 * 1024
CHUNK = 64 * 1024
WORK = "/work"
GRACE_S = 2.0
DEFAULT_TIMEOUT_MS = 30000
DEFAULT_OUTPUT_BYTES = 1024 * 1024
# What a files_read can return: its base64 must fit a frame.
READ_MAX = (RESULT_ROOM // 4) * 3
LIST_MAX = 10000
# The kernel's own pipes to its supervisor, at the same numbers in every kernel: a twin copied
# from a frozen kernel keeps its own pipes there, and the copied interpreter refers to them.
KERNEL_CALLS_FD, KERNEL_REPLIES_FD = 3, 4
# Set by the node for a branch's sandbox: its kernel waits, stopped, for the twin copy.
TWIN_ENV = "FORKBOX_SESSION_TWIN"
# How long the frozen fork and the twin's return may take.
FORK_WAIT_S = 30.0


class CallError(Exception):
    """A call that cannot be served: the result's `error`."""


class FrameError(ValueError):
    """Bytes on a frame pipe that are not a frame."""


# --- frames -------------------------------------------------------------------------------


def encode_frame(obj):
    body = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")
    return struct.pack(">I", len(body)) + body


def write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[n:]


class FrameReader:
    """Frames off a descriptor, from whatever bytes have arrived."""

    def __init__(self, fd):
        self.fd = fd
        self.buf = bytearray()
        self.closed = False

    def feed(self):
        try:
            data = os.read(self.fd, CHUNK)
        except InterruptedError:
            return
        if not data:
            self.closed = True
        self.buf += data

    def frames(self):
        out = []
        while len(self.buf) >= 4:
            (n,) = struct.unpack(">I", self.buf[:4])
            if n > MAX_FRAME:
                raise FrameError("a frame of %d bytes, over the bound" % n)
            if len(self.buf) < 4 + n:
                break
            body = bytes(self.buf[4 : 4 + n])
            del self.buf[: 4 + n]
            try:
                frame = json.loads(body)
            except ValueError as e:
                raise FrameError("a frame that is not JSON: %s" % e)
            if not isinstance(frame, dict):
                raise FrameError("a frame that is not a JSON object")
            out.append(frame)
        return out


# --- paths under /work ----------------------------------------------------------------------


def confined(path, what="path"):
    """The absolute path under /work for a call's path, or CallError naming it."""
    if not isinstance(path, str) or path == "" or "\0" in path:
        raise CallError("%s: %r is not a path" % (what, path))
    parts = path.split("/")
    if ".." in parts:
        raise CallError("%s %r: '..' is not allowed" % (what, path))
    full = os.path.normpath(path if path.startswith("/") else os.path.join(WORK, path))
    if full != WORK and not full.startswith(WORK + "/"):
        raise CallError("%s %r: outside %s" % (what, path, WORK))
    # A symlink planted on the way must not lead out of /work.
    parent = os.path.realpath(os.path.dirname(full)) if full != WORK else WORK
    if parent != WORK and not parent.startswith(WORK + "/"):
        raise CallError("%s %r: leads outside %s through a symlink" % (what, path, WORK))
    return full


def file_data(raw):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        import base64

        return {"b64": base64.b64encode(raw).decode("ascii")}


def data_bytes(data, what):
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, dict) and isinstance(data.get("b64"), str):
        import base64

        try:
            return base64.b64decode(data["b64"], validate=True)
        except ValueError as e:
            raise CallError("%s: invalid base64: %s" % (what, e))
    raise CallError("%s: file data is a string or {\"b64\": ...}" % what)


def os_error(e, path):
    return CallError("%s: %s" % (path, e.strerror or e))


def files_write(call):
    full = confined(call.get("path"))
    raw = data_bytes(call.get("data", ""), "data")
    try:
        os.makedirs(os.path.dirname(full), exist_ok=True)
        confined(call.get("path"))
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, raw)
        finally:
            os.close(fd)
    except OSError as e:
        raise os_error(e, call.get("path"))
    return {"size": len(raw)}


def files_read(call):
    full = confined(call.get("path"))
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise os_error(e, call.get("path"))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CallError("%s: not a regular file" % call.get("path"))
        if st.st_size > READ_MAX:
            raise CallError(
                "%s: %d bytes, over the %d bytes a read returns" % (call.get("path"), st.st_size, READ_MAX)
            )
        chunks, total = [], 0
        while True:
            b = os.read(fd, CHUNK)
            if not b:
                break
            total += len(b)
            if total > READ_MAX:
                raise CallError("%s: grew past %d bytes while read" % (call.get("path"), READ_MAX))
            chunks.append(b)
    finally:
        os.close(fd)
    return {"data": file_data(b"".join(chunks))}


def files_list(call):
    full = confined(call.get("path") or ".")
    entries = []
    try:
        with os.scandir(full) as it:
            for e in it:
                if len(entries) >= LIST_MAX:
                    raise CallError("%s: more than %d entries" % (call.get("path") or ".", LIST_MAX))
                st = e.stat(follow_symlinks=False)
                kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "file"
                entries.append({"name": e.name, "type": kind, "size": st.st_size})
    except OSError as e:
        raise os_error(e, call.get("path") or ".")
    entries.sort(key=lambda x: x["name"])
    return {"entries": entries}


def files_remove(call):
    full = confined(call.get("path"))
    if full == WORK:
        raise CallError("path %r: the working directory itself cannot be removed" % call.get("path"))
    try:
        st = os.lstat(full)
        if stat.S_ISDIR(st.st_mode):
            import shutil

            shutil.rmtree(full)
        else:
            os.unlink(full)
    except OSError as e:
        raise os_error(e, call.get("path"))
    return {}


# --- memory -------------------------------------------------------------------------------


def session_memory_kb():
    """What the sandbox's processes hold, counted as the init's memory budget counts it: each
    one's share of anonymous and shared memory (`smaps_rollup`, so pages a fork shares count
    once; resident counts of `status` where that cannot be read) and its page tables, in KiB."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/status" % name) as f:
                status = kb_fields(f)
            try:
                with open("/proc/%s/smaps_rollup" % name) as f:
                    rollup = kb_fields(f)
            except OSError:
                rollup = {}
        except (OSError, ValueError):
            continue
        if "Pss_Anon" in rollup and "Pss_Shmem" in rollup:
            held = rollup["Pss_Anon"] + rollup["Pss_Shmem"]
        else:
            held = status.get("RssAnon", 0) + status.get("RssShmem", 0)
        total += held + status.get("VmPTE", 0)
    return total


def kb_fields(lines):
    out = {}
    for line in lines:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[key] = int(parts[0])
    return out


# --- the kernel ---------------------------------------------------------------------------


def kernel_main(ctrl_r, ctrl_w, twin=False):
    """The kernel's loop: a cell per request on ctrl_r, its reply on ctrl_w. A twin's kernel
    stops once set up, and runs on only as the copy of a frozen kernel (`fork_frozen`)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.setdefault("MPLBACKEND", "Agg")
    global ast, base64, linecache, traceback
    import ast
    import base64
    import linecache
    import traceback

    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True, write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True, write_through=True)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    main_mod = types.ModuleType("__main__")
    main_mod.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main_mod
    ns = main_mod.__dict__
    if twin:
        os.kill(os.getpid(), signal.SIGSTOP)
        # Continued without the copy: this kernel has no state to serve.
        os._exit(75)
    reader = FrameReader(ctrl_r)
    count = 0
    while True:
        try:
            frames = reader.frames()
            if not frames:
                if reader.closed:
                    os._exit(0)
                reader.feed()
                continue
        except KeyboardInterrupt:
            # An interrupt between cells interrupts nothing.
            continue
        reap_frozen()
        for req in frames:
            if req.get("warm"):
                # A prepared session's throwaway cell (see Supervisor.warm_up): uncounted, in
                # a namespace of its own, its output discarded.
                warm_up_cell()
                write_all(ctrl_w, encode_frame({"execution_count": count, "warm": True}))
                continue
            if "env" in req:
                # A prepared session's environment, before any cell (see Supervisor.setup);
                # unanswered: the cells that follow on this pipe come after it.
                os.environ.update(req["env"])
                continue
            if req.get("fork"):
                reply = fork_frozen(count, req.get("checkpoint") is True)
            else:
                count += 1
                reply = run_cell(req.get("code", ""), count, ns)
            write_all(ctrl_w, encode_frame(reply))


def warm_up_cell():
    """Runs a throwaway cell through every step a session's cell takes (parse, compile, exec,
    eval, repr, display data, the flush), so the pages those paths write, shared with the
    warm zygote until written, are copied now rather than in the session's first cell."""
    ns = {"__builtins__": builtins}
    run_cell("def _f(x):\n    return [x, {'k': (x, 1.5)}]\n_f(1)", 0, ns)
    # Its output goes down the kernel's real stdout, which the supervisor drains.
    run_cell("print(1)\n1 / 0", 0, ns)
    linecache.cache.pop("<cell 0>", None)


# Frozen forks this kernel made, reaped once the node has killed them.
FROZEN = []


def reap_frozen():
    for pid in list(FROZEN):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            FROZEN.remove(pid)


def fork_frozen(count, checkpoint=False):
    """Forks a frozen copy F of this kernel, which stops at once. Here the parent answers with
    F's pid and its own pause; a twin made from F runs on below the stop, in its own sandbox,
    and answers its new supervisor instead (on the same descriptor numbers, its own pipes).

    A checkpoint's F lives on, stopped, beside the kernel: it lets go of the kernel's pipes
    first (the supervisor sees the kernel's end by its replies pipe closing), and, continued
    by anything but the twin copy (which gives it a supervisor's pipes again), it ends."""
    threads = []
    if "threading" in sys.modules:
        main = sys.modules["threading"].main_thread()
        threads = [t.name for t in sys.modules["threading"].enumerate() if t is not main]
    tasks = len(os.listdir("/proc/self/task"))
    flush()
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        if checkpoint:
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (1, 2):
                os.dup2(null, fd)
            os.close(null)
            for fd in (KERNEL_CALLS_FD, KERNEL_REPLIES_FD):
                os.close(fd)
        os.kill(os.getpid(), signal.SIGSTOP)
        if checkpoint and not fd_is_open(KERNEL_REPLIES_FD):
            # Continued where it was frozen, not as a twin: a checkpoint never runs.
            os._exit(75)
        # A twin, continued in the branch's sandbox by the node.
        FROZEN.clear()
        return {"execution_count": count, "twin": True, "reseeded": reseed()}
    pause_us = int((time.perf_counter() - started) * 1e6)
    FROZEN.append(pid)
    return {"execution_count": count, "frozen": pid, "kernel": os.getpid(), "pause_us": pause_us, "threads": threads, "tasks": tasks}


def fd_is_open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def reseed():
    """What the frozen fork seeded would repeat in every branch: seed it again (os.urandom,
    and so uuid4 and secrets, differ already)."""
    done = []
    rnd = sys.modules.get("random")
    if rnd is not None:
        rnd.seed()
        done.append("random")
    tmp = sys.modules.get("tempfile")
    if tmp is not None:
        tmp._name_sequence = None
        done.append("tempfile")
    mp = sys.modules.get("multiprocessing.process")
    if mp is not None:
        mp.current_process().authkey = os.urandom(32)
        done.append("multiprocessing")
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()
        done.append("numpy.random")
    return done


def cpu_ms_now():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime) * 1000.0


def run_cell(code, count, ns):
    filename = "<cell %d>" % count
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    reply = {"execution_count": count, "text": None, "data": {}, "exception": None, "interrupted": False}
    cpu0 = cpu_ms_now()
    try:
        try:
            tree = ast.parse(code, filename, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, filename, "exec"), ns)
            value = eval(compile(last, filename, "eval"), ns) if last is not None else None
            if value is not None:
                ns["_"] = value
                reply["text"] = safe_repr(value)
                reply["data"] = display_data(value)
            figures(reply["data"])
        except KeyboardInterrupt as e:
            reply["interrupted"] = True
            reply["exception"] = exception_of(e)
        except BaseException as e:  # noqa: B902 - the cell's SystemExit is its own exception
            reply["exception"] = exception_of(e)
        flush()
    except KeyboardInterrupt as e:
        # An interrupt that landed while the cell's result was being made.
        reply["interrupted"] = True
        reply["exception"] = exception_of(e)
    reply["cpu_ms"] = int(cpu_ms_now() - cpu0)
    return reply


def flush():
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:
            pass


def safe_repr(value):
    try:
        return repr(value)
    except Exception as e:
        return "<repr failed: %s: %s>" % (type(e).__name__, e)


def display_data(value):
    data = {"text/plain": safe_repr(value)}
    html = getattr(value, "_repr_html_", None)
    if callable(html):
        try:
            h = html()
            if isinstance(h, str):
                data["text/html"] = h
        except Exception:
            pass
    png = getattr(value, "_repr_png_", None)
    if callable(png):
        try:
            p = png()
            if isinstance(p, (bytes, bytearray)):
                data["image/png"] = base64.b64encode(bytes(p)).decode("ascii")
        except Exception:
            pass
    return data


def figures(data):
    """Open matplotlib figures become `image/png` (the last one wins), then are closed."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        for num in plt.get_fignums():
            buf = io.BytesIO()
            plt.figure(num).savefig(buf, format="png")
            data["image/png"] = base64.b64encode(buf.getvalue()).decode("ascii")
        plt.close("all")
    except Exception as e:
        print("figure: %s: %s" % (type(e).__name__, e), file=sys.stderr)


def exception_of(e):
    if isinstance(e, SyntaxError):
        lines = traceback.format_exception_only(type(e), e)
    else:
        # The kernel's own frame is not the cell's.
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        lines = traceback.format_exception(type(e), e, tb)
    text = "".join(lines)
    return {"name": type(e).__name__, "value": str(e), "traceback": text.rstrip("\n").split("\n")}


# --- the supervisor -----------------------------------------------------------------------


class Kernel:
    """A forked kernel, its control pipes and its output pipes."""

    def __init__(self, supervisor_fds, twin=False):
        ctrl_in_r, ctrl_in_w = os.pipe()
        ctrl_out_r, ctrl_out_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                for fd in supervisor_fds + [ctrl_in_w, ctrl_out_r, out_r, err_r]:
                    os.close(fd)
                devnull = os.open("/dev/null", os.O_RDONLY)
                os.dup2(devnull, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                for fd in (devnull, out_w, err_w):
                    os.close(fd)
                # Above the fixed numbers first, so neither lands on the other's.
                high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (ctrl_in_r, ctrl_out_w)]
                os.close(ctrl_in_r)
                os.close(ctrl_out_w)
                for fd, fixed in zip(high, (KERNEL_CALLS_FD, KERNEL_REPLIES_FD)):
                    os.dup2(fd, fixed, inheritable=False)
                    os.close(fd)
                kernel_main(KERNEL_CALLS_FD, KERNEL_REPLIES_FD, twin)
            finally:
                os._exit(70)
        for fd in (ctrl_in_r, ctrl_out_w, out_w, err_w):
            os.close(fd)
        # A twin's kernel is waited for until it has stopped, so the hello says it waits.
        self.waiting = twin and os.WIFSTOPPED(os.waitpid(pid, os.WUNTRACED)[1])
        self.pid = pid
        self.to = ctrl_in_w
        self.replies = FrameReader(ctrl_out_r)
        self.out = out_r
        self.err = err_r
        self.count = 0
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)

    def close(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        status = 0
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        for fd in (self.to, self.replies.fd, self.out, self.err):
            try:
                os.close(fd)
            except OSError:
                pass
        return status


class Stream:
    """One output stream of a call: streamed as events and kept whole, both within the cap."""

    def __init__(self, sup, cid, kind, cap):
        self.sup, self.cid, self.kind, self.cap = sup, cid, kind, cap
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.kept = []
        self.size = 0
        self.truncated = False

    def add(self, raw, final=False):
        room = self.cap - self.size
        if len(raw) > room:
            raw, self.truncated = raw[: max(room, 0)], True
        self.size += len(raw)
        text = self.decoder.decode(raw, final)
        if text:
            self.kept.append(text)
            for i in range(0, len(text), CHUNK // 4):
                self.sup.emit({"call": self.cid, "kind": self.kind, "data": text[i : i + CHUNK // 4]})

    def text(self):
        self.add(b"", final=True)
        return "".join(self.kept)


class Supervisor:
    def __init__(self, prepared=False):
        # A prepared supervisor was started ahead of its session, with none of the session's
        # environment or files: its first call must be `setup`, and no other call is served
        # before it.
        self.awaiting_setup = prepared
        # The protocol's descriptors move above 2, out of every child's reach (close-on-exec,
        # and closed in the kernel); stdio becomes /dev/null in, diagnostics out.
        self.calls_fd = os.dup(0)
        self.events_fd = os.dup(1)
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(2, 1)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.twin = os.environ.pop(TWIN_ENV, None) == "1"
        self.calls = FrameReader(self.calls_fd)
        self.queue = collections.deque()
        self.running_cell = False
        self.kernel = self.new_kernel()

    def new_kernel(self):
        # Only the first kernel of a branch waits for the copy; a replacement starts fresh.
        twin, self.twin = self.twin, False
        return Kernel([self.calls_fd, self.events_fd], twin)

    def emit(self, obj):
        frame = encode_frame(obj)
        if len(frame) - 4 > MAX_FRAME:
            frame = encode_frame({"call": obj.get("call"), "kind": "error", "error": "event over the frame bound", "reason": "invalid"})
        write_all(self.events_fd, frame)

    def read_calls(self):
        """Reads what the node sent; `interrupt` and `kill` are served at once."""
        self.calls.feed()
        try:
            frames = self.calls.frames()
        except FrameError as e:
            # Only the node writes here: nothing sensible can follow.
            print("forkbox session: from the node: %s" % e, file=sys.stderr)
            self.shutdown(2)
        for call in frames:
            op = call.get("op")
            if op == "kill":
                self.shutdown(0)
            if op == "interrupt":
                self.interrupt()
                if call.get("id"):
                    self.emit({"call": call["id"], "kind": "result", "ok": True, "error": None, "wall_ms": 0, "cpu_ms": 0, "session_memory_kb": session_memory_kb()})
                continue
            self.queue.append(call)
        if self.calls.closed:
            self.shutdown(0)

    def interrupt(self):
        if self.running_cell:
            try:
                os.kill(self.kernel.pid, signal.SIGINT)
            except ProcessLookupError:
                pass

    def shutdown(self, code):
        self.kernel.close()
        os._exit(code)

    def warm_up(self):
        """A prepared sandbox's warm-up before its hello: the kernel runs a throwaway cell and
        the supervisor takes a memory figure, so neither path is first run in the session's
        first call."""
        k = self.kernel
        write_all(k.to, encode_frame({"warm": True}))
        self.kernel_frame(k)
        self.drain_stale(k)
        session_memory_kb()

    def serve(self):
        if self.awaiting_setup:
            self.warm_up()
        hello = {"kind": "ready", "pid": os.getpid(), "python": sys.version.split()[0], "kernel": self.kernel.pid}
        if self.kernel.waiting:
            hello["twin_waiting"] = True
        self.emit(hello)
        while True:
            while not self.queue:
                select.select([self.calls_fd], [], [])
                self.read_calls()
            self.serve_call(self.queue.popleft())

    def serve_call(self, call):
        cid = call.get("id")
        op = call.get("op")
        started = time.monotonic()
        cpu0 = children_cpu_ms()
        try:
            if not isinstance(cid, str):
                raise CallError("the call has no id")
            if (op == "setup") != self.awaiting_setup:
                raise CallError("setup: only the first call of a prepared session" if op == "setup" else "the session is not set up")
            handler = {
                "setup": self.setup,
                "run_code": self.run_code,
                "exec": self.exec_call,
                "files_write": files_write,
                "files_read": files_read,
                "files_list": files_list,
                "files_remove": files_remove,
                "info": self.info,
                "fork_freeze": self.fork_freeze,
                "fork_join": self.fork_join,
            }.get(op)
            if handler is None:
                raise CallError("unknown op %r" % (op,))
            result = handler(call)
            result.setdefault("ok", True)
            result.setdefault("error", None)
        except CallError as e:
            result = {"ok": False, "error": str(e)}
        except Exception as e:
            result = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
        result.setdefault("cpu_ms", int(children_cpu_ms() - cpu0))
        result["wall_ms"] = int((time.monotonic() - started) * 1000)
        # The setup's answer goes to the engine alone, which has no use for it.
        if op != "setup":
            result["session_memory_kb"] = session_memory_kb()
        result["kind"] = "result"
        result["call"] = cid
        self.emit(fit(result))

    def setup(self, call):
        """What a fresh session has at its start, given to a prepared one: its environment
        (here and in the kernel, which has run no cell yet) and its files under /work."""
        env = call.get("env") or {}
        files = call.get("files") or {}
        if not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
            raise CallError("setup: env is an object of strings")
        if not isinstance(files, dict):
            raise CallError("setup: files is an object")
        # A kernel forked later (one replacing this one) inherits it from here.
        os.environ.update(env)
        write_all(self.kernel.to, encode_frame({"env": env}))
        for path, data in files.items():
            write_setup_file(path, data)
        self.awaiting_setup = False
        return {}

    def info(self, call):
        return {"info": {"execution_count": self.kernel.count, "memory_kb": session_memory_kb(), "python": sys.version.split()[0], "kernel_pid": self.kernel.pid}}

    # --- fork ---

    def fork_freeze(self, call):
        """Has the kernel fork a frozen copy of itself between cells; the kernel answers at
        once and serves on."""
        k = self.kernel
        self.drain_stale(k)
        write_all(k.to, encode_frame({"fork": True, "checkpoint": call.get("checkpoint") is True}))
        reply = self.kernel_frame(k)
        if reply is None or not isinstance(reply.get("frozen"), int):
            raise CallError("fork: the interpreter did not fork a frozen copy of itself")
        reply["supervisor"] = os.getpid()
        return {"frozen": reply}

    def fork_join(self, call):
        """Waits for this branch's kernel to run on as the copy of the parent's."""
        k = self.kernel
        reply = self.kernel_frame(k)
        if reply is None or reply.get("twin") is not True:
            raise CallError("fork: the branch's interpreter did not come back as the copy")
        k.count = reply["execution_count"]
        return {"twin": reply}

    def kernel_frame(self, k):
        """The kernel's next frame, within FORK_WAIT_S; None if it closed its pipe or sent
        something else."""
        deadline = time.monotonic() + FORK_WAIT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.calls_fd, k.replies.fd], [], [], left)
            if self.calls_fd in ready:
                self.read_calls()
            if k.replies.fd in ready:
                k.replies.feed()
                try:
                    frames = k.replies.frames()
                except FrameError:
                    return None
                if frames:
                    ok = isinstance(frames[0].get("execution_count"), int)
                    return frames[0] if ok else None
                if k.replies.closed:
                    return None

    # --- run_code ---

    def run_code(self, call):
        code = call.get("code")
        if not isinstance(code, str):
            raise CallError("run_code: code is a string")
        timeout = float(call.get("timeout_ms") or DEFAULT_TIMEOUT_MS) / 1000.0
        cap = int(call.get("output_bytes") or DEFAULT_OUTPUT_BYTES)
        k = self.kernel
        self.drain_stale(k)
        out = Stream(self, call["id"], "stdout", cap)
        err = Stream(self, call["id"], "stderr", cap)
        write_all(k.to, encode_frame({"code": code}))
        self.running_cell = True
        deadline = time.monotonic() + timeout
        timed_out = False
        reply = None
        open_fds = {k.out: out, k.err: err}
        try:
            while reply is None:
                now = time.monotonic()
                if now >= deadline:
                    if not timed_out:
                        timed_out = True
                        os.kill(k.pid, signal.SIGINT)
                        deadline = now + GRACE_S
                    else:
                        break
                watched = [self.calls_fd, k.replies.fd] + list(open_fds)
                ready, _, _ = select.select(watched, [], [], max(deadline - now, 0))
                for fd in ready:
                    if fd == self.calls_fd:
                        self.read_calls()
                    elif fd == k.replies.fd:
                        k.replies.feed()
                        try:
                            frames = k.replies.frames()
                        except FrameError:
                            # The session's own code can reach this pipe: a kernel whose
                            # replies cannot be read is replaced, as a dead one is.
                            frames, k.replies.closed = [], True
                        if frames and not isinstance(frames[0].get("execution_count"), int):
                            frames, k.replies.closed = [], True
                        if frames:
                            reply = frames[0]
                        elif k.replies.closed:
                            reply = False
                    else:
                        if not pump(fd, open_fds[fd]):
                            del open_fds[fd]
                if reply is False:
                    break
        finally:
            self.running_cell = False
        for fd, s in list(open_fds.items()):
            pump(fd, s)
        result = {"stdout": out.text(), "stderr": err.text(), "timed_out": timed_out, "state_lost": False, "interrupted": False}
        if out.truncated or err.truncated:
            result["output_truncated"] = True
        if reply:
            k.count = reply["execution_count"]
            result.update(reply)
            result["ok"] = result["exception"] is None
            if result["exception"] is not None:
                e = result["exception"]
                result["error"] = "%s: %s" % (e["name"], e["value"])
            return result
        # No reply: the kernel died during the cell, or would not stop after the grace.
        status = k.close()
        why = describe(status)
        self.kernel = self.new_kernel()
        result.update({"execution_count": None, "text": None, "data": {}, "exception": None, "state_lost": True, "ok": False})
        result["error"] = (
            "the cell did not stop within %.0f s of its timeout; the interpreter was restarted" % GRACE_S
            if timed_out
            else "the interpreter died during the cell (%s); a fresh one serves the session" % why
        )
        return result

    def drain_stale(self, k):
        """Output left by the last cell's background work belongs to no call."""
        for fd in (k.out, k.err):
            try:
                while os.read(fd, CHUNK):
                    pass
            except (BlockingIOError, OSError):
                pass

    # --- exec ---

    def exec_call(self, call):
        if call.get("argv") is not None:
            argv = call["argv"]
            if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
                raise CallError("exec: argv is a non-empty list of strings")
        elif isinstance(call.get("cmd"), str):
            argv = ["/bin/sh", "-c", call["cmd"]]
        else:
            raise CallError("exec: give cmd or argv")
        env = dict(os.environ)
        extra = call.get("env") or {}
        if not isinstance(extra, dict):
            raise CallError("exec: env is an object")
        env.update({str(k): str(v) for k, v in extra.items()})
        cwd = confined(call["cwd"], "cwd") if call.get("cwd") else WORK
        stdin = data_bytes(call["stdin"], "stdin") if call.get("stdin") is not None else b""
        timeout = float(call.get("timeout_ms") or DEFAULT_TIMEOUT_MS) / 1000.0
        cap = int(call.get("output_bytes") or DEFAULT_OUTPUT_BYTES)
        import subprocess

        try:
            child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env, start_new_session=True)
        except OSError as e:
            raise CallError("exec: %s: %s" % (argv[0], e.strerror or e))
        out = Stream(self, call["id"], "stdout", cap)
        err = Stream(self, call["id"], "stderr", cap)
        open_fds = {child.stdout.fileno(): out, child.stderr.fileno(): err}
        for fd in open_fds:
            os.set_blocking(fd, False)
        to_child = child.stdin.fileno()
        os.set_blocking(to_child, False)
        pending = memoryview(stdin)
        if not pending:
            child.stdin.close()
            to_child = None
        deadline = time.monotonic() + timeout
        timed_out = False
        exited_at = None
        status = None
        rusage = None
        while True:
            if status is None:
                pid, st, ru = os.wait4(child.pid, os.WNOHANG)
                if pid:
                    status, rusage, exited_at = st, ru, time.monotonic()
            now = time.monotonic()
            # Past the exit, output still held by leftover background processes is not waited
            # for long.
            if status is not None and (not open_fds or now - exited_at > 0.1):
                break
            if status is None and now >= deadline:
                timed_out = True
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                deadline = now + 3600
            writers = [to_child] if to_child is not None else []
            wait = 0.02 if status is None else 0.01
            ready, wready, _ = select.select([self.calls_fd] + list(open_fds), writers, [], wait)
            for fd in ready:
                if fd == self.calls_fd:
                    self.read_calls()
                elif not pump(fd, open_fds[fd]):
                    del open_fds[fd]
            if wready:
                try:
                    n = os.write(to_child, pending[:CHUNK])
                    pending = pending[n:]
                except BrokenPipeError:
                    pending = pending[:0]
                except BlockingIOError:
                    pass
                if not pending:
                    child.stdin.close()
                    to_child = None
        for fd, s in list(open_fds.items()):
            pump(fd, s)
        for f in (child.stdout, child.stderr, child.stdin):
            try:
                f.close()
            except OSError:
                pass
        child.returncode = 0
        result = {"stdout": out.text(), "stderr": err.text(), "timed_out": timed_out}
        if os.WIFSIGNALED(status):
            result["exit_code"], result["signal"] = 128 + os.WTERMSIG(status), os.WTERMSIG(status)
        else:
            result["exit_code"], result["signal"] = os.WEXITSTATUS(status), None
        if rusage is not None:
            result["cpu_ms"] = int((rusage.ru_utime + rusage.ru_stime) * 1000)
        result["ok"] = not timed_out
        result["error"] = "timed out" if timed_out else None
        if out.truncated or err.truncated:
            result["output_truncated"] = True
        return result


def write_setup_file(path, data):
    """One of a session's files, written as the launcher writes a fresh session's: parents
    made, the file created or truncated with the process's umask."""
    full = confined(path)
    raw = data_bytes(data, "files.%s" % path)
    try:
        os.makedirs(os.path.dirname(full), exist_ok=True)
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        try:
            write_all(fd, raw)
        finally:
            os.close(fd)
    except OSError as e:
        raise os_error(e, "files.%s" % path)


def pump(fd, stream):
    """Moves what a pipe holds into its stream; False once it is closed."""
    while True:
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return True
        except InterruptedError:
            continue
        except OSError:
            return False
        if not data:
            return False
        stream.add(data)


def children_cpu_ms():
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (c.ru_utime + c.ru_stime) * 1000.0


def describe(status):
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return "killed by %s" % name
    return "exit code %d" % os.WEXITSTATUS(status)


def fit(result):
    """Cuts a result's outputs and data so that its frame stays within MAX_FRAME."""
    size = len(json.dumps(result, ensure_ascii=False).encode("utf-8"))
    if size <= RESULT_ROOM:
        return result
    data = result.get("data") or {}
    for mime in ("image/png", "text/html"):
        if mime in data and size > RESULT_ROOM:
            size -= len(data.pop(mime))
            result.setdefault("dropped", []).append(mime)
    for key in ("stdout", "stderr", "text"):
        value = result.get(key)
        if size > RESULT_ROOM and isinstance(value, str) and value:
            over = size - RESULT_ROOM
            keep = max(len(value) - over - 64, 0)
            result[key] = value[:keep]
            result["output_truncated"] = True
            size = len(json.dumps(result, ensure_ascii=False).encode("utf-8"))
    return result


if __name__ == "__main__":
    # `--prepared`: started ahead of its session (engine/session_ahead.rs); the argument is
    # the engine's, not the session's, so its code sees the argv a fresh session's does.
    prepared = sys.argv[1:] == ["--prepared"]
    del sys.argv[1:]
    Supervisor(prepared).serve()
