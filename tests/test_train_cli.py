"""``python -m tfdp.train`` as a user runs it: a short real run that reports, writes its
workdir and exports a SavedModel that serves; and one-line errors for bad input."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO
from processes import run_module, train_in_this_process
from tfdp.data import fashion_mnist

# Runs in a fresh interpreter that never imports tfdp: what a serving system would do.
SERVE_CHECK = r"""
import json, sys
import numpy as np, tensorflow as tf, tensorflow_datasets as tfds
export, data_dir = sys.argv[1:]
serve = tf.saved_model.load(export).signatures["serving_default"]
spec = serve.structured_input_signature[1]["images"]
outputs = {k: (v.dtype.name, v.shape.as_list()) for k, v in serve.structured_outputs.items()}
test = tfds.as_numpy(tfds.load("fashion_mnist", split="test", data_dir=data_dir, batch_size=-1,
                               download=False))
correct = 0
for i in range(0, 10000, 1000):
    out = serve(images=tf.constant(test["image"][i:i + 1000]))
    correct += int(np.sum(out["classes"].numpy() == test["label"][i:i + 1000]))
print(json.dumps({"input": [spec.dtype.name, spec.shape.as_list()], "outputs": outputs,
                  "accuracy": correct / 10000, "tfdp_imported": "tfdp" in sys.modules}))
"""


@pytest.mark.slow
def test_short_run_reports_exports_and_serves(tmp_path, data_dir):
    workdir, exports = tmp_path / "work", tmp_path / "exp"
    result = run_module("tfdp.train", "--num_gpus=2", "--epochs=2", "--steps_per_epoch=30",
                        "--init=glorot", "--plots", f"--data_dir={data_dir}",
                        f"--workdir={workdir}",
                        f"--export_dir={exports}")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert any(l.startswith("epoch 2/2: loss ") and "examples/s" in l for l in lines)
    final = [l for l in lines if l.startswith("test acc: ")]
    assert len(final) == 1 and final[0].endswith(
        "sec/epoch on ['/device:CPU:0', '/device:CPU:1']"), final
    assert "global batch 256 = 128 + 128 per replica; 30 steps/epoch" in result.stderr
    # tfdp's lines only: no absl-prefixed INFO of TF/TFDS, no C++ start-up banner.
    assert not re.search(r"^[IE]\d{4} |InitializeLog|Writing fingerprint", result.stderr,
                         re.M), result.stderr[-3000:]

    metrics = json.loads((workdir / "metrics.json").read_text())
    assert [r["epoch"] for r in metrics["epochs"]] == [1, 2]
    assert metrics["devices"] == ["/device:CPU:0", "/device:CPU:1"]
    assert metrics["config"]["num_gpus"] == 2
    # What the run used: --batch_size was not given, so the recipe's (--recipe=textbook).
    assert metrics["config"]["batch_size"] == 256 and metrics["global_batch"] == 256
    assert metrics["config"]["recipe"] == "textbook" and metrics["config"]["momentum"] == 0
    assert metrics["per_replica_batch"] == [128, 128] and metrics["init"] == "glorot"
    assert metrics["precision"] == "float32"
    assert metrics["export_path"] == str(exports / "1")
    assert (workdir / "accuracy.png").stat().st_size > 1000
    reported = metrics["epochs"][-1]["test_acc"]
    assert final[0].startswith(f"test acc: {reported:.2f},")
    epoch_line = [l for l in lines if l.startswith("epoch 2/2: ")][0]
    assert f"test_acc {reported:.3f}" in epoch_line and "train_acc" in epoch_line

    # TensorBoard's own reader: train and test are two runs with the same tags, one point per
    # epoch, so TensorBoard overlays them.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    for part, key in (("train", "train_acc"), ("test", "test_acc")):
        events = EventAccumulator(str(workdir / "tensorboard" / part),
                                  size_guidance={"tensors": 0})
        events.Reload()
        points = events.Tensors("acc")
        assert [p.step for p in points] == [1, 2]
        assert float(tf_value(points[-1])) == pytest.approx(metrics["epochs"][-1][key], abs=1e-6)

    assert os.listdir(exports) == ["1"]
    check = subprocess.run([sys.executable, "-c", SERVE_CHECK, str(exports / "1"), data_dir],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert check.returncode == 0, check.stderr[-3000:]
    served = json.loads(check.stdout.splitlines()[-1])
    assert served["tfdp_imported"] is False
    assert served["input"] == ["uint8", [None, 28, 28, 1]]
    assert served["outputs"] == {"logits": ["float32", [None, 10]],
                                 "probabilities": ["float32", [None, 10]],
                                 "classes": ["int64", [None]],
                                 "class_names": ["string", [None]]}
    assert served["accuracy"] == pytest.approx(reported, abs=1e-4)  # One image in 10,000.
    assert served["accuracy"] > 0.5


def tf_value(event):
    import tensorflow as tf

    return tf.make_ndarray(event.tensor_proto)


def test_the_chart_is_drawn_at_the_end_and_while_training_once_its_interval_has_passed(
        tmp_path, monkeypatch):
    from tfdp.training import history_chart

    drawings = []
    figure = history_chart.figure
    monkeypatch.setattr(history_chart, "figure",
                        lambda records, *a: drawings.append(len(records)) or figure(records, *a))
    chart = history_chart.Chart(str(tmp_path), 3, "lenet, manual, 2 device(s)")
    records = [dict(epoch=e, loss=1 / e, train_acc=0.5, test_loss=1 / e, test_acc=0.6)
               for e in (1, 2, 3)]
    chart.epoch_end(records[:1])  # Seconds into the run: not yet.
    assert drawings == [] and not (tmp_path / history_chart.FILE).exists()
    monkeypatch.setattr(history_chart, "REDRAW_EVERY", 0.0)  # As after a long epoch.
    chart.epoch_end(records[:2])
    assert drawings == [2] and (tmp_path / history_chart.FILE).stat().st_size > 1000
    monkeypatch.setattr(history_chart, "REDRAW_EVERY", 30.0)
    chart.epoch_end(records)  # Drawn just now: not again.
    chart.draw(records)  # The run's end draws what it has.
    chart.draw(records)  # Once.
    assert drawings == [2, 3]


@pytest.mark.parametrize("module, flags", [
    ("tfdp.train", ("--strategy", "--num_gpus", "--batch_size", "--precision", "--workdir")),
    ("tfdp.launch", ("--num_workers", "--num_ps", "--hosts", "--link")),
    ("tfdp.server", ("--num_gpus", "--data_dir", "--manual_dir")),
    ("tfdp.bench", ("--configs", "--steps", "--rounds", "--allreduce", "--hosts")),
])
def test_every_entry_points_help_lists_its_own_flags(module, flags):
    result = run_module(module, "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "helpfull" not in result.stdout, result.stdout[-2000:]
    for flag in flags:
        assert f"  {flag}" in result.stdout or f"  --[no]{flag[2:]}" in result.stdout, flag


def test_help_into_a_closed_pipe_exits_quietly():
    """`python -m tfdp.train --help | head -1`: the reader is gone before the help is written."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run([sys.executable, "-m", "tfdp.train", "--help"], stdout=write,
                                stderr=subprocess.PIPE, text=True, timeout=120, cwd=REPO)
    finally:
        os.close(write)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]


@pytest.mark.slow
def test_default_runs_keep_a_folder_each(tmp_path, data_dir):
    """Two runs of the same command: two run folders, for TensorBoard to compare. The second
    asks for --verbose, which shows the libraries' INFO lines again."""
    for verbose in ([], ["--verbose"]):
        result = run_module("tfdp.train", "--epochs=1", "--steps_per_epoch=2", "--eval_steps=1",
                            f"--data_dir={data_dir}", f"--export_dir={tmp_path / 'exp'}",
                            *verbose, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        seen = {w for w in ("InitializeLog", "Writing fingerprint") if w in result.stderr}
        assert seen == ({"InitializeLog", "Writing fingerprint"} if verbose else set()), seen
    runs = sorted(os.listdir(tmp_path / "runs"))
    assert len(runs) == 2 and all(r.startswith("manual-lenet-1dev-") for r in runs), runs
    for run in runs:
        assert (tmp_path / "runs" / run / "metrics.json").exists()


@pytest.mark.slow
def test_mirrored_progress_in_a_terminal(tmp_path, data_dir):
    """A real pseudo-terminal: one bar per epoch, then the epoch line on a line of its own."""
    import pty
    import select

    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfdp.train", "--strategy=mirrored", "--num_gpus=2",
         "--epochs=2", "--steps_per_epoch=5", "--eval_steps=1", f"--data_dir={data_dir}",
         f"--workdir={tmp_path / 'work'}", f"--export_dir={tmp_path / 'exp'}"],
        stdin=secondary, stdout=secondary, stderr=subprocess.DEVNULL, cwd=tmp_path,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    os.close(secondary)
    screen = b""
    while True:
        ready, _, _ = select.select([primary], [], [], 300)
        if not ready:
            proc.kill()
            break
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # The child closed the terminal.
            break
        if not chunk:
            break
        screen += chunk
    assert proc.wait(timeout=60) == 0
    os.close(primary)
    text = screen.decode(errors="replace")
    assert "val_" not in text  # tfdp's bar was drawn, not Keras' own.
    # Carriage returns only: no backspaces or escape codes, which a notebook prints raw.
    assert "\b" not in text and "\x1b" not in text, repr(text[-2000:])
    shown = [_as_displayed(line) for line in text.replace("\r\n", "\n").split("\n")]
    for epoch in (1, 2):
        ends = [l for l in shown if l.startswith(f"epoch {epoch}/2: loss ")]
        assert len(ends) == 1 and "test_acc" in ends[0], shown
        bar = shown.index(ends[0]) - 1  # The finished bar sits on the line above.
        assert shown[bar].startswith(f"epoch {epoch}/2 5/5 [") and "train_acc" in shown[bar], \
            shown


def _as_displayed(line: str) -> str:
    """What a terminal shows of one line: the text after its last carriage return, with
    backspaces applied."""
    shown = []
    for char in re.sub(r"\x1b\[[0-9;]*m", "", line).split("\r")[-1]:  # Colours off.
        if char == "\b":
            shown = shown[:-1]
        else:
            shown.append(char)
    return "".join(shown)


def assert_one_line_error(result, *words):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    for word in words:
        assert word in last, last


@pytest.mark.parametrize("args,words", [
    (["--num_gpus=0"], ["--num_gpus"]),
    (["--batch_size=-5"], ["--batch_size"]),
    (["--epochs=0"], ["--epochs"]),
    (["--lr=nan"], ["--lr"]),
    (["--lr=-1"], ["--lr"]),
    (["--strategy=horovod"], ["--strategy=horovod"]),
    (["--model=vgg"], ["--model=vgg"]),
    (["--allreduce=tree"], ["--allreduce=tree"]),
    (["--model=lenet_bn", "--strategy=parameter_server"], ["--model=lenet_bn", "--strategy=manual"]),
    (["--batch_size=64", "--per_replica_batch_size=32"], ["not both"]),
    (["--num_gpus=2", "--batch_size=1"], ["--batch_size=1", "2 replicas"]),
    (["--strategy=multi_worker", "--num_gpus=2"], ["--num_gpus=2", "one replica per CPU"]),
    (["--init=weights.h5"], ["--init=weights.h5"]),
    (["--seed=-1"], ["--seed must be an integer from 0"]),
    (["--epoch=3"], ["unknown flag --epoch (did you mean --epochs?); see tfdp.train --help"]),
    (["--num_gpus=True"], ["flag --num_gpus=True: invalid literal for int()"]),
])
def test_bad_flags_exit_with_one_line(args, words, tmp_path):
    result = run_module("tfdp.train", *args, f"--export_dir={tmp_path / 'exp'}",
                        f"--workdir={tmp_path / 'work'}", f"--data_dir={tmp_path / 'no-data'}")
    # Refused before any data is prepared.
    assert not (tmp_path / "no-data").exists()
    assert_one_line_error(result, *words)


@pytest.mark.parametrize("args, line", [
    (["--batch_size=70000"], "a global batch of 70000 examples is larger than the 60000 "
                             "training examples: give a --batch_size of at most 60000"),
    (["--epochs=2", "--steps_per_epoch=5", "--trace_steps=11:20"],
     "--trace_steps=11:20 starts after the run's last step: it trains steps 1 to 10 (2 epochs "
     "of 5 steps)"),
])
def test_flags_that_cannot_fit_the_data_are_one_line(args, line, tmp_path, data_dir):
    result = run_module("tfdp.train", *args, f"--data_dir={data_dir}",
                        f"--workdir={tmp_path / 'work'}", f"--export_dir={tmp_path / 'exp'}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == f"tfdp.train: error: {line}", \
        result.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("strategy, as_process", [("manual", True), ("mirrored", False)])
def test_a_target_accuracy_stops_at_the_first_evaluation_that_reaches_it(tmp_path, data_dir,
                                                                         capsys, strategy,
                                                                         as_process):
    """Time to accuracy as MLPerf times it: every epoch's record holds the clock (started
    before the data was read, so above the epochs' training seconds), the run stops at the
    first evaluation at or above the target and exports that model; one below says so. The
    command line as a process once; the same main in this process for the other path."""
    def train(*args):
        if as_process:
            return run_module("tfdp.train", *args)
        code = train_in_this_process(["tfdp.train", *args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code or 0, out, err)

    flags = [f"--strategy={strategy}", "--num_gpus=2", "--epochs=6", "--steps_per_epoch=20",
             "--init=glorot", "--eval_steps=8"]
    result = train(*flags, "--target_accuracy=0.55", f"--data_dir={data_dir}",
                   f"--workdir={tmp_path / 'run'}", f"--export_dir={tmp_path / 'exp'}")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    epochs = metrics["epochs"]
    reached = [r for r in epochs if r["test_acc"] >= 0.55]
    assert reached and epochs[-1]["epoch"] == reached[0]["epoch"] < 6
    clocks = [r["clock_s"] for r in epochs]
    assert clocks == sorted(clocks) and clocks[0] > epochs[0]["seconds"] > 0
    assert metrics["reached_at_epoch"] == epochs[-1]["epoch"] and metrics["startup_s"] > 0
    note = f" (first {metrics['eval_examples']} of 10000 test examples)"
    assert (f"reached 0.55 test accuracy{note} in {clocks[-1]:.1f} s (epoch "
            f"{epochs[-1]['epoch']}: {epochs[-1]['test_acc']:.4f})"
            in result.stdout.splitlines()), result.stdout[-2000:]
    assert os.listdir(tmp_path / "exp") == ["1"]

    below = train(*flags[:2], "--epochs=1", "--steps_per_epoch=2", "--eval_steps=8",
                  "--target_accuracy=0.99", f"--data_dir={data_dir}",
                  f"--workdir={tmp_path / 'below'}", f"--export_dir={tmp_path / 'exp'}")
    assert below.returncode == 0, below.stderr[-3000:]
    assert re.search(r"^did not reach 0\.99 test accuracy \(first \d+ of 10000 test "
                     r"examples\): the best was 0\.\d{4} \(epoch 1\), \d+\.\d s on the clock$",
                     below.stdout, re.M), below.stdout[-2000:]


@pytest.mark.slow
def test_bad_export_dir_and_damaged_data(tmp_path, manual_dir, data_dir):
    a_file = tmp_path / "file"
    a_file.write_text("not a folder")
    result = run_module("tfdp.train", f"--export_dir={a_file}", f"--data_dir={data_dir}")
    assert_one_line_error(result, "--export_dir", "is a file")

    broken = tmp_path / "manual"
    broken.mkdir()
    for name in fashion_mnist.MANUAL_FILES:
        shutil.copyfile(os.path.join(manual_dir, name), broken / name)  # Writable copies.
    (broken / "t10k-images-idx3-ubyte.gz").write_bytes(b"truncated")
    (tmp_path / "exp" / "1").mkdir(parents=True)
    (tmp_path / "exp" / "1" / "saved_model.pb").write_bytes(b"an earlier export")
    result = run_module("tfdp.train", f"--manual_dir={broken}",
                        f"--data_dir={tmp_path / 'fresh'}", f"--export_dir={tmp_path / 'exp'}")
    assert_one_line_error(result, "t10k-images-idx3-ubyte.gz is damaged")
    assert os.listdir(tmp_path / "exp") == ["1"]  # The failed run left the earlier one alone.
    assert (tmp_path / "exp" / "1" / "saved_model.pb").read_bytes() == b"an earlier export"

    result = run_module("tfdp.train", f"--manual_dir={tmp_path}",
                        f"--data_dir={tmp_path / 'fresh'}", f"--export_dir={tmp_path / 'exp'}")
    assert_one_line_error(result, "is missing", "--manual_dir")


@pytest.mark.parametrize("args, line", [
    (["--num_worker=2", "--", "--epochs=1"],
     "unknown flag --num_worker (did you mean --num_workers?); see tfdp.launch --help"),
    (["--num_workers=two"], "--num_workers=two: give a number of workers, or MIN:MAX for a "
                            "group that goes on with at least MIN when workers are lost"),
    (["--num_workers=2", "--strategy=multi_worker"],
     "--strategy is a flag of tfdp.train: give the workers' flags after --, as in python -m "
     "tfdp.launch --num_workers=2 -- --strategy=...; see tfdp.launch --help"),
])
def test_launcher_flag_mistakes_are_one_line(args, line):
    result = run_module("tfdp.launch", *args, timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"tfdp.launch: error: {line}"], result.stderr[-2000:]


@pytest.mark.parametrize("script,args,words", [
    ("tfdp-train", ["--num_gpus=0"], "tfdp.train: error: --num_gpus"),
    ("tfdp-launch", ["--num_workers=0", "--", "--epochs=1"], "tfdp.launch: error: --num_workers"),
    ("tfdp-bench", ["--configs=bad"], "tfdp.bench: error: --configs entry 'bad'"),
])
def test_console_scripts_are_installed_and_run(script, args, words):
    path = shutil.which(script, path=os.path.dirname(sys.executable))
    assert path, f"{script} is not installed beside {sys.executable}"
    result = subprocess.run([path, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and words in result.stderr.strip().splitlines()[-1]


def test_a_run_refused_before_it_wrote_anything_leaves_no_folder(tmp_path, data_dir):
    """A default run folder made for a run that a check then refused is removed, not left
    empty among the real runs."""
    result = run_module("tfdp.train", "--batch_size=70000", f"--data_dir={data_dir}",
                        f"--export_dir={tmp_path / 'exp'}", cwd=str(tmp_path))
    assert result.returncode == 1, result.stderr[-2000:]
    assert "larger than the 60000 training examples" in result.stderr
    assert not (tmp_path / "runs").exists() or not os.listdir(tmp_path / "runs")
