"""The house's rules, checked on the source: imports point one way, no module takes another's
private names, no module passes 400 lines, and the old import paths still work.

Imports are read with `ast` from every module of `loader`, `sampler` and `scripts`: those at
the top, inside functions, and under ``if TYPE_CHECKING`` alike (a cycle hidden in a
function or a type-only import is still a cycle a reader must follow).
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
import zipfile
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("loader", "sampler", "scripts")
# the names the distribution installs the repository's folders as (pyproject's package-dir)
INSTALLED = {
    "loader.shardstream": "shardstream",
    "loader": "shardstream.loader",
    "sampler": "shardstream.sampler",
    "scripts.plan": "shardstream.plan",
    "scripts.write": "shardstream.write",
}
MAX_ROOM_MODULES = 15  # a room (a package's own modules) a reader takes in at a glance
MAX_LINES = 400
MAX_DOCSTRING_LINES = 35  # StreamingDataset's docstring: a summary; the arguments in the reference
MAX_BENCHMARK_LINES = 320  # docs/benchmarks.md: today's figures; the history is in git
REFERENCE = REPO / "docs" / "reference.md"
# loader's rooms, bottom up: each may import only the rooms before it (and loader's leaf
# modules errors, stats, shard); loader's other top modules sit above all of them
ROOMS = ["storage", "cache", "columns", "formats", "index", "read", "tokens"]
LOADER = "shardstream.loader"
LEAVES = {f"{LOADER}.errors", f"{LOADER}.stats", f"{LOADER}.shard"}


def modules(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, tuple[Path, bool]]:
    """{dotted module name, as installed: (file, is a package's __init__)} under `root`."""
    found = {}
    for package in packages:
        for f in sorted((root / package).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            found[installed(".".join(parts[:-1] if is_pkg else parts))] = (f, is_pkg)
    return found


def installed(name: str) -> str:
    """A module's name as installed: the longest folder prefix that package-dir maps."""
    for folder in sorted(INSTALLED, key=len, reverse=True):
        if name == folder or name.startswith(folder + "."):
            return INSTALLED[folder] + name[len(folder) :]
    return name


def imports(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[tuple[str, str, str]]:
    """(importer, imported module, name) for every import between the modules; `name` is
    the name taken from the module ("" for a plain ``import a.b``)."""
    mods = modules(root, packages)
    out = []
    for mod, (path, is_pkg) in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                if node.level:
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in mods:  # `from package import module`
                        out.append((mod, sub, ""))
                    elif target in mods:
                        out.append((mod, target, alias.name))
            elif isinstance(node, ast.Import):
                out.extend((mod, a.name, "") for a in node.names if a.name in mods)
    return [(a, b, n) for a, b, n in out if a != b]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def graph(found: list[tuple[str, str, str]]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for a, b, _ in found:
        edges[a].add(b)
    return edges


def room(module: str) -> str:
    """A loader module's room (its subpackage), or the module itself at loader's top."""
    parts = module.removeprefix(LOADER + ".").split(".")
    if module.startswith(LOADER + ".") and len(parts) > 1 and parts[0] in ROOMS:
        return f"{LOADER}.{parts[0]}"
    return module


def test_no_module_import_cycle() -> None:
    found = cycles(graph(imports(REPO)))
    assert found == [], f"import cycles: {found}"


def test_rooms_import_only_the_rooms_below() -> None:
    """storage < cache < columns < formats < index < read < tokens < loader's top modules."""
    order = {f"{LOADER}.{r}": k for k, r in enumerate(ROOMS)}
    wrong = []
    for a, b, _ in imports(REPO):
        ra, rb = room(a), room(b)
        if not (a.startswith(LOADER + ".") and b.startswith(LOADER + ".")) or ra == rb:
            continue
        if b in LEAVES or b == LOADER:
            continue
        if ra in order and (rb not in order or order[rb] > order[ra]):
            wrong.append(f"{a} -> {b}")
    assert wrong == [], "imports that climb a room: " + "; ".join(wrong)


def test_no_module_imports_anothers_private_names() -> None:
    taken = [
        f"{a} takes {b}.{n}"
        for a, b, n in imports(REPO)
        if n.startswith("_") and not n.startswith("__")
    ]
    assert taken == [], "private names used across modules: " + "; ".join(taken)


def test_no_module_passes_400_lines() -> None:
    long = {
        str(path.relative_to(REPO)): n
        for path, _ in modules(REPO).values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


def test_the_checks_see_a_cycle_a_private_import_and_a_climb(tmp_path: Path) -> None:
    """The checks above can fail: on a small package with each fault, they find it."""
    pkg = tmp_path / "loader"
    (pkg / "storage").mkdir(parents=True)
    (pkg / "read").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "storage" / "__init__.py").write_text("")
    (pkg / "read" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n"
    )
    (pkg / "storage" / "s.py").write_text("from ..read.r import _hidden\n")
    (pkg / "read" / "r.py").write_text("_hidden = 1\n")
    found = imports(tmp_path, ("loader",))
    assert cycles(graph(found)) == [[f"{LOADER}.a", f"{LOADER}.b"]]
    assert (f"{LOADER}.storage.s", f"{LOADER}.read.r", "_hidden") in found
    assert room(f"{LOADER}.storage.s") == f"{LOADER}.storage"
    assert room(f"{LOADER}.a") == f"{LOADER}.a"


@pytest.mark.parametrize(
    "statement",
    [
        "from shardstream.loader import StreamingDataset, ShardIndex, Stream, Batch, Shard",
        "from shardstream.loader import MixtureDataset, RetryPolicy, ShardError, StaleIndexError",
        "from shardstream.loader.index import ShardIndex",
        "import shardstream; shardstream.StreamingDataset; shardstream.ShardIndex",
        "from shardstream import *",
        "from shardstream.sampler import DistributedSampler, ShardSampler, MixtureSampler",
        "from shardstream.sampler import build_plan, all_plans, Plan, Chunk, distinct_per_batch",
    ],
)
def test_the_public_import_paths_work_in_a_fresh_interpreter(statement: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", statement], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_a_mixture_is_a_streaming_dataset(tmp_path: Path) -> None:
    """The mixture is not a subclass (it stands on loader.base beside StreamingDataset),
    but `StreamingDataset([Stream, ...])` gives one that isinstance still calls one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardstream.loader import MixtureDataset, Stream, StreamingDataset

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"id": list(range(8))}), tmp_path / name / "part-0.parquet")
    ds = StreamingDataset([Stream(str(tmp_path / "a")), Stream(str(tmp_path / "b"))])
    assert type(ds) is MixtureDataset
    assert isinstance(ds, StreamingDataset) and issubclass(MixtureDataset, StreamingDataset)
    assert sorted(r["id"] for r in ds) == sorted(list(range(8)) * 2)


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        # planning alone: no torch, nothing of the dataset
        ("import shardstream.loader", "False False"),
        # a process with torch trains: the dataset's modules come with the loader, not
        # inside its first construction
        ("import torch; import shardstream.loader", "True True"),
    ],
)
def test_import_loader_brings_the_dataset_only_with_torch(statement: str, expected: str) -> None:
    shown = "print('torch' in sys.modules, 'shardstream.loader.dataset' in sys.modules)"
    code = f"{statement}; import sys; {shown}"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == expected


def class_docstring_lines(path: Path, name: str) -> int:
    """Lines of class `name`'s docstring in the module at `path` (read with `ast`)."""
    tree = ast.parse(path.read_text(), str(path))
    (cls,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    return len((ast.get_docstring(cls, clean=False) or "").splitlines())


def reference_arguments(text: str) -> set[str]:
    """The names in backticks in the first cell of each table row of the reference's
    StreamingDataset section (to the next ``## `` heading)."""
    start = text.index("## `StreamingDataset")
    end = text.find("\n## ", start + 1)
    names: set[str] = set()
    for line in text[start : None if end < 0 else end].splitlines():
        if line.startswith("|"):
            names.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


def test_the_streaming_dataset_docstring_is_a_summary() -> None:
    """help(StreamingDataset) reads in a terminal: the arguments are in docs/reference.md."""
    n = class_docstring_lines(REPO / "loader" / "dataset.py", "StreamingDataset")
    assert n <= MAX_DOCSTRING_LINES, (
        f"StreamingDataset's docstring has {n} lines (at most {MAX_DOCSTRING_LINES}): "
        "move the detail to docs/reference.md"
    )


def test_the_benchmarks_doc_holds_todays_table_only() -> None:
    n = len((REPO / "docs" / "benchmarks.md").read_text().splitlines())
    assert n <= MAX_BENCHMARK_LINES, (
        f"docs/benchmarks.md has {n} lines (at most {MAX_BENCHMARK_LINES}): keep the newest "
        "run of each row; the dated history stays in git"
    )


def test_every_argument_is_a_row_of_the_reference() -> None:
    """Every parameter of StreamingDataset (and of MixtureDataset, whose `streams` is the
    `source` row) has a row of docs/reference.md's argument table."""
    from shardstream.loader import MixtureDataset, StreamingDataset

    documented = reference_arguments(REFERENCE.read_text())
    missing = [
        p
        for cls in (StreamingDataset, MixtureDataset)
        for p in list(inspect.signature(cls.__init__).parameters)[1:]
        if p not in documented and not (cls is MixtureDataset and p == "streams")
    ]
    assert missing == [], f"arguments without a row in docs/reference.md: {missing}"


# --- one installed name -------------------------------------------------------------------


def test_a_built_wheel_installs_one_top_level_name(tmp_path: Path) -> None:
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("shardstream-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {
        "shardstream",
        wheel.name.split("-py")[0] + ".dist-info",
    }
    for module in (
        "__init__.py",
        "loader/dataset.py",
        "sampler/epoch.py",
        "plan/cli.py",
        "write/cli.py",
    ):
        assert f"shardstream/{module}" in names
    assert "shardstream/loader/shardstream/__init__.py" not in names  # the front, once
    entry = zipfile.ZipFile(wheel).read(wheel.name.split("-py")[0] + ".dist-info/entry_points.txt")
    assert b"shardstream-plan = shardstream.plan.cli:main" in entry
    assert b"shardstream-write = shardstream.write.cli:main" in entry


def test_a_users_own_loader_sampler_and_scripts_do_not_shadow_ours(tmp_path: Path) -> None:
    # common names in a training repository, beside train.py: each raises if imported
    for name in ("loader", "sampler", "scripts", "plan", "write"):
        (tmp_path / f"{name}.py").write_text(f"raise RuntimeError('the user's {name}.py')\n")
    pq.write_table(pa.table({"id": list(range(10))}), tmp_path / "part-0.parquet")
    (tmp_path / "train.py").write_text(
        "import shardstream\n"
        "ds = shardstream.StreamingDataset('part-0.parquet', shuffle=False)\n"
        "print(sorted(r['id'] for r in ds))\n"
    )
    done = subprocess.run(
        [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(list(range(10)))


def test_shardstreams_namespace_is_its_public_api() -> None:
    import shardstream

    assert set(dir(shardstream)) == {*shardstream.__all__, "loader", "sampler"}
    for name in ("ModuleType", "importlib", "annotations"):
        assert not hasattr(shardstream, name)


def test_no_room_holds_more_than_15_modules() -> None:
    rooms: dict[str, int] = defaultdict(int)
    for name, (_, is_pkg) in modules(REPO, ("loader", "sampler", "scripts")).items():
        if not is_pkg:
            rooms[name.rsplit(".", 1)[0]] += 1
    big = {r: n for r, n in rooms.items() if n > MAX_ROOM_MODULES}
    assert big == {}, f"rooms over {MAX_ROOM_MODULES} modules: {big}"
