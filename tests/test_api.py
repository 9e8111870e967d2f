"""tfdp from Python: ``tfdp.run`` returns a ``Result``, refuses bad arguments like the command
line, and behaves as documented when run twice in one process and in a notebook."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO
from processes import run_module
import tfdp

# A fresh process (logical devices are fixed once per process), made to look like a notebook:
# a kernel module loaded and stdout not a terminal.
NOTEBOOK_SESSION = r"""
import json, sys, types
sys.modules.setdefault("ipykernel", types.ModuleType("ipykernel"))
import numpy as np
import tfdp

data_dir, tmp = sys.argv[1:]
tfdp.configure_devices(2)
common = dict(epochs=2, steps_per_epoch=12, eval_steps=2, data_dir=data_dir, init="glorot")
one = tfdp.run(num_gpus=1, workdir=f"{tmp}/one", export_dir=f"{tmp}/exp", **common)
two = tfdp.run(num_gpus=2, strategy="mirrored", workdir=f"{tmp}/two", export_dir=f"{tmp}/exp",
               **common)
try:
    tfdp.run(num_gpus=3, workdir=f"{tmp}/three", **common)
    error = None
except tfdp.UserError as e:
    error = str(e)
figure = two.plot()

import tensorflow as tf
serve = tf.saved_model.load(two.export_path).signatures["serving_default"]
out = serve(images=tf.zeros([3, 28, 28, 1], tf.uint8))
print("RESULT " + json.dumps({
    "one": [one.test_accuracy, one.devices, len(one.history), one.export_path],
    "two": [two.test_accuracy, two.sec_per_epoch, two.devices, [r["epoch"] for r in two.history],
            two.export_path, two.history[-1]["test_acc"], two.run_dir],
    "weights_equal_shapes": [w.shape for w in one.weights] == [w.shape for w in two.weights],
    "error": error, "axes": len(figure.axes),
    "served": [out["classes"].shape.as_list(), bool(np.isfinite(out["logits"].numpy()).all())]}))
"""


@pytest.mark.slow
def test_run_in_a_notebook_two_runs_and_the_result(tmp_path, data_dir):
    result = subprocess.run([sys.executable, "-c", NOTEBOOK_SESSION, data_dir, str(tmp_path)],
                            capture_output=True, timeout=600, cwd=REPO,  # Bytes: keep the \r.
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    out = result.stdout.decode()
    got = json.loads(out.split("RESULT ")[-1])
    accuracy, sec, devices, epochs, export, last_acc, run_dir = got["two"]
    assert devices == ["/device:CPU:0", "/device:CPU:1"] and epochs == [1, 2]
    assert accuracy == last_acc and 0.3 < accuracy <= 1 and sec > 0
    assert export == str(tmp_path / "exp" / "2") and run_dir == str(tmp_path / "two")
    assert got["one"][1] == ["/device:CPU:0"] and got["one"][3] == str(tmp_path / "exp" / "1")
    assert got["weights_equal_shapes"] and got["axes"] == 2
    assert got["served"] == [[3], True]
    # More devices than the first configured: a clear error saying what to do.
    assert "restart the kernel" in got["error"] and "tfdp.configure_devices(3)" in got["error"]
    # The notebook's progress: redrawn with carriage returns, no backspaces or escape codes.
    assert "\r" in out and "\b" not in out and "\x1b" not in out
    assert re.search(r"\repoch 2/2 12/12 \[=+\] loss", out), out[-2000:]


@pytest.mark.parametrize("kwargs, flag", [({"num_gpu": 2}, "num_gpu"),
                                          ({"batch_size": 0}, "--batch_size"),
                                          ({"strategy": "horovod"}, "--strategy=horovod")])
def test_a_bad_argument_raises_a_value_error_naming_it(kwargs, flag):
    with pytest.raises(ValueError, match=re.escape(flag)) as raised:
        tfdp.run(**kwargs)
    assert isinstance(raised.value, tfdp.UserError) and "\n" not in str(raised.value)


def test_the_command_line_prints_the_same_message():
    with pytest.raises(tfdp.UserError) as raised:
        tfdp.run(batch_size=0)
    result = run_module("tfdp.train", "--batch_size=0")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == f"tfdp.train: error: {raised.value}"


@pytest.mark.slow
def test_interrupting_a_jupyter_kernel_saves_and_raises_preempted_then_the_same_call_resumes(
        tmp_path, data_dir):
    """A real Jupyter kernel (ipykernel), interrupted as the notebook's stop button does
    (SIGINT): ``tfdp.run`` finishes its step, saves it and raises ``tfdp.Preempted``; the kernel
    lives on, and the same call resumes from that step."""
    from jupyter_client import KernelManager

    from processes import child_env

    kernel = KernelManager(kernel_name="python3")
    kernel.start_kernel(env=child_env(), cwd=str(tmp_path))
    client = kernel.client()
    client.start_channels()
    call = (f"import tfdp\nresult = tfdp.run(num_gpus=2, epochs=2, steps_per_epoch=400, "
            f"batch_size=64, eval_steps=1, data_dir={data_dir!r}, "
            f"workdir={str(tmp_path / 'run')!r}, export_dir={str(tmp_path / 'export')!r})")

    def execute(code, interrupt_when=None, seconds=240):
        """Run ``code``; interrupt the kernel once its output matches ``interrupt_when``;
        return (the reply's content, the cell's output). ``execute_interactive`` takes the
        reply to this request, not the first on the shell channel: ``wait_for_ready`` asks for
        the kernel's info every second until one answer arrives, and a kernel slow to start (a
        loaded machine) answers every question it was asked (jupyter/jupyter_client#592)."""
        output = ""

        def on_output(msg):
            nonlocal output, interrupt_when
            if msg["msg_type"] == "stream":
                output += msg["content"]["text"]
                if interrupt_when and re.search(interrupt_when, output):
                    kernel.interrupt_kernel()
                    interrupt_when = None

        try:
            reply = client.execute_interactive(code, timeout=seconds, output_hook=on_output)
        except TimeoutError:
            pytest.fail(f"the cell did not finish: {output[-2000:]}")
        return reply["content"], output

    try:
        client.wait_for_ready(timeout=120)
        reply, output = execute(call, interrupt_when=r"\repoch 1/2 +\d{2,}/400 ")
        assert reply["status"] == "error" and reply["ename"] == "Preempted", (reply, output)
        step = int(re.search(r"preempted \(Ctrl-C\) at step (\d+): state of step \d+ saved",
                             reply["evalue"])[1])
        assert 0 < step < 800
        reply, output = execute(call + "\nprint('EXPORTED', result.export_path)")
        assert reply["status"] == "ok", (reply, output)
        assert f"(global step {step})" in output and "EXPORTED " in output, output[-2000:]
    finally:
        client.stop_channels()
        kernel.shutdown_kernel(now=True)
