"""The zygote of tests/zygote.py, which says what it is for and how a command reaches it: a
process that imports what the suite's commands import, then forks each command handed to it,
as that command would have started, and tells its stand-in how it ended.

  python tests/zygote_server.py SOCKET    (started by ``zygote.start``)
"""

import array
import hashlib
import json
import os
import re
import runpy
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
import types

from zygote import OFF_ENV, SOCKET_ENV, die_with_parent, read_text
from zygote_child import become

# What the commands import before they train or serve, imported once, here. Not the commands'
# own modules: run as ``__main__``, they define absl's flags, which a second definition (by a
# module imported here) would refuse.
PRELOAD = ("tfdp.training.mid_step", "tfdp.config.flags", "tfdp.cluster.managed",
           "tfdp.cluster.tf_server", "tfdp.training.entry", "tfdp.paths.manual.trainer",
           "tfdp.paths.keras.trainer", "tfdp.paths.parameter_server.trainer",
           "tfdp.export.saved_model", "tfdp.export.served", "tfdp.data.image_folder")
# Read by Python, TensorFlow, Keras or the C libraries while they import: a command whose value
# differs from the zygote's is not forked. (Those read only once a run starts are not compared.)
IMPORT_TIME = re.compile(r"PYTHON|TF_|KERAS|LD_|OMP_|OPENBLAS|MKL|XLA|MALLOC|CUDA|NVIDIA|TPU"
                         r"|HOME$|XDG_|TMPDIR$|LANG|LC_|TZ$")
RUN_TIME = {"TF_CONFIG", "TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS",
            "TF_FORCE_GPU_ALLOW_GROWTH"}
# Those whose other values many commands take (tfdp's own log threshold, for the tests of
# what a user's shell shows): a command with another value goes to a zygote of its own that
# imported with that value, started the first time one is asked for.
VARIANTS = {"TF_CPP_MIN_LOG_LEVEL"}
# Who a process is, in /proc/<pid>/status: the same as the zygote's, or no fork. Its
# supplementary groups (a Slurm task's, set by slurmd) the child takes where the zygote may
# set them (CAP_SETGID).
IDENTITY = ("Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs",
            "Seccomp")
# The namespaces a child enters where its stand-in's differ (an emulated host's network; the
# mounts ``ip netns exec`` makes, a Slurm task's), the capabilities that takes; the others
# must be the zygote's.
ENTERED = {"net": ("CAP_SYS_ADMIN",), "mnt": ("CAP_SYS_ADMIN", "CAP_SYS_CHROOT")}
SAME_NAMESPACES = ("pid", "user", "uts", "ipc", "cgroup")
CAPABILITIES = {"CAP_SETGID": 6, "CAP_SYS_CHROOT": 18, "CAP_SYS_ADMIN": 21}


def main(path: str) -> None:
    before = dict(os.environ)
    # Listening first: a command started while TensorFlow imports here waits for it, rather
    # than import it a second time beside it.
    zygote = Zygote(path, before)
    _log(f"zygote {os.getpid()} listening, importing")
    from tfdp.util import logs

    # As a command starts: its logging set up first (tfdp's own C++ log threshold where none
    # is given, which a variant's "" is), then TensorFlow imported, its banners dropped and
    # the cyclic collector paused while it imports.
    logs.configure(False)
    logs.import_tensorflow()
    import importlib

    from absl import flags

    defined = set(flags.FLAGS)
    for module in PRELOAD:
        importlib.import_module(module)
    assert set(flags.FLAGS) == defined, f"PRELOAD defines flags: {set(flags.FLAGS) - defined}"
    # What importing set in the environment (TensorFlow: TPU_ML_PLATFORM), a command's own
    # import would have set too.
    zygote.imported = {k: v for k, v in os.environ.items() if before.get(k) != v}
    module = zygote.serve()  # Returns only in a child.
    sys.modules["__main__"] = types.ModuleType("__main__")
    runpy._run_module_as_main(module)


class Zygote:
    def __init__(self, path: str, env: dict):
        self.path, self.env, self.imported = path, env, {}
        self.variants = {}  # socket -> the Popen of a zygote with other VARIANTS
        os.makedirs(path + ".pids", exist_ok=True)
        self.cpu = 0.0
        self.own_status = _status(os.getpid())
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(path):
            os.unlink(path)
        self.listener.bind(path)
        self.listener.listen(64)
        self.wakeup_r, self.wakeup_w = os.pipe()
        os.set_blocking(self.wakeup_w, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wakeup_r, selectors.EVENT_READ)
        self.by_pid, self.by_connection = {}, {}  # child -> (connection, stand-in), and back

    def serve(self) -> str:
        signal.set_wakeup_fd(self.wakeup_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._end)
        while True:
            # A command started after a stand-in was killed finds its child gone, as it would
            # find a killed process gone: the ends first, then the new commands.
            events = sorted(self.selector.select(), key=lambda e: e[0].fileobj is self.listener)
            for key, _ in events:
                try:
                    if key.fileobj is self.listener:
                        module = self._accept()
                        if module:
                            return module
                    elif key.fileobj == self.wakeup_r:
                        os.read(self.wakeup_r, 4096)
                        self._reap()
                    else:
                        self._stand_in_gone(key.fileobj)
                except Exception:  # noqa: BLE001  Never the zygote's end: its children die with it.
                    import traceback

                    _log(f"error, serving on:\n{traceback.format_exc()}")

    def _accept(self):
        connection, _ = self.listener.accept()
        try:
            request, fds = _receive(connection)
        except (OSError, ValueError) as e:
            _log(f"refused: unreadable request ({e})")
            connection.close()
            return None
        pid = struct.unpack("3i", connection.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
        why_not = self._why_not(request, pid, fds)
        entered = {}  # kind -> an fd of the stand-in's namespace
        for kind in ENTERED if not why_not else ():
            if _namespace(pid, kind) != _namespace(os.getpid(), kind):
                try:
                    entered[kind] = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY)
                except OSError as e:
                    why_not = f"its {kind} namespace cannot be opened ({e})"
        groups = [int(group) for group in _status(pid).get("Groups", "").split()]
        variant = {name: request["env"].get(name) for name in VARIANTS
                   if request["env"].get(name) != self.env.get(name)}
        if why_not or variant:
            answer = {"exec": why_not}
            if not why_not:
                try:
                    answer = {"redirect": self._variant(variant)}
                    _log(f"sent {request['module']} of {pid} to the zygote of {variant}")
                except OSError as e:
                    answer = {"exec": f"no zygote of {variant} ({e})"}
            if "exec" in answer:
                _log(f"refused {request.get('module')} of {pid}: {answer['exec']}")
            try:
                _send(connection, answer)
            except OSError:
                pass  # Its stand-in has gone already.
            connection.close()
            for fd in [*fds, *entered.values()]:
                os.close(fd)
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        # Held across the fork: a signal the stand-in passes on at once must not run this
        # zygote's handlers in the child (its SIGTERM's would end the zygote's children, and
        # the signal be lost); the child takes it once its own dispositions are set.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        child = os.fork()
        if child:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        else:
            try:
                self._close_in_child(connection)
                become(request, fds, entered, groups, self.imported)
            except BaseException:  # Never back into the zygote's loop.
                import traceback

                traceback.print_exc()
                os._exit(70)
            return request["module"]
        for fd in [*fds, *entered.values()]:
            os.close(fd)
        self.by_pid[child] = (connection, pid)
        self.by_connection[connection] = child
        self.selector.register(connection, selectors.EVENT_READ)
        try:
            _send(connection, {"pid": child})
        except OSError:  # Its stand-in has gone already (killed while the zygote imported).
            _kill(child, signal.SIGKILL)
        _log(f"forked {request['module']} of {pid} as {child}")
        return None

    def _why_not(self, request: dict, pid: int, fds: list):
        if request.get("executable") != sys.executable:
            return f"another Python ({request.get('executable')})"
        if request.get("tfdp") != _origin():
            return f"another tfdp ({request.get('tfdp')})"
        if any(arg.startswith("--verbose") and arg != "--verbose=false"
               for arg in request["argv"][3:]):
            return "--verbose (it shows what TensorFlow prints while it imports)"
        env = request["env"]
        if env.get(OFF_ENV) == "0":
            return f"{OFF_ENV}=0"
        differ = sorted(name for name in {*env, *self.env}
                        if IMPORT_TIME.match(name) and name not in RUN_TIME | VARIANTS
                        and env.get(name) != self.env.get(name) and name != SOCKET_ENV)
        if differ:
            return f"its {', '.join(differ)} differ"
        status = _status(pid)
        other = [field for field in IDENTITY if status.get(field) != self.own_status.get(field)]
        if other:
            return f"its {', '.join(other)} differ"
        if status.get("Groups") != self.own_status.get("Groups") and not self._may("CAP_SETGID"):
            return "its Groups differ"
        other = [kind for kind in SAME_NAMESPACES
                 if _namespace(pid, kind) != _namespace(os.getpid(), kind)]
        other += [kind for kind, needs in ENTERED.items()
                  if _namespace(pid, kind) != _namespace(os.getpid(), kind)
                  and not all(self._may(cap) for cap in needs)]
        if other:
            return f"its {', '.join(other)} namespaces differ"
        if read_text(f"/proc/{pid}/cgroup") != read_text(f"/proc/{os.getpid()}/cgroup"):
            return "another cgroup"
        if len(fds) != len(request["fds"]):
            return "its open files did not all arrive"
        return None

    def _end(self, *_) -> None:
        """Asked to end (``zygote.stop``): the children still running (which would die with
        it) and the variants first, waited for, so that what they took counts among this one's
        children, where the test worker counts it."""
        for child in self.by_pid:
            _kill(child, signal.SIGKILL)
        for variant in self.variants.values():
            variant.terminate()
        for pid in [*self.by_pid, *(variant.pid for variant in self.variants.values())]:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass  # Waited for already.
        os._exit(0)

    def _variant(self, values: dict) -> str:
        """The socket of the zygote that imported with ``values`` (None: unset) of VARIANTS,
        started now if it is not running; a zygote listens before it imports, and a command
        sent to it waits for that."""
        key = hashlib.sha1(json.dumps(values, sort_keys=True).encode()).hexdigest()[:8]
        path = f"{self.path}-{key}"
        if path in self.variants and self.variants[path].poll() is None:
            return path
        env = {k: v for k, v in {**self.env, **values}.items() if v is not None}
        if os.path.exists(path):  # An earlier one's, ended.
            os.unlink(path)
        with open(path + ".log", "a") as log:
            self.variants[path] = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), path], env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=die_with_parent)
        deadline = time.time() + 60
        while not os.path.exists(path):
            if self.variants[path].poll() is not None or time.time() > deadline:
                raise OSError(f"it did not start: {path}.log")
            time.sleep(0.01)
        return path

    def _may(self, capability: str) -> bool:
        return bool(int(self.own_status.get("CapEff", "0"), 16) >> CAPABILITIES[capability] & 1)

    def _close_in_child(self, connection) -> None:
        for variant in self.variants.values():
            variant.returncode = 0  # Not this child's children: never waited for here.
        self.variants.clear()
        signal.set_wakeup_fd(-1)
        self.selector.close()
        self.listener.close()
        for other in self.by_connection:
            other.close()
        connection.close()
        os.close(self.wakeup_r)
        os.close(self.wakeup_w)

    def _reap(self, only: int = -1) -> None:
        """Every child that has ended, stopped or continued; given ``only``, until that child
        has ended, its files closed (a lock it held released)."""
        flags = os.WUNTRACED | os.WCONTINUED | (os.WNOHANG if only == -1 else 0)
        while True:
            try:
                child, status, usage = os.wait4(only, flags)
            except ChildProcessError:
                return
            if child == 0:
                return
            connection, stand_in = self.by_pid.get(child, (None, None))
            if os.WIFSTOPPED(status) or os.WIFCONTINUED(status):
                # Whoever reads the stand-in's state (tfdp.launch asks whether a worker is
                # stopped) sees the child's.
                if stand_in:
                    _kill(stand_in, signal.SIGSTOP if os.WIFSTOPPED(status) else signal.SIGCONT)
                continue
            self.cpu += usage.ru_utime + usage.ru_stime
            with open(self.path + ".cpu.new", "w") as f:
                f.write(f"{self.cpu:.3f}")
            os.replace(self.path + ".cpu.new", self.path + ".cpu")
            if connection is None:
                continue
            del self.by_pid[child], self.by_connection[connection]
            if connection in self.selector.get_map():
                self.selector.unregister(connection)
            ended = ({"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
                     else {"exit": os.WEXITSTATUS(status)})
            try:
                _send(connection, ended)
            except OSError:
                pass  # The stand-in has gone first.
            connection.close()
            _kill(stand_in, signal.SIGCONT)  # A child ended while stopped: so does its stand-in.
            if child == only:
                return

    def _stand_in_gone(self, connection) -> None:
        """The stand-in's end of the socket closed while its child runs: it was killed (by
        SIGKILL: a signal it could catch it would have passed on). So is its child."""
        self.selector.unregister(connection)
        child = self.by_connection.get(connection)
        if child:
            _log(f"stand-in of {child} gone: killing it")
            _kill(child, signal.SIGKILL)
            self._reap(only=child)  # Gone before the next command, as the stand-in is.


def _receive(connection):
    """A request: its length and files in one message, then its JSON."""
    fds = array.array("i")
    header, ancillary, _, _ = connection.recvmsg(4, socket.CMSG_SPACE(256 * fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    if len(header) != 4:
        raise ValueError("no header")
    (size,) = struct.unpack("!I", header)
    body = b""
    while len(body) < size:
        chunk = connection.recv(size - len(body))
        if not chunk:
            raise ValueError("cut short")
        body += chunk
    return json.loads(body), list(fds)


def _send(connection, message: dict) -> None:
    connection.sendall(json.dumps(message).encode() + b"\n")


def _status(pid: int) -> dict:
    fields = {}
    for line in read_text(f"/proc/{pid}/status").splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return fields


def _namespace(pid: int, kind: str):
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _origin() -> str:
    import tfdp

    return os.path.dirname(os.path.abspath(tfdp.__file__))


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _log(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
