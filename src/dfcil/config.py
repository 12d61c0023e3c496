"""The run configuration's types: frozen, validated dataclasses (one per section), strict decoding of one section,
YAML reading, and saving the resolved config.

A run is described by one YAML document with the sections ``method``, ``data``, ``model``, ``train`` and ``engine``
and a few top-level keys (``seed``, ``device``, ...). Validation is strict: unknown keys and ill-typed values are
errors that name the key and the fix. Every method's hyper-parameters are a :class:`MethodConfig` subclass declared
next to its code; which one validates a config's ``method`` section is looked up by :mod:`dfcil.load`, which sits
above the methods. This module knows no method. The validated config is saved as ``config.yaml`` in every run
directory and is all that is needed to repeat the run.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import stat
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BeforeValidator, ConfigDict, Field, Strict, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass as _pydantic_dataclass

from dfcil import presets
from dfcil.errors import ConfigError
from dfcil.io import NotARegularFile, read_regular_text

T = TypeVar("T")


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("Input should be a valid number, not a yes/no value")
    return value


# A YAML `true` is not the number 1, nor `3.0` an epoch count, nor `.inf` a learning rate. Floats stay lax otherwise:
# YAML reads `1e-2` (no dot) as a string, which they take as the number it spells.
Int = Annotated[int, Strict()]
Float = Annotated[float, BeforeValidator(_not_bool), Field(allow_inf_nan=False)]
PositiveInt = Annotated[int, Strict(), Field(ge=1)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0)]
PositiveFloat = Annotated[float, BeforeValidator(_not_bool), Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, BeforeValidator(_not_bool), Field(ge=0, allow_inf_nan=False)]
Seed = Annotated[int, Strict(), Field(ge=0, lt=2**63)]  # what torch.manual_seed takes
# An lr milestone: an epoch from the phase's start, or a fraction of the phase strictly between 0 and 1
Milestone = Annotated[int, Strict(), Field(ge=0)] | Annotated[float, BeforeValidator(_not_bool), Field(gt=0, lt=1)]


def _yaml_switch(value: Any) -> Any:
    """YAML reads a bare on/off (and yes/no, true/false) as a bool: map it back to "on"/"off"."""
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


OnOffCheck = Annotated[Literal["off", "on", "check"], BeforeValidator(_yaml_switch)]


def _auto_is_unset(value: Any) -> Any:
    return None if value == "auto" else value


# A side in pixels, or None (also spelled `auto`): the dataset's own
ImageSize = Annotated[PositiveInt | None, BeforeValidator(_auto_is_unset)]


def configclass(cls: type[T]) -> type[T]:
    """Make ``cls`` a frozen, validated dataclass that rejects unknown keys."""
    return _pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid"))(cls)


@configclass
class DataConfig:
    name: str = "cifar100"  # registered dataset (see `dfcil datasets`)
    root: str | None = None  # data root; None → $DFCIL_DATA, else the per-user cache directory
    download: bool = False  # fetch (and checksum) the official archive when the data root lacks it
    num_tasks: PositiveInt = 5  # N, tasks in the protocol, first task included
    base_classes: NonNegativeInt = 0  # classes in the first task; 0 → equal split (reference: init_task_splits)
    class_order: tuple[Int, ...] | None = None  # explicit order of raw class ids; overrides class_order_seed
    class_order_seed: Int = 0  # order = random.Random(seed).shuffle(range(C)), as ABD and R-DFCIL
    num_classes: PositiveInt | None = None  # keep only the first K classes of the order (mini protocols)
    train_per_class: PositiveInt | None = None  # cap on training images per class (first n in file order)
    test_per_class: PositiveInt | None = None  # cap on test images per class (first n in file order)
    # side of the (square) images in pixels; auto (or None): the dataset's own (CIFAR-100 32, Tiny-ImageNet 64,
    # ImageNet-100 224, `arrays` its arrays'), for `folder` what its images hold: the shorter side they share, else
    # the median shorter side (smaller images enlarged). Decoded datasets are resized (shorter side) and
    # centre-cropped to it, as the reference does; `folder` refuses images smaller than an explicit size.
    image_size: ImageSize = None
    # per-channel normalisation of x / 255; None: the dataset's (the reference's constants, or computed from the
    # training images of `folder` and `arrays` datasets and cached)
    mean: tuple[Float, Float, Float] | None = None
    std: tuple[PositiveFloat, PositiveFloat, PositiveFloat] | None = None
    # the border of the training images' pad-4 random crop: mean (the normalised image padded with zeros, the mean
    # colour: R-DFCIL's and ABD's codes normalise first) or black (torchvision's RandomCrop on the raw image, before
    # normalising: the PyCIL and FACIL codes of FeCAM, LDC and EFC)
    crop_fill: Literal["mean", "black"] = "mean"
    # the training images' augmentation, the same for every method (a protocol setting): cropflip (pad-4 random crop
    # and horizontal flip, the R-DFCIL and ABD codes') or autoaugment (crop and flip, then brightness jitter of
    # ±63/255 and AutoAugment's learned policy per image: CIFAR-10's up to 32 px, ImageNet's above; APR-EFCIL's
    # recipe). Synthetic images are never augmented. docs/data.md
    augment: Literal["cropflip", "autoaugment"] = "cropflip"
    cache: str | None = None  # decoded datasets' cache; None: $DFCIL_CACHE, else ~/.cache/dfcil/prepared; runtime
    workers: PositiveInt | None = None  # processes that decode images; None: every core; runtime only
    # prepare the decoded-image cache again from the source, replacing the old one (a stale or foreign cache is
    # refused otherwise); runtime only, and saved as false: a resume does not rebuild again unless asked
    rebuild: bool = False

    def __post_init__(self) -> None:
        for key, value in (("root", self.root), ("cache", self.cache)):
            if value is not None and not value.strip():  # "" would mean the directory the command ran in
                raise ValueError(
                    f"data.{key}: an empty path; give a directory, or leave it unset (null) for the default"
                )
        if self.class_order is not None and self.class_order_seed != 0:
            raise ValueError(
                f"data.class_order is given, so data.class_order_seed ({self.class_order_seed}) would be ignored and "
                f"every seed would train the same order; set data.class_order: null to draw the order from the seed "
                f"(or leave the seed at 0 to train the given order)"
            )


@configclass
class ModelConfig:
    # registered backbone; auto: by image size, the reference's ResNet-32 up to 64 pixels, else its ResNet-18
    backbone: str = "auto"
    head_init_std: PositiveFloat = 0.001  # std of the N(0, std²) init of every new classifier block
    # Allocate the classifier for every class of the protocol at the start, the unseen classes' columns masked, so
    # that a step's shapes never change between tasks (compiled once per run: engine.compile step). Results equal
    # the growing head's within rounding. Methods whose losses take column masks only (rdfcil, finetune, joint).
    static_head: bool = False


@configclass
class TrainConfig:
    epochs: PositiveInt = 200  # epochs per task, all phases included (reference: max_epochs)
    batch_size: PositiveInt = 128  # real images per step; drop_last, as the reference
    lr: PositiveFloat = 0.1  # SGD lr at the start of each task
    momentum: NonNegativeFloat = 0.9
    weight_decay: NonNegativeFloat = 5e-4  # applied to every parameter, BN and projectors included
    # where lr *= gamma: epochs from the phase's start ([80, 120]), or fractions of each phase ([0.5, 0.75]: at
    # round(0.5 * E) and round(0.75 * E) of a phase of E epochs, halves rounded up), which follow changed epochs
    milestones: tuple[Milestone, ...] = (80, 120)
    gamma: PositiveFloat = 0.1
    eval_batch_size: PositiveInt = 1000  # test images per forward; no effect on results
    # a loss term whose mean over an epoch passes it stops the run as diverged, as a non-finite one does. Healthy
    # terms stay far below (a CE is a few units); fine-tuning with a linear head on tasks of a few classes has
    # epoch means in the thousands at the start of late tasks and still trains, hence the margin. null: no limit
    max_loss: PositiveFloat | None = 1e10

    def __post_init__(self) -> None:
        m = self.milestones
        if len({type(v) for v in m}) > 1:
            raise ValueError(
                f"train.milestones {list(m)} mixes epochs and fractions of the phase; give all as epochs "
                f"([80, 120]) or all as fractions ([0.4, 0.6])"
            )
        if any(b <= a for a, b in zip(m, m[1:], strict=False)):
            raise ValueError(f"train.milestones {list(m)} must be strictly increasing")
        # milestones at or after a phase's end are refused by the protocol's checks, with every other problem


@configclass
class EngineConfig:
    """How the engine computes, not what: switches that keep the algorithm (fp32 results equal within rounding)
    or trade exactness for speed (bf16). ``merge_passes: none`` with fp32 and no compile is the reference mode."""

    # Passes over [real; synthetic] batches. none: the reference's separate passes (its duplicate teacher pass
    # included); teacher: one teacher pass, one eval-mode student pass in CHR; all: also one train-mode student
    # pass with per-half BN statistics; auto: all on CUDA, teacher on CPU (where a 256-batch is slower than two).
    merge_passes: Literal["auto", "all", "teacher", "none"] = "auto"
    precision: Literal["fp32", "bf16"] = "fp32"  # bf16: autocast with fp32 master weights and fp32 loss maths
    channels_last: bool = False  # NHWC activations (helps tensor cores on CUDA)
    # torch.compile: none; default, reduce-overhead, max-autotune: the backbones, in that mode; step: each training
    # and inversion step's forward and loss terms (its backward through AOTAutograd), with model.static_head so
    # that it compiles once per phase kind per run (replayed as CUDA graphs with cuda_graphs: on)
    compile: Literal["none", "default", "reduce-overhead", "max-autotune", "step"] = "none"
    # torch.compile's backend: inductor generates fused kernels; aot_eager and eager only trace (debugging, tests)
    compile_backend: Literal["inductor", "aot_eager", "eager"] = "inductor"
    # inductor's mode for engine.compile: step. max-autotune-no-cudagraphs: at compile time, time candidate kernels
    # for each convolution and matrix product (and its fusions) and keep the fastest (minutes more compiling, kept
    # in the compile cache); CUDA graphs stay engine.cuda_graphs'. Results equal within rounding.
    compile_mode: Literal["default", "max-autotune-no-cudagraphs"] = "default"
    # Where torch.compile keeps what it compiled, for later runs to load instead of compiling again (inductor's FX
    # graph and AOTAutograd caches, Triton's kernels): auto: $TORCHINDUCTOR_CACHE_DIR where set, else
    # $XDG_CACHE_HOME/dfcil/torch-compile (~/.cache/...), shared by every run of the user on the machine; a
    # directory (one that travels with a sweep's runs between machines); off: compile everything, keep nothing
    compile_cache: Annotated[str, BeforeValidator(_yaml_switch)] = "auto"  # YAML reads a bare off as false
    cudnn_benchmark: bool = True  # CUDA only
    fused_optimizer: bool = True  # fused SGD/Adam kernels; CUDA only
    # Training and inversion steps as CUDA graphs (dfcil.compute.graphs). on: captured per phase and lr, replayed (CUDA
    # only; eager elsewhere and for methods not marked graph-safe); check: eager, verifying on any device that
    # the steps could be replayed (for new methods); off: eager.
    cuda_graphs: OnOffCheck = "off"
    # Under torchrun (several processes): batch norm with the statistics of the global batch, as one process
    # computes them (the reference trains on one GPU); false: each process's own part (another algorithm)
    sync_bn: bool = True
    # Model inversion under torchrun. split: each process trains the generator on its share of the latent batch,
    # BN statistics and the diversity term over the global batch, gradients averaged; same: every process trains
    # the same generator on the whole batch (no communication, no speed-up). docs/distributed.md measures both.
    distributed_inversion: Literal["split", "same"] = "split"

    def __post_init__(self) -> None:
        if not self.compile_cache.strip() or self.compile_cache == "on":
            raise ValueError(
                f"engine.compile_cache: {self.compile_cache!r} is not a setting; use auto (the default cache), off "
                f"or a directory"
            )
        if self.compile_mode != "default" and self.compile != "step":
            raise ValueError(
                f"engine.compile_mode: {self.compile_mode} applies to engine.compile: step (the steps' kernels); "
                f"engine.compile: {self.compile} takes its mode as its own value (e.g. compile: max-autotune)"
            )
        if self.cuda_graphs != "off" and self.compile in ("reduce-overhead", "max-autotune"):
            raise ValueError(
                f"cuda_graphs: {self.cuda_graphs} cannot be combined with compile: {self.compile}, which captures "
                f"CUDA graphs itself; use compile: default (or none) with cuda_graphs"
            )


@configclass
class WandbConfig:
    """Where ``--log wandb`` logs (Weights & Biases). A key left unset is wandb's own: its environment variables
    (WANDB_PROJECT, WANDB_ENTITY, WANDB_NAME, WANDB_RUN_GROUP; WANDB_MODE=offline logs without a network), else
    wandb's default. Runtime only: a resume may change them."""

    project: str | None = None
    entity: str | None = None
    name: str | None = None  # default: $WANDB_NAME, else the run directory's name (a sweep's: rdfcil-order0)
    group: str | None = None  # e.g. one sweep's runs


@configclass
class MethodConfig:
    """Base of every method's config; the method's own fields are added by its ``Config`` subclass."""

    # the registered method (see `dfcil methods`); register_method makes it default to the method's own name
    name: str = ""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    method: MethodConfig
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    wandb: WandbConfig = dataclasses.field(default_factory=WandbConfig)  # --log wandb's project, name, ...
    seed: Seed = 1  # training seed (weights, shuffling, augmentation, synthesis); reference: seed_everything 1
    device: str = "auto"  # auto | cpu | cuda | cuda:N; runtime only, may change on resume
    # extra checkpoints inside long task setups (inversion); runtime only
    checkpoint_interval_s: NonNegativeFloat = 60.0
    # epoch-end checkpoints at most this often; 0: every epoch; runtime only
    epoch_checkpoint_interval_s: NonNegativeFloat = 0.0
    # directory of shared first-task models (README, "Interruptions and resume"); runtime only
    task0_cache: str | None = None
    # metric logs beside metrics.jsonl: csv, tensorboard (dfcil.training.loggers; dfcil train --log); runtime only
    log: tuple[str, ...] = ()
    # modules (names, or .py files: absolute once loaded) imported before the method is looked up, so that what
    # they register (a method, a dataset, ...) can be named; every later process of the run imports them again
    # (dfcil.plugins)
    plugins: tuple[str, ...] = ()


def with_absolute_paths(cfg: RunConfig) -> RunConfig:
    """``cfg`` with ``data.root`` and ``task0_cache`` absolute (``~`` expanded, links kept), as a run saves them:
    a relative path means the directory the command ran in, which a later ``dfcil resume`` need not share."""

    def absolute(path: str | None) -> str | None:
        return None if path is None else str(Path(path).expanduser().absolute())

    data = dataclasses.replace(cfg.data, root=absolute(cfg.data.root), cache=absolute(cfg.data.cache))
    return dataclasses.replace(cfg, data=data, task0_cache=absolute(cfg.task0_cache))


SECTIONS: dict[str, type] = {
    "data": DataConfig, "model": ModelConfig, "train": TrainConfig, "engine": EngineConfig, "wandb": WandbConfig,
}  # fmt: skip
TOP_LEVEL_SCALARS: dict[str, Any] = {
    "seed": Seed,
    "device": str,
    "checkpoint_interval_s": NonNegativeFloat,
    "epoch_checkpoint_interval_s": NonNegativeFloat,
    "task0_cache": str | None,
    "log": tuple[str, ...],
    "plugins": tuple[str, ...],
}
# Keys that a resume may change: they never change the results (data.root says where the same data lies,
# data.rebuild prepares its cache again from it;
# engine.cuda_graphs changes how a step's kernels are launched, not which: a run whose capture failed continues with
# it off; engine.compile_cache, where compiled code is kept; train.max_loss only stops a run that diverged; the wandb
# section, where --log wandb logs).
# Everything else shapes the protocol or the model.
RUNTIME_KEYS = frozenset(
    {
        "device", "checkpoint_interval_s", "epoch_checkpoint_interval_s", "task0_cache", "engine.cuda_graphs",
        "data.root", "data.download", "data.cache", "data.workers", "data.rebuild", "log", "engine.compile_cache",
        "train.max_loss", "wandb.project", "wandb.entity", "wandb.name", "wandb.group",
    }
)  # fmt: skip
RUNTIME_SECTIONS = frozenset({"wandb"})  # every key runtime: a config saved before the section differs in none


# --------------------------------------------------------------------------------------------------- decoding


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _bare(hint: Any) -> tuple[Any, list[Any]]:
    """``hint`` without ``Annotated``, and the metadata that held (``Field(ge=0)`` included)."""
    metadata: list[Any] = []
    while typing.get_origin(hint) is Annotated:
        hint, *more = typing.get_args(hint)
        metadata += more
    return hint, metadata


def _options(hint: Any) -> list[Any]:
    """The members of a union but None (``X | None``: ``[X]``); none for any other type."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(hint) if a is not type(None)]
    return []


def _child(hint: Any, part: str | int) -> Any:
    """The annotation of the field or item ``part`` inside a value of ``hint``; None where unknown."""
    base = _bare(hint)[0]
    if len(options := _options(base)) == 1:  # X | None: validated as X
        base = _bare(options[0])[0]
    args = typing.get_args(base)
    if isinstance(part, int) and typing.get_origin(base) in (tuple, list):
        return args[0] if typing.get_origin(base) is list or args[1:] == (...,) else dict(enumerate(args)).get(part)
    if isinstance(part, str) and isinstance(base, type) and dataclasses.is_dataclass(base):
        return typing.get_type_hints(base, include_extras=True).get(part)
    return None


def _located(cls: type, loc: tuple[str | int, ...]) -> tuple[list[str | int], Any]:
    """An error's location as the parts of a config key, without the names that the validator gives the members
    of a union it tried (``constrained-int``, ``function-after[...]``), and the annotation there (None: unknown)."""
    parts: list[str | int] = []
    hint: Any = cls
    at: Any = cls
    for part in loc:
        if hint is not None and len(_options(_bare(hint)[0])) > 1:
            hint = None  # ``part`` names the member of the union tried: what follows lies inside that member
        elif hint is not None or isinstance(part, int) or part.isidentifier():
            hint = at = _child(hint, part) if hint is not None else None
            parts.append(part)
    return parts, at


_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def what_it_takes(hint: Any) -> str | None:
    """What a config value of the annotation ``hint`` takes besides null, in words (``an integer >= 0 or a number >
    0 and < 1``, ``a list of 3 values, each a number``); None for a type it does not know."""
    base, metadata = _bare(hint)
    if options := _options(base):
        words = [what_it_takes(a) for a in options]
        return None if None in words else " or ".join(typing.cast(list[str], words))
    bounds = [
        f"{sign} {getattr(c, name)}"
        for m in metadata
        for c in getattr(m, "metadata", [m])  # Field(ge=0) holds its constraints as annotated_types' objects
        for name, sign in _BOUNDS
        if getattr(c, name, None) is not None
    ]
    bound = "".join(f" {'and ' * bool(i)}{b}" for i, b in enumerate(bounds))
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin in (tuple, list):
        if origin is list or args[1:] == (...,):
            each = what_it_takes(args[0])
            return each and f"a list of values, each {each}"
        kinds = {what_it_takes(a) for a in args}
        return f"a list of {len(args)} values, each {kinds.pop()}" if len(kinds) == 1 and None not in kinds else None
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a text"}
    if base in words:
        return words[base] + bound
    return "a section of keys" if isinstance(base, type) and dataclasses.is_dataclass(base) else None


def _format_errors(err: ValidationError, cls: type, where: str) -> str:
    """One line per config key that failed: its key, and what it takes or the validator's message, and the value
    given. The errors of the members of a union at one key (``train.milestones``: an epoch or a fraction) are one
    line; a list that is too short or too long is said of the list (``data.mean``), not of a missing item."""
    groups: dict[tuple[str | int, ...], list[tuple[dict[str, Any], Any]]] = {}
    for e in err.errors():
        loc = e["loc"]
        if e["type"] == "missing" and loc and isinstance(loc[-1], int):  # a list with too few items
            loc = loc[:-1]
        parts, annotation = _located(cls, loc)
        groups.setdefault(tuple(parts), []).append((e, annotation))
    lines = []
    for parts, errors in groups.items():
        loc = ".".join(str(p) for p in (where, *parts) if p != "")
        e, annotation = errors[0]
        if e["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
            key = str(e["loc"][-1])
            parent = cls
            for part in e["loc"][:-1]:  # walk into nested dataclasses to list the right keys
                nested = typing.get_type_hints(parent).get(str(part))
                parent = nested if isinstance(nested, type) and dataclasses.is_dataclass(nested) else parent
            valid = _field_names(parent)
            close = difflib.get_close_matches(key, valid, n=1)
            near = ".".join([*loc.split(".")[:-1], close[0]]) if close else ""  # the whole key, as it is typed
            hint = f" Did you mean {near!r}?" if close else ""
            lines.append(f"unknown config key {quoted(loc)}.{hint} Valid keys here: {', '.join(valid)}")
        elif e["type"] == "value_error" and not e["loc"]:  # a check across fields (__post_init__): its own words
            lines.append(f"{loc}: {e['msg'].removeprefix('Value error, ')}")
        elif (len(errors) > 1 or e["type"] in ("missing", "too_short", "too_long", "dataclass_type")) and (
            takes := what_it_takes(annotation)
        ):
            lines.append(f"{loc}: takes {takes} (got {quoted(e.get('input'))})")
        else:
            said = " or ".join(dict.fromkeys(x["msg"].removeprefix("Value error, ") for x, _ in errors))
            lines.append(f"{loc}: {said} (got {quoted(e.get('input'))})")
    return "; ".join(lines)


def field_default(field: dataclasses.Field) -> Any:
    """The value a dataclass field takes when not given (its factory's product, its default, or None)."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def with_nested_defaults(cls: type, raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` with every nested section it gives as a mapping completed from that field's own default, not
    from the nested class's: R-DFCIL+'s ``drift`` defaults to the least-squares map in one pass while
    ``DriftConfig`` itself defaults to LDC's 20-pass Adam fit, and ABD's ``inversion`` to a persistent generator,
    so ``drift: {synthetic: true}`` means R-DFCIL+'s drift with synthetic images, not LDC's fit with them."""
    out = dict(raw)
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        value, hint = out.get(field.name), hints.get(field.name)
        # the section's class, also where it is optional (``X | None``)
        kinds = [k for k in (hint, *typing.get_args(hint)) if isinstance(k, type) and dataclasses.is_dataclass(k)]
        if not isinstance(value, Mapping) or not kinds:
            continue
        kind, default = kinds[0], field_default(field)
        base = {f.name: getattr(default, f.name) for f in dataclasses.fields(kind)} if isinstance(default, kind) else {}
        out[field.name] = with_nested_defaults(kind, {**base, **value})
    return out


def validate_section(cls: type[T], raw: Any, where: str) -> T:
    """Decode ``raw`` (a mapping from YAML) into the dataclass ``cls``, strictly; a nested section given in part
    keeps the rest of that field's default (:func:`with_nested_defaults`)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config section {where!r} must be a mapping of keys to values, got {quoted(raw)}")
    try:
        return TypeAdapter(cls).validate_python(with_nested_defaults(cls, raw))
    except ValidationError as err:
        raise ConfigError(_format_errors(err, cls, where)) from None


# --------------------------------------------------------------------------------------------------- reading


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges may be overridden by own keys
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1's integers, which PyYAML follows, read `010` as 8 (octal), `0x10` as 16 and `1:30` as 90 (base 60): a
# seed or epoch count written with a leading zero would silently become another number. Configs read plain
# decimal integers only (YAML 1.2's core schema without its octal and hex forms); anything else stays a string,
# which a number field refuses.
_DECIMAL = re.compile(r"^[-+]?[0-9]+$")
# YAML 1.1's floats without the base-60 form (`1:30.5` is 90.5 there)
_FLOAT = re.compile(
    r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)


def _decimal_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if not _DECIMAL.match(text):  # `!!int 0x10`: an explicit tag on another form
        raise yaml.constructor.ConstructorError(None, None, f"{text!r} is not a decimal integer", node.start_mark)
    return int(text, 10)


def _decimal_resolvers(resolvers: dict) -> dict:
    """``resolvers`` (a loader's or dumper's implicit ones) with ints read as decimal only and no base-60 floats."""
    out = {
        first: [
            (tag, regexp) for tag, regexp in chain if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
        ]
        for first, chain in resolvers.items()
    }
    for tag, regexp, firsts in (
        ("tag:yaml.org,2002:int", _DECIMAL, "-+0123456789"),
        ("tag:yaml.org,2002:float", _FLOAT, "-+0123456789."),
    ):
        for first in firsts:
            out.setdefault(first, []).append((tag, regexp))
    return out


_UniqueKeyLoader.yaml_implicit_resolvers = _decimal_resolvers(yaml.SafeLoader.yaml_implicit_resolvers)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _decimal_int)


class _Dumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` that quotes exactly the strings :func:`load_yaml` would read as numbers (``'09'``)."""


_Dumper.yaml_implicit_resolvers = _decimal_resolvers(yaml.SafeDumper.yaml_implicit_resolvers)


# Values (scalars, lists, mappings) a YAML document may stand for once its aliases are expanded: a run's config
# holds a few hundred. A few lines of nested aliases ("billion laughs") can stand for billions, which every reader
# of the document (validation, printing, merging) would walk.
MAX_YAML_VALUES = 20_000


class YAMLTooLarge(yaml.YAMLError):
    """A YAML document that expands, through its aliases, past :data:`MAX_YAML_VALUES` values or nesting levels."""


def _expanded_size(node: yaml.Node, sizes: dict[int, int], depth: int = 0) -> int:
    """The values ``node`` stands for with every alias expanded, each alias's node counted once per use (memoised
    by node, so the count costs the document's length, not its expansion)."""
    if id(node) in sizes:
        return sizes[id(node)]
    if depth > 100:
        raise YAMLTooLarge("it nests more than 100 levels deep")
    if isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, sizes, depth + 1) + _expanded_size(v, sizes, depth + 1) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(v, sizes, depth + 1) for v in node.value)
    else:
        size = 1
    if size > MAX_YAML_VALUES:
        raise YAMLTooLarge(
            f"it stands for more than {MAX_YAML_VALUES} values once its aliases (*name) are expanded; write the "
            f"values out, or use fewer aliases"
        )
    sizes[id(node)] = size
    return size


def load_yaml(text: str) -> Any:
    """Parse one YAML document safely: no Python objects (a ``SafeLoader``), no key given twice in a mapping, and
    no document that aliases expand past :data:`MAX_YAML_VALUES` values (:class:`YAMLTooLarge`, before anything
    is built from it)."""
    loader = _UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, {})
        return loader.construct_document(node)
    finally:
        loader.dispose()


def quoted(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to about ``limit`` characters: what an error message may echo of a value."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} characters)"


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A config file's mapping: ``path``, or the preset of that name where no such path exists
    (:func:`dfcil.presets.resolve`: ``smoke``, ``cifar100/n10``)."""
    given, path = str(path), presets.resolve(path)
    if path.is_dir():
        raise ConfigError(f"config file {str(path)!r} is a directory; give a .yaml file")
    try:
        data = load_yaml(read_regular_text(path))  # a FIFO is refused at once, not waited on
    except FileNotFoundError:
        parts = given.split("+")
        if len(parts) > 1 and all(p and presets.resolve(p).is_file() for p in parts):  # a sweep's config, in train
            flags = " ".join(f"--config {p}" for p in parts)
            raise ConfigError(
                f"config file {given!r} does not exist: `+` joins config files in `dfcil sweep` only; elsewhere "
                f"give each file its own flag: {flags}"
            ) from None
        raise ConfigError(
            f"config file {given!r} does not exist, and no preset is named so; `dfcil presets` lists the presets"
        ) from None
    except NotARegularFile:
        raise ConfigError(f"config file {str(path)!r} is {_file_kind(path)}a regular file; give a .yaml file") from None
    except YAMLTooLarge as err:
        raise ConfigError(f"config file {str(path)!r} is refused: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {err}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8 text; save it as UTF-8 YAML") from None
    except OSError as err:
        raise ConfigError(f"config file {str(path)!r} cannot be read ({err.strerror}); check its permissions") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
    return data


# What a path that is no regular file is, by its mode, for the messages that refuse it
SPECIAL_FILES = {
    stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device",
    stat.S_ISSOCK: "a socket",
}  # fmt: skip


def _file_kind(path: Path) -> str:
    """``"a FIFO, not "`` (``/dev/null``: ``"a character device, not "``) for a special file, else ``"not "``."""
    try:
        mode = path.stat().st_mode
    except OSError:  # gone since: said as no regular file
        return "not "
    return next((f"{kind}, not " for test, kind in SPECIAL_FILES.items() if test(mode)), "not ")


def deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``update`` into ``base`` recursively (mappings merge, everything else replaces); returns ``base``. An
    empty section (``data:`` with every key commented out, which YAML reads as null) over a section changes
    nothing: it would otherwise reset the whole section to its defaults."""
    for key, value in update.items():
        if value is None and isinstance(base.get(key), dict):
            continue
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            deep_merge(base[key], value)
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value
    return base


def parse_value(text: str) -> Any:
    """Parse a command-line value as YAML (``3`` → int, ``[1, 2]`` → list, ``null`` → None), else keep the string."""
    try:
        return load_yaml(text) if text.strip() else text
    except YAMLTooLarge as err:
        raise ConfigError(f"the command-line value {quoted(text)} is refused: {err}") from None
    except yaml.YAMLError:
        return text


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"malformed override key {key!r}: expected dotted names such as train.epochs")
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {key!r}: {part!r} is not a section")
        node = child
    if isinstance(value, Mapping) and isinstance(node.get(parts[-1]), dict):  # a section on the command line merges
        deep_merge(node[parts[-1]], value)  # into the files' as another file's would
    else:
        node[parts[-1]] = value


# --------------------------------------------------------------------------------------------------- saving


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    """The config as plain YAML-able data; ``build_config(config_to_dict(c)) == c``."""
    out = {
        "method": dataclasses.asdict(cfg.method),
        **{name: dataclasses.asdict(getattr(cfg, name)) for name in SECTIONS},
        **{key: getattr(cfg, key) for key in TOP_LEVEL_SCALARS},
    }
    return _plain(out)


def section_defaults() -> dict[str, Any]:
    """The default of every key outside the method section (the sections' and the top-level keys'), as plain data:
    what a saved config that lacks a key means, since a key is added with the default that keeps the behaviour
    before it (a run saved before ``plugins`` existed used none)."""
    top = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.name in TOP_LEVEL_SCALARS}
    return _plain({name: dataclasses.asdict(cls()) for name, cls in SECTIONS.items()} | top)


def dump_config(cfg: RunConfig, actions: bool = False) -> str:
    """The config as a run directory saves it (``config.yaml``): one-off actions (``data.rebuild``) recorded off,
    so that ``dfcil resume`` and a repeat of the run do not perform them again unless asked. ``actions``: keep
    them (a config written for a run still to start, which is to perform them)."""
    plain = config_to_dict(cfg)
    if not actions:
        plain["data"]["rebuild"] = False
    return yaml.dump(plain, Dumper=_Dumper, sort_keys=False)


def config_diff(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two plain config dicts."""
    keys = sorted(set(a) | set(b))
    out: list[str] = []
    for key in keys:
        path = f"{prefix}{key}"
        va, vb = a.get(key), b.get(key)
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            out += config_diff(va, vb, prefix=f"{path}.")
        elif va != vb:
            out.append(path)
    return out


def changed_from_defaults(section: Any) -> list[str]:
    """Dotted keys of a config section (a method's config, say) whose values differ from that section's own
    defaults: what a run set, as a report reads it without importing the section's class (``summary.json``'s
    ``method_changed``)."""
    plain = _plain(dataclasses.asdict(section))
    return config_diff(plain, _plain(dataclasses.asdict(type(section)())))


def changed_keys(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two plain config dicts, runtime keys left out: what a run may not
    change once it has started."""
    return [k for k in config_diff(saved, now) if k not in RUNTIME_KEYS and k.split(".")[0] not in RUNTIME_SECTIONS]


def check_unchanged(saved: Mapping[str, Any], now: Mapping[str, Any]) -> None:
    """Refuse to continue a checkpoint written under a config (``saved``, plain data) that differs from the run's
    (``now``, plain data) except in runtime keys: an edited ``config.yaml`` would silently give a mixed run."""
    changed = changed_keys(saved, now)
    if not changed:
        return

    def value(d: Mapping[str, Any], key: str) -> str:
        for part in key.split("."):
            d = d.get(part) if isinstance(d, Mapping) else None
        text = json.dumps(d)
        return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"

    shown = [f"{k}: {value(saved, k)} in the checkpoint, {value(now, k)} now" for k in changed[:6]]
    more = f" and {len(changed) - 6} more keys" if len(changed) > 6 else ""
    raise ConfigError(
        f"the run's checkpoint was written with another config ({'; '.join(shown)}{more}): was the run's "
        f"config.yaml edited? Put it back as it was to continue the run, or start a new run for the new config"
    )
