"""The warm Python runtime's code inside the interpreter.

`warm_up` runs once in the zygote, before any sandbox exists: it imports the preload list and
reports what it loaded. It never sees a job, a credential or anything a job sent.

`prepare` runs once in each sandbox's launcher, after it hardened itself and before the sandbox
is announced ready: the interpreter's job-independent after-fork work, off the job's clock.

`run` runs in a sandbox's launcher after every isolation step a cold job gets (namespaces,
root, rlimits, no_new_privs, no capabilities, the seccomp filter, closed descriptors). It turns
the forked, already-initialised interpreter into the job's `python3 ...` process: the job's
environment, fresh standard streams, fresh randomness, `sys.argv` and `sys.path`, a fresh
`__main__`, then the program, ending as python3 ends (SystemExit handling, thread joins,
atexit, flushing the streams, the program's finalizers).
"""

# What every job's start and exit use is imported here, in the zygote, whatever the preload.
import atexit
import builtins
import gc
import io
import json
import os
import signal
import sys
import weakref

_STUB_FILE = "<forkbox-warm>"


# What a session's supervisor and kernel import beyond the above (`session_supervisor.py`):
# imported here too, so a session's start and its first `run_code` do not wait for them,
# whatever the preload.
_SESSION_MODULES = ("ast", "base64", "linecache", "resource", "select", "traceback")

# Programs compiled here once, by their source: a `-c` program whose text is one of them
# (the session supervisor's) runs this code object instead of being compiled again in every
# sandbox. The same `compile` call a job's `-c` gets, so the code is the same.
_PRECOMPILED = {}


def warm_up(preload_hex, fd, precompile_hex=""):
    names = json.loads(bytes.fromhex(preload_hex))
    for name in _SESSION_MODULES:
        __import__(name)
    for source in json.loads(bytes.fromhex(precompile_hex) or b"[]"):
        _PRECOMPILED[source] = compile(source, "<string>", "exec")
    loaded, failed = [], []
    for name in names:
        try:
            __import__(name)
            loaded.append(name)
        except BaseException as exc:  # a module missing on this host is reported, not fatal
            failed.append([name, f"{type(exc).__name__}: {exc}"])
    info = {
        "version": sys.version,
        "executable": sys.executable,
        "preloaded": loaded,
        "failed": failed,
        "modules": sorted({m.partition(".")[0] for m in sys.modules}),
    }
    with os.fdopen(fd, "w", closefd=False) as out:
        out.write(json.dumps(info))
    # Objects that exist now are never collected by a job's collector: its passes do not touch
    # (and copy) the pages of the shared heap.
    gc.collect()
    gc.freeze()


def prepare():
    """In the launcher, before its sandbox is ready (see `python.rs::prepare`): what does not
    depend on the job, and one pass over throwaway data through the code a job's start and
    exit run (the plan's decoding, a text stream, the compiler, the collector), so the pages of
    the inherited heap it touches are copied now rather than on the job's clock."""
    _reseed()
    if "time" in sys.modules:
        # The sandbox's own /etc/localtime, as a cold python3 would read it; the job's start
        # reads it again only if its TZ differs from this environment's.
        sys.modules["time"].tzset()
    json.loads('{"mode": "command", "argv": ["-c"], "env": [["K", "V"]], "unbuffered": false}')
    _set_environ(list(os.environ.items()))  # the same environment again: no change
    with open(os.devnull, "w", encoding="utf-8", errors="strict", newline="\n") as stream:
        stream.write("")
    exec(compile("pass", "<string>", "exec"), {"__builtins__": builtins})
    # Python's signal handlers are not installed here: a signal caught while the sandbox waits
    # would stay pending into the job. Until the job, a signal kills the launcher as before.
    _release_zygote_stdio()
    gc.collect()


def _python_signals():
    """As python3 sets them at start-up (the zygote keeps its own dispositions)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


# The zygote's standard streams' encoding and errors, for the job's own (see `_open_stdio`).
_STDIO_CODECS = {}


def _release_zygote_stdio():
    """Keeps the zygote's streams' codecs and frees the stream objects, so the job's start
    only builds its own."""
    for name in ("stdin", "stdout", "stderr"):
        old = getattr(sys, f"__{name}__", None)
        _STDIO_CODECS[name] = (getattr(old, "encoding", None), getattr(old, "errors", None))
        setattr(sys, name, None)
        setattr(sys, f"__{name}__", None)


def run(plan_hex):
    plan = json.loads(bytes.fromhex(plan_hex))
    _become_process(plan)
    try:
        _start(plan)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:
        _report_uncaught(exc)
        code = 1
    _finalize(code)


def _exit_code(exc):
    """python3's handling of an uncaught SystemExit (`_Py_HandleSystemExit`)."""
    value = exc.code
    if value is None:
        return 0
    if isinstance(value, int):
        # exit() takes a C int; out of a long's range it is -1, as in CPython.
        return (value if -(2**63) <= value < 2**63 else -1) & 0xFF
    try:
        sys.stderr.write(str(value) + "\n")
    except BaseException:
        pass
    return 1


def _finalize(code):
    """python3's exit path (`Py_FinalizeEx`) for what a program can observe: non-daemon threads
    joined, atexit handlers, the streams flushed (120 when stdout cannot be), the program's
    garbage collected and its `__main__` cleared (so its finalizers run), the streams flushed
    again. The interpreter's own teardown, which would walk (and copy) every inherited page of
    the preloaded modules, is skipped: the process exits here."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            pass
    atexit._run_exitfuncs()
    ok = _flush_std()
    # As finalize_modules: the last exception is dropped, __main__ leaves sys.modules, garbage
    # is collected (finalizers run in the collector's order), and what still lives is cleared
    # as _PyModule_ClearDict does (_private names first, then the rest).
    for name in ("last_type", "last_value", "last_traceback"):
        setattr(sys, name, None)
    main = sys.modules.pop("__main__", None)
    ref = weakref.ref(main) if main is not None else lambda: None
    del main
    gc.collect()
    main = ref()
    if main is not None:
        namespace = main.__dict__
        for key in [k for k in namespace if k[:1] == "_" and k[1:2] != "_"]:
            namespace[key] = None
        for key in [k for k in namespace if k != "__builtins__"]:
            namespace[key] = None
        del main, namespace
    gc.collect()
    ok = _flush_std(report=False) and ok
    os._exit(code if ok else 120)


def _flush_std(report=True):
    ok = True
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        if stream is None or getattr(stream, "closed", False):
            continue
        try:
            stream.flush()
        except BaseException as exc:
            ok = False
            if name == "stdout" and report:
                import traceback

                try:
                    sys.stderr.write(
                        f"Exception ignored in: {stream!r}\n"
                        + "".join(traceback.format_exception_only(type(exc), exc))
                    )
                except BaseException:
                    pass
    return ok


def _become_process(plan):
    # The job's streams first, so anything that fails from here on is reported on them.
    _open_stdio(plan["unbuffered"])
    tz = os.environ.get("TZ")
    _set_environ(plan["env"])
    if "time" in sys.modules and os.environ.get("TZ") != tz:
        sys.modules["time"].tzset()
    _python_signals()
    sys.argv = list(plan["argv"])
    sys.orig_argv = list(plan["orig_argv"])
    sys.dont_write_bytecode = plan["dont_write_bytecode"]
    if plan["pythonpath"]:
        # As python3 builds it: absolute, normalised, duplicates dropped (site.removeduppaths).
        seen, path = set(), []
        for entry in [os.path.abspath(p) for p in plan["pythonpath"]] + sys.path:
            if entry not in seen:
                seen.add(entry)
                path.append(entry)
        sys.path[:] = path
    if plan["warnoptions"]:
        import warnings

        sys.warnoptions[:] = plan["warnoptions"]
        warnings._processoptions(sys.warnoptions)


def _set_environ(env):
    """The job's environment, in the C environ and in os.environ, as os.environ's own
    `clear()` and `update()` would set them (unsetenv, putenv and its encoded mapping), without
    their generic MutableMapping loops: every Python function a job's start runs copies pages
    of the inherited heap."""
    environ = os.environ
    data = environ._data
    for key in list(data):
        os.unsetenv(key)
    data.clear()
    for name, value in env:
        key, value = environ.encodekey(name), environ.encodevalue(value)
        os.putenv(key, value)
        data[key] = value


def _reseed():
    """Everything seeded before the fork would repeat in every job: seed it again here."""
    rnd = sys.modules.get("random")
    if rnd is not None:
        rnd.seed()
    tmp = sys.modules.get("tempfile")
    if tmp is not None:
        tmp._name_sequence = None
        tmp.tempdir = None
    mp = sys.modules.get("multiprocessing.process")
    if mp is not None:
        mp.current_process().authkey = os.urandom(32)
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()


def _open_stdio(unbuffered):
    """The standard streams as python3 creates them (its create_stdio), on the job's fds."""
    spec = [("stdin", 0, False), ("stdout", 1, True), ("stderr", 2, True)]
    for name, fd, write in spec:
        encoding, errors = _STDIO_CODECS.get(name, (None, None))
        encoding = encoding or "utf-8"
        errors = errors or ("backslashreplace" if fd == 2 else "strict")
        buffering = 0 if (unbuffered and write) else -1
        try:
            buf = io.open(fd, "wb" if write else "rb", buffering, closefd=False)
        except OSError:
            stream = None
        else:
            raw = buf if buffering == 0 else buf.raw
            raw.name = f"<{name}>"
            tty = raw.isatty()
            stream = io.TextIOWrapper(
                buf,
                encoding,
                errors,
                "\n",
                line_buffering=not unbuffered and (tty or fd == 2),
                write_through=unbuffered and write,
            )
            stream.mode = "w" if write else "r"
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _fresh_main():
    loader = sys.modules["__main__"].__loader__
    main = type(sys)("__main__")
    main.__builtins__ = builtins
    main.__loader__ = loader
    main.__annotations__ = {}
    sys.modules["__main__"] = main
    return main


def _start(plan):
    mode = plan["mode"]
    main = _fresh_main()
    if mode == "command":
        if not plan["safe_path"]:
            sys.path.insert(0, "")
        code = _PRECOMPILED.get(plan["code"]) or compile(plan["code"], "<string>", "exec")
        exec(code, main.__dict__)
    elif mode == "stdin":
        if not plan["safe_path"]:
            sys.path.insert(0, "")
        source = sys.stdin.buffer.read()
        exec(compile(source, "<stdin>", "exec"), main.__dict__)
    elif mode == "module":
        import runpy

        if not plan["safe_path"]:
            sys.path.insert(0, os.getcwd())
        runpy._run_module_as_main(plan["module"], alter_argv=True)
    else:
        _run_file(plan, main)


def _run_file(plan, main):
    path = plan["path"]
    # python3 makes the script's path absolute without normalising it.
    full = path if path.startswith("/") else os.getcwd().rstrip("/") + "/" + path
    if os.path.isdir(full) or _is_zip(full):
        # A directory or zip archive with a __main__ module, run as python3 does.
        import runpy

        sys.path.insert(0, full)
        runpy._run_module_as_main("__main__", alter_argv=False)
        return
    try:
        with open(full, "rb") as f:
            source = f.read()
    except OSError as exc:
        print(
            f"{plan['orig_argv'][0]}: can't open file {full!r}: "
            f"[Errno {exc.errno}] {exc.strerror}",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    if not plan["safe_path"]:
        sys.path.insert(0, os.path.dirname(os.path.realpath(full)))
    external = sys.modules["_frozen_importlib_external"]
    main.__file__ = full
    main.__cached__ = None
    main.__loader__ = external.SourceFileLoader("__main__", full)
    code = compile(source, full, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _is_zip(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def _report_uncaught(exc):
    """Prints the traceback python3 would print: without this module's frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == _STUB_FILE:
        tb = tb.tb_next
    exc.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    try:
        sys.excepthook(type(exc), exc, tb)
    except BaseException:
        sys.__excepthook__(type(exc), exc, tb)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
