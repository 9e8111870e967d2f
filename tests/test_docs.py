"""The documents a user reads say what the code does: the README is short and every command and
Python block in it runs (shortened to a few steps), the examples run, and the flags page is the
one ``python -m tfdp.config.flags`` writes."""

import os
import re
import shlex
import subprocess
import sys

import pytest

import readme
from conftest import REPO, ROOT
from processes import AS_FROM_A_SHELL, child_env, train_in_this_process
from readme import README
from tfdp.config import flags
from tfdp.util import logs

# Appended to every tfdp command of the README (absl keeps a flag's last value): a few steps.
SHORT_TRAIN = ["--epochs=1", "--steps_per_epoch=2", "--eval_steps=1", "--batch_size=32"]
SHORT_BENCH = ["--steps=2", "--epochs=2", "--rounds=1"]


def test_the_flags_page_is_current():
    with open(os.path.join(REPO, "docs", "flags.md")) as f:
        assert f.read() == flags.markdown(), "run: python -m tfdp.config.flags > docs/flags.md"


def test_the_readme_is_a_short_page_whose_install_and_test_commands_are_ci_s():
    with open(README) as f:
        assert len(f.read().splitlines()) <= 200
    with open(os.path.join(REPO, ".ci", "run")) as f:
        ci = f.read()
    commands = readme.commands()
    install = next(c for c in commands if "pip install" in c)
    assert "pip install -e '.[test]'" in install and "pip install --quiet -e '.[test]'" in ci
    assert "python -m pytest -q" in commands and "\npython -m pytest -q " in ci
    quick = next(c for c in commands if c.startswith("python -m pytest -q -m "))
    markers = set(re.findall(r"not (\w+)", quick))
    with open(os.path.join(REPO, "setup.cfg")) as f:
        assert markers == set(re.findall(r"^    (\w+)(?:\(\w+\))?: ", f.read(), re.M))
    assert all(c.startswith(("python -m tfdp.", "python -m pytest", "python3 -m venv"))
               for c in commands), commands


def shortened(command: str, data_dir: str, folder) -> list:
    """The README's ``python -m tfdp.<module> ...`` made short and kept in ``folder``."""
    args = shlex.split(command)[1:]
    module = args[1]
    own = [f"--data_dir={data_dir}", f"--workdir={folder / 'run'}",
           f"--export_dir={folder / 'export'}"]
    if module == "tfdp.bench":
        # Every configuration is a tfdp.train process of its own: the first and the last run
        # here (all are parsed), the table itself is tests/test_bench.py's.
        configs = [a for a in args if a.startswith("--configs=")]
        if configs:
            names = configs[-1].split("=", 1)[1].split(",")
            args.append(f"--configs={','.join(dict.fromkeys([names[0], names[-1]]))}")
        return [sys.executable, *args, *SHORT_BENCH, f"--data_dir={data_dir}",
                f"--workdir={folder / 'bench'}"]
    # A path of this checkout (examples/...) from wherever the command runs.
    args = [re.sub(r"^(--model=)(examples/)", rf"\g<1>{REPO}/\g<2>", a) for a in args]
    return [sys.executable, *args, *(["--"] if module == "tfdp.launch" and "--" not in args
                                     else []), *SHORT_TRAIN, *own]


def test_each_readme_launch_another_test_runs_is_run_there():
    """The README's launches that ``readme.RUN_BY`` names are launched by that test, from the
    README's own line (``readme.launch_args``), and by no other."""
    for strategy, test in readme.RUN_BY.items():
        readme.launch_command(strategy)  # The README has it, once.
        path, name = test.split("::")
        with open(os.path.join(REPO, path)) as f:
            source = f.read()
        body = re.search(rf"^def {name}\(.*?(?=^\S|\Z)", source, re.M | re.S)
        assert body, test
        assert f'readme.launch_args("{strategy}")' in body[0], (strategy, test)


@pytest.mark.slow
@pytest.mark.cluster
def test_every_tfdp_command_of_the_readme_runs(tmp_path, data_dir, capsys):
    """Launches and the bench as processes (two at a time: much of a short run is one core
    importing TensorFlow); meanwhile each ``tfdp.train`` command runs in this process, through
    ``tfdp.train.main`` with the flags parsed as its command line parses them (the command line
    as a process: tests/test_train_cli.py). A launch that another test runs from the README
    (``readme.RUN_BY``) is left to it."""
    from concurrent.futures import ThreadPoolExecutor

    commands = [c for c in readme.commands() if c.startswith("python -m tfdp.")]
    assert len(commands) >= 8, commands
    elsewhere = {readme.launch_command(strategy) for strategy in readme.RUN_BY}
    # Emulated hosts need root: tests/test_hosts.py runs them as root.
    runnable = [(i, c) for i, c in enumerate(commands)
                if (ROOT or "--hosts" not in c) and c not in elsewhere]
    trains = [(i, c) for i, c in runnable if c.startswith("python -m tfdp.train ")]

    def run(numbered):
        i, command = numbered
        return command, subprocess.run(shortened(command, data_dir, tmp_path / str(i)),
                                       cwd=tmp_path, capture_output=True, text=True,
                                       env=child_env(), timeout=600)

    with ThreadPoolExecutor(max_workers=1) as pool:
        processes = pool.map(run, [n for n in runnable if n not in trains])
        for i, command in trains:
            argv = shortened(command, data_dir, tmp_path / str(i))[2:]  # After python -m.
            assert train_in_this_process(argv) is None, command
            out = capsys.readouterr().out
            assert "exported " in out, (command, out[-2000:])
        for command, done in processes:
            assert done.returncode == 0, (command, done.stderr[-3000:])
            assert "exported " in done.stdout or "bench" in command, (command,
                                                                      done.stdout[-2000:])


@pytest.mark.slow
def test_the_readme_python_runs(tmp_path, data_dir, train_split, test_split):
    """Each Python block of the README, shortened, as a script in a folder holding the arrays
    it loads (``my_images.npz``: a slice of Fashion-MNIST in Keras' layout)."""
    import numpy as np

    np.savez(tmp_path / "my_images.npz", x_train=train_split.images[:256],
             y_train=train_split.labels[:256], x_test=test_split.images[:64],
             y_test=test_split.labels[:64])
    codes = readme.blocks("python")
    assert len(codes) == 2 and all("tfdp.run(" in code for code in codes)
    assert "model=model" in codes[0] and "my_images.npz" in codes[0]
    for i, code in enumerate(codes):
        short = code.replace("tfdp.run(", "tfdp.run(epochs=1, steps_per_epoch=2, eval_steps=1, "
                             f"data_dir={data_dir!r}, workdir={str(tmp_path / f'run{i}')!r}, "
                             f"export_dir={str(tmp_path / f'export{i}')!r}, ")
        done = subprocess.run([sys.executable, "-c", short], cwd=tmp_path, capture_output=True,
                              text=True, env=child_env(), timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        *figures, export = done.stdout.splitlines()[-1].split()  # The print, after the run.
        assert 0 <= float(figures[0]) <= 1 and export.endswith(f"export{i}/1"), done.stdout
        assert all(float(f) > 0 for f in figures[1:]), figures


@pytest.mark.slow
def test_the_examples_run(tmp_path, data_dir):
    examples = os.path.join(REPO, "examples")
    # Python's bytecode cache appears once a test has imported a model from the folder.
    names = sorted(n for n in os.listdir(examples) if n != "__pycache__")
    # The chapter's notebook runs in a kernel in tests/test_notebook.py; every other example is
    # a script.
    assert [n for n in names if not n.endswith(".py")] == ["chapter12.ipynb"], names
    for name in (n for n in names if n.endswith(".py")):
        # As from a shell: TensorFlow's start-up banners not hidden by the test, but by tfdp.
        done = subprocess.run([sys.executable, os.path.join(examples, name)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300,
                              env=child_env(**AS_FROM_A_SHELL, TFDS_DATA_DIR=data_dir))
        assert done.returncode == 0, (name, done.stderr[-3000:])
        accuracies = [float(a) for a in re.findall(r"accuracy: ([0-9.]+)", done.stdout)]
        assert accuracies and accuracies[-1] > 0.7, (name, done.stdout[-2000:])
        assert not [line for line in done.stderr.splitlines()
                    if logs.STARTUP_BANNERS.match(line) or "cuInit" in line], done.stderr[-3000:]
    # own_keras_model.py: your model through tfdp.run, exported where a run exports it.
    assert (tmp_path / "saved_models" / "small_resnet" / "1" / "saved_model.pb").exists()


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_every_link_and_anchor_of_the_docs_leads_somewhere():
    """Every relative link of the README and docs/ names a file that exists, and an anchor
    (``page.md#part``, ``#part``) a heading of that page, as GitHub renders them."""
    pages = [os.path.join(REPO, "README.md")] + [
        os.path.join(top, name) for top, _, names in os.walk(os.path.join(REPO, "docs"))
        for name in names if name.endswith(".md")]
    anchors, broken = {}, []
    for page in pages:
        with open(page) as f:
            text = re.sub(r"^```.*?^```", "", f.read(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(linked):
                broken.append(f"{os.path.relpath(page, REPO)}: {target} (no such file)")
                continue
            if anchor and linked.endswith(".md"):
                if linked not in anchors:
                    with open(linked) as f:
                        body = re.sub(r"^```.*?^```", "", f.read(), flags=re.M | re.S)
                    anchors[linked] = {slug(h) for h in re.findall(r"^#+ (.*)$", body, re.M)}
                if anchor not in anchors[linked]:
                    broken.append(f"{os.path.relpath(page, REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
