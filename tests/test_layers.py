"""The package's layers, read from its imports (without importing it): imports go one way, from
the commands down to the ground floor, with no cycle between tfdp's top-level packages and
modules; the process launcher never imports TensorFlow; every ``--strategy`` has a registered
path; and docs/design.md names only modules and names that exist."""

import ast
import os
import re

from conftest import REPO

PACKAGE = os.path.join(REPO, "tfdp")
# Bottom to top; a unit may import its own layer's units and those of the layers below. A unit
# is a package, a module, or a part of a package that sits on another layer than the rest of it
# (``paths``, the registry, beneath ``paths.manual``, the path it registers).
LAYERS = [
    {"util"},                                                  # the ground floor
    {"paths"},                                                 # the paths' registry
    {"config", "export.formats"},                              # read without TensorFlow
    {"data", "models"},                                        # the examples; the models
    {"cluster", "launcher"},                                   # in-process runtime; launcher
    {"trace", "export"},                                       # seeing the steps; the export
    {"training"},                                              # what every run does
    {"paths.manual", "paths.keras", "paths.parameter_server"},  # the paths
    {"train", "launch", "server", "predict", "bench"},         # the commands
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def modules() -> dict:
    """Every module of tfdp: dotted name -> its file."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path[:-3], REPO).replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def imports(path: str, known: dict) -> set:
    """The tfdp modules ``path`` imports, at its top or inside functions."""
    with open(path) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("tfdp")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfdp"):
            for alias in node.names:  # "from tfdp import paths" imports the module tfdp.paths.
                child = f"{node.module}.{alias.name}"
                found.add(child if child in known else node.module)
    return found


def unit(module: str) -> str:
    """The unit a module belongs to, the longest one that names it: tfdp.training.loop ->
    training, tfdp.paths.manual.step -> paths.manual, tfdp.paths -> paths."""
    name = module.removeprefix("tfdp").removeprefix(".")
    if not name:
        return ""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        if ".".join(parts[:cut]) in LAYER:
            return ".".join(parts[:cut])
    return parts[0]


def unit_edges() -> dict:
    known = modules()
    edges = {}
    for module, path in known.items():
        if module == "tfdp":  # The package's face re-exports the API.
            continue
        for target in imports(path, known):
            if unit(target) and unit(target) != unit(module):
                edges.setdefault((unit(module), unit(target)), []).append(f"{module} -> {target}")
    return edges


def test_every_unit_has_a_layer():
    units = {unit(m) for m in modules()} - {""}
    assert units == set(LAYER), f"add to or remove from LAYERS: {units ^ set(LAYER)}"
    top = sorted(os.listdir(PACKAGE))
    entries = [e for e in top if e != "__pycache__"]
    assert len(entries) <= 16, f"tfdp/ holds {len(entries)} entries (16 at most): {entries}"


def test_imports_go_down_the_layers_only():
    upward = [why for (a, b), whys in unit_edges().items() if LAYER[b] > LAYER[a] for why in whys]
    assert not upward, "imports that go up a layer:\n" + "\n".join(sorted(upward))


def test_no_cycle_between_top_level_units():
    graph = {}
    for a, b in unit_edges():
        graph.setdefault(a, set()).add(b)

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n)))
                   for n in graph.get(start, ()))

    cycles = sorted(a for a in graph if reaches(a, a))
    assert not cycles, f"units in an import cycle: {cycles}"


def test_the_launcher_runs_without_tensorflow():
    known = modules()
    for module, path in known.items():
        if unit(module) != "launcher":
            continue
        with open(path) as f:
            tree = ast.parse(f.read())
        named = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        named |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {n for n in named if n.split(".")[0] in ("tensorflow", "keras")}, module
        # Nor through tfdp: only modules that import no TensorFlow themselves.
        for target in imports(path, known):
            assert unit(target) in ("launcher", "util", "config", "paths",
                                    "export.formats"), (module, target)
            assert target != "tfdp.util.devices", (module, target)


def test_every_registered_path_trains_through_the_path_contract():
    from tfdp import paths
    from tfdp.training.path_contract import TrainingPath

    assert paths.names()[:5] == ("manual", "mirrored", "multi_worker", "plain",
                                         "parameter_server")
    assert all(issubclass(p.training_path(), TrainingPath) for p in paths.all_paths())


def test_the_paths_descriptions_are_read_without_tensorflow():
    """The launcher and the cluster managers ask the registry before TensorFlow starts."""
    from tfdp import paths

    known = modules()
    for module in paths.BUILT_IN:
        with open(known[module]) as f:
            tree = ast.parse(f.read())
        named = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        named |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {n for n in named if n.split(".")[0] in ("tensorflow", "keras")}, module
        for target in imports(known[module], known):
            assert target in ("tfdp.paths", "tfdp.util.errors", "tfdp.paths.manual.algorithms"), (
                module, target)


def defined(module_path: str) -> set:
    """The names a module defines at its top level, and its classes' members."""
    with open(module_path) as f:
        tree = ast.parse(f.read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names |= {f"{node.name}.{m.name}" for m in node.body
                          if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
        elif isinstance(node, ast.ImportFrom):  # A package's face: tfdp.run is tfdp.training.from_python's.
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                names |= set(ast.literal_eval(node.value))  # Imported when first asked for.
    return names


def resolve(reference: str, known: dict) -> bool:
    """Whether ``a/b.py``, ``a/b/``, ``a.b``, ``a.b.Name`` or ``a.b.Class.method`` (relative to
    tfdp or the repository) names a file, folder, module or a name one defines."""
    if reference.endswith((".py", "/")):
        reference = reference.rstrip("/")
        return (any(os.path.exists(os.path.join(base, reference)) for base in (REPO, PACKAGE))
                or any(p.endswith(os.sep + reference) for p in known.values()))
    dotted = reference.replace("/", ".")
    if not dotted.startswith("tfdp."):  # Relative to tfdp, or a module named by its own name.
        first = dotted.split(".")[0]
        bases = ["tfdp"] + sorted({m.rsplit(".", 1)[0] for m in known
                                   if m.rsplit(".", 1)[-1] == first})
        return any(resolve(f"{base}.{dotted}", known) for base in bases)
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in known:
            rest = ".".join(parts[cut:])
            return not rest or rest in defined(known[module])
    return False


def test_the_design_page_names_only_what_exists():
    with open(os.path.join(REPO, "docs", "design.md")) as f:
        text = f.read()
    known = modules()
    names = {m.rsplit(".", 1)[-1] for m in known}
    # Code spans and the layout block's names that look like tfdp's modules or files.
    spans = re.findall(r"`([^`\n]+)`", text)
    references = {s for s in spans if re.fullmatch(r"(tfdp[./])?[a-z_]+(/[a-z_0-9]+)*"
                                                   r"(\.py|/|(\.[A-Za-z_]+)+)?", s)
                  and ("/" in s or s.startswith("tfdp.") or s.split(".")[0] in names)}
    missing = sorted(r for r in references if not resolve(r, known))
    assert len(references) > 20, references
    assert not missing, f"docs/design.md names what does not exist: {missing}"


def test_the_package_imports_its_modules_when_first_asked_for():
    """``python -m tfdp.train`` imports the package before the command's first line, which holds
    a signal until the command can end in one line: the package itself imports only its
    errors, and ``tfdp.run`` is there when asked for."""
    import subprocess
    import sys

    code = ("import sys, tfdp; print(sorted(m for m in sys.modules if m.startswith('tfdp'))); "
            "tfdp.run; print('tfdp.training.from_python' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=60, check=True)
    imported = ["['tfdp', 'tfdp.util', 'tfdp.util.errors']", "True"]
    assert done.stdout.split("\n")[:2] == imported, done.stdout


def test_no_module_over_300_lines_and_no_function_over_8_parameters():
    """The sizes the package keeps (docs/design.md): a module over 300 lines is doing two things,
    a function taking more than 8 parameters is missing the object that holds them."""
    long, wide = [], []
    for module, path in modules().items():
        with open(path) as f:
            text = f.read()
        if text.count("\n") > 300:
            long.append(module)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                count = len(names) + bool(a.vararg) + bool(a.kwarg) - (names[:1] in (["self"],
                                                                                      ["cls"]))
                if count > 8:
                    wide.append(f"{module}.{node.name} ({count})")
    assert not long and not wide, (long, wide)
