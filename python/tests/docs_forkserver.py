"""The docs runner's fork server: one interpreter that has imported torch, transformers and
favor forks a child for every `python` a docs block runs, so the blocks do not pay Python's,
torch's and transformers' start-up (~2-4 s each) fifty times (docs/reliability.md, "Docs that
run").

    server:  python docs_forkserver.py serve SOCKET     (docs_blocks.ForkServer starts it)
    client:  python -S -E docs_forkserver.py SOCKET ARGS...   (the `python` shim of a block)

The client hands the server its stdin, stdout and stderr (SCM_RIGHTS), its argv, working
directory and environment; the server forks, the child takes those over and runs the script
as `python` would (`python FILE ...`, `python -m MODULE ...`, `python -c CODE ...`: sys.argv,
sys.path[0], __main__, sys.exit codes, atexit, an uncaught exception's traceback and exit
status 1), then sends back its exit status, which the client exits with. Each child is a
copy of the freshly imported server: no state passes from one run to the next.

Anything else runs the real interpreter (the client execs it): other command-line options,
and any environment that differs from the server's in a variable other than PATH, PWD,
OLDPWD, SHLVL, _ and PYTEST_CURRENT_TEST (FAVOR_CPU, OMP_NUM_THREADS, TRITON_INTERPRET, ... are read at import
time, which the server has already done). When the client dies (a block's timeout), the
child's process group is killed.
"""
import array
import json
import os
import socket
import sys

# Variables a run may change without needing a fresh interpreter: the shell's own, and the
# one pytest changes between a test's set-up (the server starts there) and its call.
FREE = {"PATH", "PWD", "OLDPWD", "SHLVL", "_", "PYTEST_CURRENT_TEST"}
PRELOAD = ("numpy", "torch", "transformers", "favor", "favor.torch", "favor.hf",
           "matplotlib", "tqdm")
MAX_MESSAGE = 1 << 20
_STARTED = {}  # the server's environment as it started


def _recv_message(conn):
    """One request: 3 file descriptors and a JSON body (length-prefixed)."""
    fds = array.array("i")
    head, ancdata, _, _ = conn.recvmsg(8, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    size = int.from_bytes(head, "little")
    if len(fds) != 3 or not 0 < size <= MAX_MESSAGE:
        raise ValueError("docs_forkserver: a request is 3 descriptors and a JSON body")
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ValueError("docs_forkserver: the request ended early")
        body += chunk
    return list(fds), json.loads(body)


def plan(argv):
    """('path'|'module'|'code', target, sys.argv) for the forms the server runs, else None."""
    if len(argv) >= 1 and not argv[0].startswith("-"):
        return "path", argv[0], list(argv)
    if len(argv) >= 2 and argv[0] == "-m":
        return "module", argv[1], [argv[1]] + list(argv[2:])
    if len(argv) >= 2 and argv[0] == "-c":
        return "code", argv[1], ["-c"] + list(argv[2:])
    return None


def _exit_status(code):
    """sys.exit's argument as the interpreter turns it into a status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run(how, target, args):
    import runpy
    import traceback
    sys.argv = args
    if how == "path":
        sys.path[0] = os.path.dirname(os.path.realpath(target))
    else:
        sys.path[0] = os.getcwd() if how == "module" else ""
    try:
        if how == "path":
            runpy.run_path(target, run_name="__main__")
        elif how == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
        status = 0
    except SystemExit as e:
        status = _exit_status(e.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        status = 130
    except BaseException:
        traceback.print_exc()
        status = 1
    return status


def _child(conn):
    """In the forked child: take over the client's descriptors and environment, run, report."""
    import atexit
    import signal
    import threading
    os.setpgid(0, 0)  # one group: killed as a whole when the client goes
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    fds, req = _recv_message(conn)
    env = req["env"]
    changed = {k for k in set(env) | set(_STARTED) if env.get(k) != _STARTED.get(k)}
    todo = plan(req["argv"])
    if todo is None or changed - FREE:
        conn.sendall(b"X")  # the client runs the real interpreter
        os._exit(0)
    conn.sendall(b"R")
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["cwd"])
    # multiprocessing's spawn finds a relative __main__ from the directory Python started in
    import multiprocessing.process
    multiprocessing.process.ORIGINAL_DIR = req["cwd"]
    added = {k: v for k, v in os.environ.items() if k not in _STARTED}  # by the imports
    os.environ.clear()
    os.environ.update(added)
    os.environ.update(env)

    def watch():  # the client's end closes: it was killed (a timeout)
        try:
            conn.recv(1)
        finally:
            os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()
    status = _run(*todo)
    try:
        # as the interpreter exits: threading's own exit hooks (a ThreadPoolExecutor's workers
        # are told to stop), then it waits for the non-daemon threads, then atexit
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        try:
            conn.sendall(status.to_bytes(4, "little"))
        finally:
            os._exit(status)


def serve(path):
    import importlib
    import signal
    global _STARTED
    _STARTED = dict(os.environ)  # before the imports, which may add (TORCHINDUCTOR_CACHE_DIR)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # a venv without the hf extra: those start fresh
            pass
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped by the kernel
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(16)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        conn, _ = srv.accept()
        if os.fork() == 0:
            srv.close()
            try:
                _child(conn)
            finally:
                os._exit(1)
        conn.close()


def client(path, argv):
    """Runs argv through the server at path, or execs the real interpreter."""
    python = sys.executable
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        body = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        conn.sendmsg([len(body).to_bytes(8, "little")],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
        conn.sendall(body)
        answer = conn.recv(1)
    except OSError:
        answer = b"X"
    if answer != b"R":
        os.execv(python, [python] + argv)
    status = b""
    while len(status) < 4:
        chunk = conn.recv(4 - len(status))
        if not chunk:  # the child died without a word (killed)
            sys.exit(1)
        status += chunk
    sys.exit(int.from_bytes(status, "little"))


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        client(sys.argv[1], sys.argv[2:])
