"""Only the main thread takes SIGTERM. The kernel gives a process's SIGTERM to any thread that
has it open; Python's own handler is reached from any of them, but TensorFlow's (put in place
while a MultiWorkerMirroredStrategy is created) drops one another thread took: a stop for a
worker to join that the group trained past. So the code that starts threads (TensorFlow's
import, the strategy's creation) runs with SIGTERM blocked, and every thread started inside
inherits the block."""

import contextlib
import signal


@contextlib.contextmanager
def main_thread_only():
    """SIGTERM blocked in this thread, so in every thread started inside; one that comes
    meanwhile reaches this thread's handler as the block ends."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
