"""LoRA adapters in the official VoxCPM format, read strictly.

An adapter is a directory (its name is the adapter's name) holding

    lora_weights.safetensors  or  lora_weights.ckpt     what the official trainer saves: the
                                                        model's `lora_A` / `lora_B` parameters
    lora_config.json          (optional)                the official `LoRAConfig` fields

Keys are the reference's parameter names, `<module>.lora_A` [r, in] and `<module>.lora_B` [out, r]
(e.g. `base_lm.layers.0.self_attn.q_proj.lora_A`). The official `LoRALinear` adds
`(x A^T) B^T * alpha / r`. Which modules may carry one follows the reference's `_apply_lora`:
`enable_lm` the linears of `base_lm` and `residual_lm` named in `target_modules_lm`, `enable_dit`
those of `feat_decoder.estimator` named in `target_modules_dit`, `enable_proj` the top-level
linears named in `target_proj_modules`. The rank is read from the tensors; alpha and the flags come
from lora_config.json, or, without one, from what the official `VoxCPM(lora_weights_path=...)` builds
(LM and DiT on, projections off, alpha 16, the default targets).

The policy (`LoraConfig`, `check_adapter`) is torch-free; `load_adapter` reads the tensors. Anything
unexpected (a key no targeted module has, a shape that does not fit, a rank above the limit, a
non-finite value, an unknown config field) is an error naming the file and the key.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields

from ..checks import NAME_RE, NAME_RULE, shown

WEIGHT_FILES = ("lora_weights.safetensors", "lora_weights.ckpt")
CONFIG_FILE = "lora_config.json"
LM_ROOTS = ("base_lm.", "residual_lm.")
DIT_ROOT = "feat_decoder.estimator."
_SUFFIXES = (".lora_A", ".lora_B")


class LoraError(ValueError):
    pass


def check_lora_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise LoraError(f"{shown(name)} is not a valid LoRA adapter name: {NAME_RULE}")
    return name


@dataclass(frozen=True)
class LoraConfig:
    """The official `LoRAConfig` (voxcpm.model.voxcpm2). `r` None: not given, taken from the tensors."""

    enable_lm: bool = False
    enable_dit: bool = False
    enable_proj: bool = False
    r: int | None = None
    alpha: float = 16.0
    dropout: float = 0.0  # training only
    target_modules_lm: tuple = ("q_proj", "v_proj", "k_proj", "o_proj")
    target_modules_dit: tuple = ("q_proj", "v_proj", "k_proj", "o_proj")
    target_proj_modules: tuple = ("enc_to_lm_proj", "lm_to_dit_proj", "res_to_dit_proj", "fusion_concat_proj")

    @classmethod
    def from_dict(cls, d, where: str) -> "LoraConfig":
        if not isinstance(d, dict):
            raise LoraError(f"{where}: expected a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise LoraError(f"{where}: unknown field(s) {unknown}; LoRAConfig has {sorted(known)}")
        kw = {}
        for k, v in d.items():
            if k.startswith("enable_"):
                if not isinstance(v, bool):
                    raise LoraError(f"{where}: {k} must be true or false, got {v!r}")
            elif k == "r":
                if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                    raise LoraError(f"{where}: r must be a positive integer, got {v!r}")
            elif k == "alpha":
                if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < float("inf"):
                    raise LoraError(f"{where}: alpha must be a positive number, got {v!r}")
                v = float(v)
            elif k == "dropout":
                if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 1:
                    raise LoraError(f"{where}: dropout must be a number within [0, 1], got {v!r}")
                v = float(v)
            else:  # the target name lists
                if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
                    raise LoraError(f"{where}: {k} must be a list of module names, got {v!r}")
                v = tuple(v)
            kw[k] = v
        return cls(**kw)

    @classmethod
    def from_file(cls, path: str) -> "LoraConfig":
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise LoraError(f"{path}: cannot read: {e}") from None
        return cls.from_dict(raw, path)

    def targets(self, module: str) -> bool:
        """Whether the reference puts a LoRA on linear `module` (its full name in the network)."""
        short = module.rpartition(".")[2]
        if module.startswith(LM_ROOTS):
            return self.enable_lm and short in self.target_modules_lm
        if module.startswith(DIT_ROOT):
            return self.enable_dit and short in self.target_modules_dit
        return self.enable_proj and "." not in module and module in self.target_proj_modules


# What the official VoxCPM(lora_weights_path=...) builds when it is given no LoRAConfig.
DEFAULT_CONFIG = LoraConfig(enable_lm=True, enable_dit=True)


def adaptable(module: str) -> bool:
    """Whether some LoRAConfig puts a LoRA on linear `module`: the reference adapts the LMs' and
    LocDiT's linears by their short names, and the model's own (top-level) linears by attribute."""
    return module.startswith(LM_ROOTS) or module.startswith(DIT_ROOT) or "." not in module


# What slot tables reserve beyond the adapters found at load, for adapters added later (the decoder
# parameter lora_targets): the official defaults' targets, or every linear an adapter may target.
RESERVE = {"default": DEFAULT_CONFIG.targets, "all": adaptable}


@dataclass
class AdapterSpec:
    """What an adapter holds, once checked: modules -> (A key, B key), its rank and scale."""

    rank: int
    alpha: float
    modules: dict = field(default_factory=dict)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def _summary(names, limit: int = 6) -> str:
    names = sorted(names)
    return ", ".join(names[:limit]) + (f" ... ({len(names)} in all)" if len(names) > limit else "")


def check_adapter(shapes: dict, config: LoraConfig, linears: dict, max_rank: int | None, where: str) -> AdapterSpec:
    """shapes: key -> tensor shape, as in the file; linears: module name -> (in, out) of the network's
    linear layers; max_rank: the largest rank allowed (None: any). -> the adapter's spec."""
    if not shapes:
        raise LoraError(f"{where}: holds no tensors")
    keys = {}
    for key in shapes:
        # A model saved while torch.compile'd has `_orig_mod.` in its names; the reference maps it away too.
        norm = key.replace("._orig_mod.", ".").removeprefix("_orig_mod.")
        if norm in keys:
            raise LoraError(f"{where}: keys {keys[norm]!r} and {key!r} name the same parameter")
        keys[norm] = key
    bad = [k for k in keys if not k.endswith(_SUFFIXES)]
    if bad:
        raise LoraError(f"{where}: unknown key(s) {_summary(bad)}: a LoRA file holds only <module>.lora_A "
                        "and <module>.lora_B")
    modules = {k[:-len(".lora_A")] for k in keys}
    missing_layer = [m for m in modules if m not in linears]
    if missing_layer:
        raise LoraError(f"{where}: unknown key(s) for {_summary(missing_layer)}: no such linear layer in VoxCPM2")
    untargeted = [m for m in modules if not config.targets(m)]
    if untargeted:
        raise LoraError(f"{where}: unknown key(s) for {_summary(untargeted)}: not a target of this adapter's "
                        f"LoRAConfig (enable_lm={config.enable_lm}, enable_dit={config.enable_dit}, "
                        f"enable_proj={config.enable_proj}, and the target_* lists)")
    spec = AdapterSpec(rank=0, alpha=config.alpha)
    ranks = {}
    for m in sorted(modules):
        a_key, b_key = m + ".lora_A", m + ".lora_B"
        if a_key not in keys or b_key not in keys:
            raise LoraError(f"{where}: {keys.get(a_key) or keys.get(b_key)!r} has no matching "
                            f"{'lora_B' if a_key in keys else 'lora_A'}")
        n_in, n_out = linears[m]
        a, b = tuple(shapes[keys[a_key]]), tuple(shapes[keys[b_key]])
        if len(a) != 2 or a[1] != n_in:
            raise LoraError(f"{where}: tensor {keys[a_key]} has shape {list(a)}, expected [r, {n_in}]")
        if len(b) != 2 or b[0] != n_out or b[1] != a[0]:
            raise LoraError(f"{where}: tensor {keys[b_key]} has shape {list(b)}, expected [{n_out}, {a[0]}] "
                            f"(its lora_A has rank {a[0]})")
        if a[0] < 1:
            raise LoraError(f"{where}: tensor {keys[a_key]} has rank 0")
        ranks.setdefault(a[0], keys[a_key])
        spec.modules[m] = (keys[a_key], keys[b_key])
    if len(ranks) > 1:
        found = ", ".join(f"{k}: {r}" for r, k in sorted(ranks.items()))
        raise LoraError(f"{where}: tensors of different ranks ({found}); an adapter has one rank")
    spec.rank = next(iter(ranks))
    if config.r is not None and config.r != spec.rank:
        raise LoraError(f"{where}: {CONFIG_FILE} says r={config.r} but the tensors have rank {spec.rank}")
    if max_rank is not None and spec.rank > max_rank:
        raise LoraError(f"{where}: rank {spec.rank} is above the largest rank allowed, {max_rank} "
                        "(parameter max_lora_rank)")
    return spec


@dataclass
class Adapter:
    """A checked adapter: weights[module] = (A [r, in], B [out, r]) float32 CPU tensors."""

    name: str
    path: str
    spec: AdapterSpec
    config: LoraConfig
    weights: dict

    @property
    def rank(self) -> int:
        return self.spec.rank

    @property
    def scale(self) -> float:
        return self.spec.scale

    @property
    def modules(self) -> list[str]:
        return sorted(self.weights)


def weights_file(path: str) -> str:
    for n in WEIGHT_FILES:
        f = os.path.join(path, n)
        if os.path.isfile(f):
            return f
    raise LoraError(f"{path}: no LoRA weights (expected {' or '.join(WEIGHT_FILES)})")


def read_config(path: str) -> LoraConfig:
    f = os.path.join(path, CONFIG_FILE)
    return LoraConfig.from_file(f) if os.path.isfile(f) else DEFAULT_CONFIG


def load_adapter(path: str, linears: dict, max_rank: int | None = None, name: str | None = None,
                 dtype=None) -> Adapter:
    """Read and check the adapter in directory `path` (its name: the directory's, unless given).
    dtype: what the slot tables hold (float32 if None); lora_A and lora_B times alpha / r must fit it."""
    import torch  # only where tensors are read

    from .checkpoint import CheckpointError, load_tensors

    name = check_lora_name(name if name is not None else os.path.basename(os.path.normpath(path)))
    if not os.path.isdir(path):
        raise LoraError(f"LoRA adapter directory not found: {path}")
    file = weights_file(path)
    config = read_config(path)
    try:
        sd = load_tensors(file)
    except CheckpointError as e:
        raise LoraError(str(e)) from None
    spec = check_adapter({k: tuple(v.shape) for k, v in sd.items()}, config, linears, max_rank, file)
    for key in (k for pair in spec.modules.values() for k in pair):
        if not sd[key].is_floating_point():
            raise LoraError(f"{file}: tensor {key} has dtype {sd[key].dtype}, expected floating point")
    weights = {m: (sd[a].float(), sd[b].float()) for m, (a, b) in spec.modules.items()}
    # The tables hold lora_A and lora_B times alpha / r (model.lora) in `dtype`: both must fit it.
    dtype = dtype or torch.float32
    top, kind = torch.finfo(dtype).max, str(dtype).removeprefix("torch.")
    fits = lambda t: bool(t.abs().max() <= top)  # noqa: E731 - false for inf and nan too
    over = [spec.modules[m][0] for m, (a, _) in weights.items() if not fits(a)]
    if over:
        raise LoraError(f"{file}: {_summary(over)} has values past {kind}'s range (the dtype the server holds adapters in)")
    over = [spec.modules[m][1] for m, (_, b) in weights.items() if not fits(b * spec.scale)]
    if over:
        raise LoraError(f"{file}: {_summary(over)} times alpha / r ({spec.alpha:g} / {spec.rank}) overflows {kind}")
    return Adapter(name, path, spec, config, weights)


def scan(lora_dir: str) -> list[str]:
    """The adapter directories under `lora_dir`, sorted by name (hidden entries left out)."""
    if not os.path.isdir(lora_dir):
        raise LoraError(f"LoRA directory not found: {lora_dir}")
    return sorted(n for n in os.listdir(lora_dir)
                  if not n.startswith(".") and os.path.isdir(os.path.join(lora_dir, n)))


def load_dir(lora_dir: str, linears: dict, max_rank: int | None = None, dtype=None) -> tuple[dict, dict]:
    """Every adapter under `lora_dir` -> ({name: Adapter}, {name: error}): a broken adapter is reported
    in the second and left out, the others load."""
    adapters, errors = {}, {}
    for n in scan(lora_dir):
        try:
            adapters[n] = load_adapter(os.path.join(lora_dir, n), linears, max_rank, name=n, dtype=dtype)
        except LoraError as e:
            errors[n] = str(e)
    return adapters, errors
