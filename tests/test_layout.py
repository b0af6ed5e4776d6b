"""The package's layout: every intra-package import names a module that exists (a relative one
too: it may sit in a function only a GPU runs, as one did), the import graph has no cycles, the
kernels are leaves, and the server reaches the test-fixture generators (`testing/`) through one
narrow entry only.

Every import statement counts (module level, inside functions, under try), absolute
`voxcpm_triton.x` and relative alike.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = "voxcpm_triton"
ROOT = Path(__file__).resolve().parent.parent / "python_backend" / PKG
# The one way into testing/ from outside it, and where it may be used.
TESTING_ENTRY = f"{PKG}.testing.ensure_tiny_checkpoint"
TESTING_ENTRY_SITES = {f"{PKG}.serving.parameters"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports(path: Path, modules: dict[str, Path]) -> set[tuple[str, str | None]]:
    """(module imported, name imported from it or None) for every intra-package import of `path`.
    `from pkg import x` where x is a module counts as importing that module."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[tuple[str, str | None]] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {(a.name, None) for a in node.names if a.name.split(".")[0] == PKG}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > len(base):  # past the top-level package: an ImportError once it runs
                    found.add(("." * node.level + (node.module or ""), None))
                    continue
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PKG:
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                found.add((sub, None) if sub in modules else (target, a.name))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    graph = {}
    for name, path in modules.items():
        graph[name] = {m for m, _ in imports(path, modules) if m != name}
        unknown = graph[name] - set(modules)
        assert not unknown, f"{name} imports modules that do not exist: {sorted(unknown)}"
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(n):
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_graph_sees_every_kind_of_import():
    g = import_graph()
    assert f"{PKG}.checks" in g[f"{PKG}.engine.engine"]  # `from .. import checks`
    assert f"{PKG}.kernels.paged_attention" in g[f"{PKG}.engine.attention"]  # inside a method
    assert f"{PKG}.kernels.vae" in g[f"{PKG}.model.audio_vae"]  # inside a method
    assert f"{PKG}.voxcpm2" in g[f"{PKG}"]  # the lazy VoxCPM2 re-export
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_folders_form_layers():
    """No two folders (or top-level modules) import each other, directly or through others: each
    folder can be read knowing only those below it (kernels, gpu, model, formats, engine, audio,
    serving, ...)."""
    def unit(module: str) -> str:
        return ".".join(module.split(".")[:2])

    folders: dict[str, set[str]] = {}
    for name, deps in import_graph().items():
        folders.setdefault(unit(name), set()).update(unit(d) for d in deps if unit(d) != unit(name))
    cycle = find_cycle(folders)
    assert cycle is None, "folders import each other: " + " -> ".join(cycle)


def test_kernels_are_leaves():
    for name, deps in import_graph().items():
        if name.startswith(f"{PKG}.kernels"):
            outside = {d for d in deps if not d.startswith(f"{PKG}.kernels")}
            assert not outside, f"{name} imports {sorted(outside)}: kernels import only kernels/"


def test_the_gpu_utilities_are_leaves():
    """gpu/ is what engine/ and audio/ share: it knows neither."""
    for name, deps in import_graph().items():
        if name.startswith(f"{PKG}.gpu"):
            outside = {d for d in deps if d.startswith(PKG) and not d.startswith(f"{PKG}.gpu")}
            assert not outside, f"{name} imports {sorted(outside)}: gpu/ imports only gpu/"


def test_testing_reached_through_one_entry():
    modules = package_modules()
    entry_module, _, entry_name = TESTING_ENTRY.rpartition(".")
    sites = set()
    for name, path in modules.items():
        if name.startswith(f"{PKG}.testing"):
            continue
        for module, imported in imports(path, modules):
            if not module.startswith(f"{PKG}.testing"):
                continue
            assert (module, imported) == (entry_module, entry_name), (
                f"{name} imports {module}{'.' + imported if imported else ''}: outside testing/, only "
                f"{TESTING_ENTRY} may be imported")
            sites.add(name)
    assert sites == TESTING_ENTRY_SITES, sites


# --- the OpenAI gateway: a client of Triton, no model code ------------------------------------------

GATEWAY = ROOT.parent.parent / "gateway" / "voxcpm_gateway"
# what would put model code (or the server's internals) into the gateway process
GATEWAY_FORBIDDEN = {"torch", "triton", PKG, "triton_python_backend_utils", "voxcpm_client", "safetensors",
                     "tokenizers"}


def top_level_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_gateway_imports_no_model_code():
    files = sorted(GATEWAY.rglob("*.py"))
    assert len(files) >= 5, files
    for path in files:
        bad = top_level_imports(path) & GATEWAY_FORBIDDEN
        assert not bad, f"{path.relative_to(GATEWAY.parent.parent)} imports {sorted(bad)}: the gateway only talks to Triton"


def _loads_without(path: Path, imports: str, forbidden: set[str], also: str = "") -> None:
    """`import imports` in a fresh interpreter with only `path` on PYTHONPATH loads no module of the
    `forbidden` packages (nor, `also`, one module more); a failed import fails too."""
    import subprocess
    import sys

    code = (f"import sys, {imports}; bad = sorted(m for m in sys.modules if m.split('.')[0] in {forbidden!r} "
            f"or m == {also!r}); assert not bad, bad")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(path)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_gateway_starts_without_torch():
    """Its whole import graph (app, server entry point) loads with gateway/ alone on the path, and
    torch is not among what it loaded."""
    _loads_without(GATEWAY.parent, "voxcpm_gateway.__main__, voxcpm_gateway.app, voxcpm_gateway.config; "
                   "voxcpm_gateway.app.create_app(voxcpm_gateway.config.parse_args([]))", {"torch", "voxcpm_triton"})


def test_the_scheduler_and_block_manager_load_without_torch():
    """The engine's policy is plain Python (engine/scheduler.py's docstring): importing it, through
    the engine package, loads neither torch nor the engine itself."""
    _loads_without(ROOT.parent, "voxcpm_triton.engine.scheduler, voxcpm_triton.engine.block_manager",
                   {"torch", "triton", "numpy"}, also="voxcpm_triton.engine.engine")


def test_the_orchestrators_load_without_torch():
    """`tts`, `tts_stream`, `voices` and the tokenizer run as many light processes: they read config.json
    through model.config (the same rules and defaults as the decoder) without loading torch."""
    _loads_without(ROOT.parent, "voxcpm_triton.serving.tts_models, voxcpm_triton.serving.voices_model, "
                   "voxcpm_triton.serving.tokenizer_model, voxcpm_triton.model.config", {"torch", "triton"})


# --- the supervisor: runs outside Triton, standard library only --------------------------------------

def test_the_supervisor_loads_the_standard_library_only():
    """What scripts/supervise.py and scripts/probe.py run (the package's cli, with the loop under it,
    guard and probe) runs where the models' packages may not be installed (the container's
    healthcheck, a bare host): what it loads beyond the interpreter's start-up is the standard
    library and this package."""
    import subprocess
    import sys

    code = ("import sys; before = set(sys.modules); "
            "import voxcpm_triton.supervisor.cli, voxcpm_triton.supervisor.guard, voxcpm_triton.supervisor.probe; "
            f"bad = sorted(m for m in set(sys.modules) - before if m.split('.')[0] not in sys.stdlib_module_names "
            f"and m.split('.')[0] != {PKG!r}); assert not bad, bad")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT.parent)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_only_the_supervisor_imports_the_supervisor():
    """The models run inside Triton and know nothing of what runs them: the supervisor reads what
    they share (coordination/), never the other way round."""
    for name, deps in import_graph().items():
        if not name.startswith(f"{PKG}.supervisor"):
            inside = sorted(d for d in deps if d.startswith(f"{PKG}.supervisor"))
            assert not inside, f"{name} imports {inside}"


def test_coordination_imports_only_itself():
    """coordination/ is what the models and the supervisor share: it knows neither."""
    for name, deps in import_graph().items():
        if name.startswith(f"{PKG}.coordination"):
            outside = {d for d in deps if not d.startswith(f"{PKG}.coordination")}
            assert not outside, f"{name} imports {sorted(outside)}: coordination/ imports only coordination/"


def test_the_supervisor_imports_only_itself_and_coordination():
    """The supervisor runs outside Triton: nothing of the models (serving/), the engine or torch."""
    for name, deps in import_graph().items():
        if name.startswith(f"{PKG}.supervisor"):
            outside = {d for d in deps if not d.startswith((f"{PKG}.supervisor", f"{PKG}.coordination"))}
            assert not outside, f"{name} imports {sorted(outside)}: the supervisor imports only coordination/"


def test_the_readmes_map_has_every_folder_and_top_level_module():
    """README's "Where things live": a row for each folder of the package, the top-level modules
    named, and every module of the folders whose row lists files (a newcomer's map of the code)."""
    readme = (ROOT.parent.parent / "README.md").read_text()
    start = readme.index("Where things live")
    table = readme[start:readme.index("\n\n", readme.index("| folder | holds |", start))]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([^`]+)/` \| (.*) \|$", table, re.M)}
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert folders == set(rows), (sorted(folders), sorted(rows))
    top = {p.name for p in ROOT.glob("*.py") if p.name != "__init__.py"}
    assert not [name for name in sorted(top) if f"`{name}`" not in table], table
    for folder in ("serving", "coordination", "supervisor", "audio", "gpu"):
        files = {p.name for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py"}
        named = set(re.findall(r"`(\w+\.py)`", rows[folder]))
        missing = files - named
        if folder == "serving":  # "a `*_model.py` each" names these three by their models
            missing -= {"decoder_model.py", "tokenizer_model.py", "normalizer_model.py"}
        assert not missing, f"README's {folder}/ row does not name {sorted(missing)}"
