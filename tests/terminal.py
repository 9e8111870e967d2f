"""A command in a real pseudo-terminal, typed at as in a user's shell."""

import os
import subprocess
import time

import pytest

from conftest import REPO
from processes import child_env, signals_as_in_a_terminal


class Terminal:
    """A command run in a real pseudo-terminal, as in a user's shell: the terminal is its
    controlling one, its process group the foreground one and its signals at their defaults,
    so typing Ctrl-C (``type``) signals it as a shell would. ``text`` is everything it printed
    so far."""

    def __init__(self, argv, cwd=REPO, env=None):
        import fcntl
        import termios

        def as_a_shell_starts_it():
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            signals_as_in_a_terminal()

        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                                     env=env or child_env(), cwd=cwd, start_new_session=True,
                                     preexec_fn=as_a_shell_starts_it)
        os.close(slave)
        self.output = bytearray()

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace")

    def read_available(self) -> bool:
        """Take what it has printed; False once every process holding the terminal has gone."""
        import select
        while select.select([self.master], [], [], 0)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every process holding the terminal has gone.
                return False
            if not chunk:
                return False
            self.output.extend(chunk)
        return True

    def wait_for(self, predicate, seconds: float, what: str) -> None:
        """Read until ``predicate(self)`` holds; fail after ``seconds`` or if it exits first."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            self.read_available()
            if predicate(self):
                return
            if self.proc.poll() is not None:
                self.read_available()
                pytest.fail(f"exited ({self.proc.returncode}) before {what}:\n{self.text[-3000:]}")
            time.sleep(0.02)
        pytest.fail(f"timed out waiting for {what}:\n{self.text[-3000:]}")

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def finish(self, seconds: float = 60) -> int:
        """Wait for it to exit (killed after ``seconds``); its exit code."""
        deadline = time.time() + seconds
        try:
            while self.proc.poll() is None and time.time() < deadline:
                self.read_available()
                time.sleep(0.05)
            self.read_available()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            os.close(self.master)
        return self.proc.returncode
