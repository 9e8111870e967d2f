"""The chapter as a notebook (examples/chapter12.ipynb): it runs top to bottom in a real Jupyter
kernel (nbclient, ipykernel) in its short form, every figure it checks in range; and the copy
in the repository holds the outputs of a full run."""

import os

import pytest

from conftest import REPO

NOTEBOOK = os.path.join(REPO, "examples", "chapter12.ipynb")


def text_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o["output_type"] == "stream")


@pytest.mark.slow
def test_the_notebook_runs_in_a_real_kernel(tmp_path, data_dir, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("TFDP_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("TFDS_DATA_DIR", data_dir)  # The kernel's TFDS reads the prepared data.
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # Its temporary folders, inside the test's own.
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert not [o for c in code for o in c.outputs if o["output_type"] == "error"]
    assert "quick run" in text_of(code[0])
    assert "figures in range" in text_of(code[-1])
    assert "compiled is" in text_of(code[1]) and "x faster" in text_of(code[1])
    assert any(o["output_type"] == "display_data" and "image/png" in o["data"]
               for c in code for o in c.outputs)  # The accuracy curves, drawn inline.
    made = {name for name in os.listdir(tmp_path)}  # Runs, exports, the bench: all in here.
    assert {"runs"} <= made and any(name.startswith("chapter12-exports-") for name in made)
    assert not os.path.exists(os.path.join(REPO, "examples", "runs"))


def test_the_saved_notebook_holds_a_full_runs_outputs():
    import nbformat

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code)
    first = text_of(code[0])
    assert "full run" in first and "cores" in first
    assert "figures in range" in text_of(code[-1])
