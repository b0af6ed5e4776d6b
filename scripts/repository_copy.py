#!/usr/bin/env python3
"""Copy a model repository with some model parameters changed, checked before any server starts.

    python3 scripts/repository_copy.py SRC DST decoder.timestep_buckets=10,100 decoder.playback_margin_ms=150

SRC is any model repository (the project's `model_repository`, or an older commit's unpacked with
`git archive`); DST must not exist yet. Each MODEL.KEY=VALUE sets that parameter in DST's
MODEL/config.pbtxt (replaced, or appended where the file does not give it). The copy is then read
as the models read it at start-up, through the parameter table of VOXCPM_PYTHON_BACKEND's
package (this checkout's python_backend by default; give an older commit's for its repository):
an unknown model or parameter, a value it does not allow, or a broken rule between models is an
error that names it, and DST is removed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _parameters_module(backend: str | None = None):
    """voxcpm_triton.serving.parameters (stdlib only, no torch): this checkout's, or loaded from the file
    of another python_backend (an older commit's table), under a name of its own."""
    if backend is None:
        sys.path.insert(0, os.path.join(REPO, "python_backend"))
        from voxcpm_triton.serving import parameters

        return parameters
    path = os.path.join(backend, "voxcpm_triton", "serving", "parameters.py")
    if not os.path.isfile(path):
        raise ValueError(f"VOXCPM_PYTHON_BACKEND={backend} has no voxcpm_triton/serving/parameters.py")
    spec = importlib.util.spec_from_file_location("voxcpm_parameters_of_backend", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - another commit's file: whatever breaks, name it
        raise ValueError(f"{path} does not load: {type(e).__name__}: {e}") from e
    if not all(hasattr(module, name) for name in ("TABLE", "parse_values", "read_pbtxt", "sibling_values",
                                                  "check_invariants")):
        raise ValueError(f"{path} has no parameter table this script can read")
    return module


def parse_sets(specs: list[str], models: list[str]) -> dict[str, dict[str, str]]:
    """MODEL.KEY=VALUE strings -> {model: {key: value}}; ValueError naming a malformed one or an unknown model."""
    sets: dict[str, dict[str, str]] = {}
    for spec in specs:
        target, eq, value = spec.partition("=")
        model, dot, key = target.partition(".")
        if not (eq and dot and model and key):
            raise ValueError(f"{spec!r} is not MODEL.KEY=VALUE (e.g. decoder.timestep_buckets=10,100)")
        if model not in models:
            raise ValueError(f"{spec!r}: the repository has no model {model!r} (it has {', '.join(models)})")
        sets.setdefault(model, {})[key] = value
    return sets


def check(parameters, repo: str, changed) -> None:
    """Read each changed model's config.pbtxt in `repo` as the model would (its values, and the rules that
    tie it to its siblings): ValueError naming what is wrong."""
    for model in changed:
        parameters.parse_values(model, parameters.read_pbtxt(os.path.join(repo, model, "config.pbtxt"))[0],
                                env=False)
    configs = {name: values for name in parameters.TABLE
               if (values := parameters.sibling_values(os.path.join(repo, name), name)) is not None}
    for model in changed:
        parameters.check_invariants(configs, model)


def repository_copy(src: str, dst: str, specs: list[str]) -> dict[str, dict[str, str]]:
    """Copy `src` to `dst` with the MODEL.KEY=VALUE `specs` set, checked (module doc) -> what was set."""
    writer = _parameters_module()
    backend = os.environ.get("VOXCPM_PYTHON_BACKEND")
    own = os.path.realpath(os.path.join(REPO, "python_backend"))
    table = writer if not backend or os.path.realpath(backend) == own else _parameters_module(backend)
    if not os.path.isdir(src):
        raise ValueError(f"no model repository at {src}")
    if os.path.exists(dst):
        raise ValueError(f"{dst} exists already: give a new path")
    real_src, real_dst = os.path.realpath(src), os.path.realpath(dst)
    if os.path.commonpath([real_src, real_dst]) == real_src:
        # inside it, Triton would take the copy for a model of the repository, and fail to load it
        raise ValueError(f"{dst} is inside {src}: give a path outside the repository")
    models = sorted(m for m in os.listdir(src) if os.path.isfile(os.path.join(src, m, "config.pbtxt")))
    sets = parse_sets(specs, models)
    try:
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        for model, values in sets.items():
            cfg = os.path.join(dst, model, "config.pbtxt")
            with open(cfg, encoding="utf-8") as f:
                text = writer.with_parameters(f.read(), values)
            with open(cfg, "w", encoding="utf-8") as f:
                f.write(text)
        check(table, dst, sets)
    except Exception:
        shutil.rmtree(dst, ignore_errors=True)
        raise
    return sets


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", help="the model repository to copy")
    ap.add_argument("dst", help="where the copy goes (must not exist)")
    ap.add_argument("sets", nargs="*", metavar="MODEL.KEY=VALUE", help="a parameter to set")
    args = ap.parse_args(argv)
    try:
        sets = repository_copy(args.src, args.dst, args.sets)
    except (ValueError, OSError) as e:  # shutil.Error is an OSError
        print(f"[repository_copy] {type(e).__name__ + ': ' if isinstance(e, OSError) else ''}{e}", file=sys.stderr)
        return 2
    for model, values in sets.items():
        for key, value in values.items():
            print(f"[repository_copy] {model}.{key} = {value!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
