"""``python -m tfdp.launch --num_workers=N -- <train flags>``: N local workers on 127.0.0.1.

Picks free loopback ports, starts N ``python -m tfdp.train`` processes with their ``TF_CONFIG``,
pins each to its share of the CPU cores, prefixes each worker's output with ``[i]``, and waits.
If any worker fails, the others are stopped and the launcher exits non-zero at once; Ctrl-C
stops them all. Only the chief (worker 0) prints the per-epoch report and the final line.

  python -m tfdp.launch --num_workers=2 -- --strategy=multi_worker --epochs=3
"""

import codecs
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import app, flags

from tfdp.config import LIVE_PROGRESS_ENV, RUN_STAMP_ENV

flags.DEFINE_integer("num_workers", 2, "Worker processes to start on this machine.")
FLAGS = flags.FLAGS


def free_ports(count: int) -> list:
    """Ports the kernel hands out on 127.0.0.1 (held open together so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def core_shares(num_workers: int, cores: list) -> list:
    """Split the cores among the workers (round robin when there are more workers than cores)."""
    if num_workers >= len(cores):
        return [[cores[i % len(cores)]] for i in range(num_workers)]
    per = len(cores) // num_workers
    return [cores[i * per:(i + 1) * per] for i in range(num_workers)]


def worker_env(index: int, ports: list, run_stamp: str, live_progress: bool) -> dict:
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster,
                                                 "task": {"type": "worker", "index": index}}))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    env.setdefault(RUN_STAMP_ENV, run_stamp)  # One default run folder for all workers.
    if live_progress and index == 0:  # The chief's bar, when the launcher is in a terminal.
        env[LIVE_PROGRESS_ENV] = "1"
    return env


def _pump(stream, prefix, out):
    """Copy a worker's output as it comes (a progress bar redraws without a newline), with
    ``prefix`` at the start of every line and after every carriage return."""
    at_line_start = True
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in iter(lambda: os.read(stream.fileno(), 4096), b""):
        text = decoder.decode(chunk)
        pieces = []
        for char in text:
            if at_line_start and char not in "\r\n":
                pieces.append(prefix)
                at_line_start = False
            pieces.append(char)
            if char in "\r\n":
                at_line_start = True
        out.write("".join(pieces))
        out.flush()


def launch(num_workers: int, train_args: list, poll_seconds: float = 0.2) -> int:
    """Run the workers to the end; return 0 if all succeeded, else the first failure's code."""
    if num_workers < 1:
        print(f"tfdp.launch: error: --num_workers must be a positive integer, got {num_workers}",
              file=sys.stderr)
        return 2
    ports = free_ports(num_workers)
    shares = core_shares(num_workers, sorted(os.sched_getaffinity(0)))
    stamp, live = time.strftime("%Y%m%d-%H%M%S"), sys.stdout.isatty()
    procs, pumps = [], []
    for i in range(num_workers):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfdp.train", *train_args],
            env=worker_env(i, ports, stamp, live), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=lambda cores=shares[i]: os.sched_setaffinity(0, cores))
        procs.append(proc)
        for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
            pump = threading.Thread(target=_pump, args=(stream, f"[{i}] ", out), daemon=True)
            pump.start()
            pumps.append(pump)
    print(f"tfdp.launch: {num_workers} workers on 127.0.0.1 ports {ports}, cores {shares}",
          file=sys.stderr, flush=True)
    code = 0
    try:
        while True:
            codes = [p.poll() for p in procs]  # Poll every worker, each time round.
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i, code = failed[0]
                print(f"tfdp.launch: worker {i} exited with {code}; stopping the others",
                      file=sys.stderr, flush=True)
                code = code if code > 0 else 128 - code  # Killed by signal N: 128 + N.
                break
            if all(c == 0 for c in codes):
                break
            time.sleep(poll_seconds)
    except KeyboardInterrupt:
        print("tfdp.launch: interrupted; stopping the workers", file=sys.stderr, flush=True)
        code = 130
    finally:
        _stop(procs)
        for pump in pumps:
            pump.join(timeout=5)
    return code


def _stop(procs, grace: float = 5.0):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.time() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv):
    sys.exit(launch(FLAGS.num_workers, argv[1:]))


def run():
    # Everything after "--" goes to the workers untouched.
    app.run(main, flags_parser=_parse)


def _parse(argv):
    if "--" in argv:
        split = argv.index("--")
        own, rest = argv[:split], argv[split + 1:]
    else:
        own, rest = argv, []
    return FLAGS(own) + rest


if __name__ == "__main__":
    run()
