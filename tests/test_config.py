import re

import pytest
import yaml

from conftest import CONFIGS
from dfcil.config import config_diff, config_to_dict, dump_config
from dfcil.errors import ConfigError
from dfcil.load import build_config, load_config
from dfcil.methods.rdfcil import RDFCILConfig


def test_defaults_are_the_reference_values():
    cfg = build_config({})
    assert isinstance(cfg.method, RDFCILConfig)
    m, t = cfg.method, cfg.train
    assert (m.lambda_ce, m.lambda_hkd, m.lambda_rkd, m.chr_epochs, m.chr_lr, m.chr_hkd) == (
        0.5,
        0.15,
        0.5,
        40,
        0.005,
        True,
    )
    i = m.inversion
    assert (i.steps, i.lr, i.tau, i.w_bn, i.w_prior, i.zdim) == (5000, 1e-3, 1000, 50, 1e-3, 1000)
    assert (t.epochs, t.batch_size, t.lr, t.momentum, t.weight_decay, t.milestones) == (
        200,
        128,
        0.1,
        0.9,
        5e-4,
        (80, 120),
    )
    assert cfg.seed == 1 and cfg.model.backbone == "auto" and cfg.model.head_init_std == 0.001
    from dfcil.models.network import backbone_for

    assert [backbone_for("auto", size) for size in (32, 64, 224)] == ["resnet32", "resnet32", "resnet18"]
    assert backbone_for("resnet20", 224) == "resnet20"  # an explicit backbone wins


def test_yaml_roundtrip_is_exact():
    cfg, _ = load_config([CONFIGS / "smoke.yaml"])
    again = build_config(yaml.safe_load(dump_config(cfg)))
    assert again == cfg
    assert config_diff(config_to_dict(cfg), config_to_dict(again)) == []


def test_dotted_overrides_are_parsed_as_yaml():
    cfg, _ = load_config(
        [CONFIGS / "smoke.yaml"],
        [("train.epochs", "7"), ("train.milestones", "[3, 5]"), ("data.class_order", "null"), ("data.root", "/x y")],
    )
    assert cfg.train.epochs == 7 and cfg.train.milestones == (3, 5) and cfg.data.root == "/x y"
    cfg, _ = load_config([], [("method.inversion.lr", "1e-2"), ("data.download", "true")])
    assert cfg.method.inversion.lr == 0.01 and cfg.data.download is True


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ([("train.epoch", "3")], r"unknown config key 'train.epoch'. Did you mean 'train.epochs'\?"),
        ([("trian.epochs", "3")], r"unknown config key 'trian'. Did you mean 'train'\?"),
        (
            [("method.inversion.stepz", "3")],
            r"unknown config key 'method.inversion.stepz'. Did you mean 'method.inversion.steps'",
        ),
        ([("method.lambda_kd", "1")], r"unknown config key 'method.lambda_kd'"),
        ([("train.epochs", "three")], r"train.epochs: Input should be a valid integer"),
        ([("train.epochs", "0")], r"train.epochs: Input should be greater than or equal to 1"),
        ([("train.lr", "-1")], r"train.lr: Input should be greater than 0"),
        ([("method.name", "rdfcill")], r"unknown method 'rdfcill'. Did you mean 'rdfcil'\?"),
        ([("seed", "x")], r"seed: Input should be a valid integer"),
        ([("checkpoint_interval_s", "-1")], r"checkpoint_interval_s: Input should be greater than or equal to 0"),
        ([("train", "5")], r"section 'train' must be a mapping"),
        ([("train.epochs", "true")], r"train.epochs: Input should be a valid integer \(got True\)"),  # not 1
        ([("train.epochs", "3.0")], r"train.epochs: Input should be a valid integer"),
        ([("data.class_order", "[true, false]")], r"data.class_order.0: Input should be a valid integer"),
        ([("train.lr", "yes")], r"train.lr: Input should be a valid number, not a yes/no value \(got True\)"),
        ([("seed", "-1")], r"seed: Input should be greater than or equal to 0"),
        ([("seed", "99999999999999999999")], r"seed: Input should be less than 9223372036854775808"),
        ([("train.milestones", "[80, 0.75]")], r"mixes epochs and fractions of the phase"),
        ([("train.milestones", "[0.5, 1.5]")], r"train.milestones.1"),  # a fraction lies strictly inside (0, 1)
        ([("train.milestones", "[0.75, 0.5]")], r"must be strictly increasing"),
        ([("train.milestones", "[120, 80]")], r"milestones \[120, 80\] must be strictly increasing"),
        ([("train.milestones", "[80, 80]")], r"must be strictly increasing"),
        ([("method.chr_epochs", "300")], None),  # valid for the schema; the method rejects it (see below)
    ],
)
def test_bad_keys_and_values_name_the_problem(overrides, match):
    if match is None:
        load_config([], overrides)
        return
    with pytest.raises(ConfigError, match=match):
        load_config([], overrides)


def test_method_cross_field_check():
    from dfcil.methods import build_method

    cfg, _ = load_config([], [("method.chr_epochs", "300")])
    with pytest.raises(ConfigError, match=r"chr_epochs \(300\) must be smaller than train.epochs \(200\)"):
        build_method(cfg.method, cfg.train)


def test_switching_method_drops_the_old_methods_keys(tmp_path):
    cfg, dropped = load_config([CONFIGS / "smoke.yaml"], [("method.name", "finetune")])
    assert cfg.method.name == "finetune"
    assert dropped == [
        "method.chr_epochs dropped (not a key of finetune)",
        "method.inversion dropped (not a key of finetune)",
    ]
    # keys given on the command line are never dropped silently
    with pytest.raises(ConfigError, match="--method.chr_epochs: a setting of rdfcil, the method of the config files"):
        load_config([CONFIGS / "smoke.yaml"], [("method.name", "finetune"), ("method.chr_epochs", "2")])


def test_several_config_files_merge_in_order(tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text("train:\n  epochs: 9\nmethod:\n  inversion:\n    lr: 0.5\n")
    cfg, _ = load_config([CONFIGS / "smoke.yaml", extra])
    assert cfg.train.epochs == 9 and cfg.train.batch_size == 32  # merged, not replaced
    assert cfg.method.inversion.lr == 0.5 and cfg.method.inversion.steps == 5


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config([tmp_path / "nope.yaml"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config([bad])
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config([bad])
    bad.write_text("train:\n  epochs: 3\nseed: 2\ntrain:\n  epochs: 4\n")  # PyYAML alone keeps the last
    with pytest.raises(ConfigError, match=r"key 'train' is given twice in one mapping\n.*line 4"):
        load_config([bad])
    bad.write_text("train:\n  epochs: 3\n  epochs: 4\n")
    with pytest.raises(ConfigError, match="key 'epochs' is given twice"):
        load_config([bad])
    bad.write_text("base: &b {epochs: 3, lr: 0.5}\n")  # a merge key may be overridden: not a duplicate
    assert read_yaml_merged(bad, "train:\n  <<: *b\n  epochs: 4\n") == {"epochs": 4, "lr": 0.5}
    bad.write_bytes(b"\xff\xfetrain:\n  epochs: 3\n")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_config([bad])
    with pytest.raises(ConfigError, match="is a directory; give a .yaml file"):
        load_config([tmp_path])


def read_yaml_merged(path, more):
    from dfcil.config import read_yaml

    path.write_text(path.read_text() + more)
    return read_yaml(path)["train"]


def test_configs_are_frozen():
    cfg = build_config({})
    with pytest.raises(Exception, match="frozen|cannot assign"):
        cfg.train.epochs = 3  # type: ignore[misc]


@pytest.mark.parametrize("path", sorted(CONFIGS.rglob("*.yaml")), ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_shipped_config_is_valid_and_states_its_command(path):
    base = [CONFIGS / "cifar100-mini.yaml"] if path.parent.name == "cifar100-mini" else []  # overlays: on their base
    if first := re.search(r"dfcil train ((?:--config \S+ )+)", path.read_text()):  # an overlay: after what its
        given = [CONFIGS.parent / f for f in first.group(1).split()[1::2]]  # command gives before it
        base = given[: given.index(path)] if path in given else base
    cfg, _ = load_config([*base, path])
    from dfcil.methods import build_method

    build_method(cfg.method, cfg.train)
    header = path.read_text().split("\n", 12)
    assert any("dfcil train --config" in line for line in header), f"{path} has no command in its header"


def test_on_off_switches_survive_yaml_booleans(tmp_path):
    """YAML reads bare on/off as booleans; engine.cuda_graphs takes them (and true/false) as "on"/"off"."""
    path = tmp_path / "c.yaml"
    path.write_text("method:\n  name: finetune\nengine:\n  cuda_graphs: on\n")
    assert load_config([path])[0].engine.cuda_graphs == "on"
    for raw, want in [("off", "off"), ("true", "on"), ("check", "check")]:
        assert load_config([path], [("engine.cuda_graphs", raw)])[0].engine.cuda_graphs == want
    with pytest.raises(ConfigError, match="'off', 'on' or 'check'"):
        load_config([path], [("engine.cuda_graphs", "sometimes")])


def test_graphs_and_a_compile_mode_that_captures_graphs_itself_are_refused():
    with pytest.raises(ConfigError, match=r"^engine: cuda_graphs: on cannot be combined with compile: reduce-over"):
        load_config([CONFIGS / "smoke.yaml"], [("engine.cuda_graphs", "on"), ("engine.compile", "reduce-overhead")])
    cfg = load_config([CONFIGS / "smoke.yaml"], [("engine.cuda_graphs", "on"), ("engine.compile", "default")])[0]
    assert (cfg.engine.cuda_graphs, cfg.engine.compile) == ("on", "default")


@pytest.mark.parametrize("setting", ["n5", "b50_n11"])
def test_the_paper_presets_give_every_plain_ce_first_task_the_same_schedule(setting):
    """The paper trains every approach 160 epochs (R-DFCIL adds 40 of head refinement on later tasks), so the
    presets whose first task is plain CE train it identically, and one task-0 cache serves them all."""
    import dataclasses

    from dfcil.methods import Task, build_method

    first = {}
    for name in ("finetune", "lwf", "deepinversion", "abd", "rdfcil"):
        cfg, _ = load_config([CONFIGS / "cifar100" / f"{setting}.yaml", CONFIGS / "cifar100" / f"{name}.yaml"])
        method = build_method(cfg.method, cfg.train)
        task0 = Task(task_id=0, n_old=0, n_new=50, num_tasks=5)
        train = config_to_dict(cfg)["train"]
        del train["epochs"]  # R-DFCIL's 200 include CHR, which task 0 does not run
        schedule = [dataclasses.asdict(p) | {"name": None} for p in method.phases(task0)]
        first[name] = (method.task0_signature(), schedule, train, cfg.model, cfg.data, cfg.seed)
    assert first["rdfcil"][1][0]["epochs"] == 160 and len(first["rdfcil"][1]) == 1
    assert all(value == first["rdfcil"] for value in first.values()), {k: v[1] for k, v in first.items()}


def test_image_size_auto_is_unset_and_rebuild_is_a_runtime_key_saved_off():
    from pydantic import ValidationError

    from dfcil.config import RUNTIME_KEYS, DataConfig

    assert DataConfig(image_size="auto") == DataConfig() and DataConfig(image_size=64).image_size == 64
    with pytest.raises(ValidationError):
        DataConfig(image_size="big")
    cfg = load_config([CONFIGS / "smoke.yaml"], [("data.rebuild", "true")])[0]
    assert cfg.data.rebuild and "data.rebuild" in RUNTIME_KEYS
    assert "rebuild: false" in dump_config(cfg)  # what a run directory saves: a resume does not rebuild again


def test_a_nested_section_given_in_part_keeps_the_rest_of_its_fields_default():
    """A method's nested section (``drift``, ``inversion``) written in part is completed from that field's own
    default, which may differ from the nested class's: R-DFCIL+'s drift is the least-squares map with one pass
    (``DriftConfig`` alone: LDC's Adam fit, 20 passes) and ABD's generator persists (``InversionConfig`` alone: not).
    Completed from the class instead, ``drift: {synthetic: true}`` silently trained LDC's fit."""
    plus = build_config({"method": {"name": "rdfcil_plus", "drift": {"synthetic": True}}}).method.drift
    assert (plus.kind, plus.passes, plus.synthetic) == ("lstsq", 1, True)
    abd = load_config([], [("method.name", "abd"), ("method.inversion.steps", "80")])[0].method.inversion
    assert (abd.persistent, abd.steps) == (True, 80)
    given = build_config({"method": {"name": "abd", "inversion": {"steps": 80, "persistent": False}}})
    assert given.method.inversion.persistent is False  # what is given still wins
    with pytest.raises(ConfigError, match=r"unknown config key 'method.drift.passez'"):
        build_config({"method": {"name": "rdfcil_plus", "drift": {"passez": 2}}})


def test_each_rdfcil_plus_ablation_overlay_changes_only_what_its_header_says():
    """The mini protocol's R-DFCIL+ ablations differ from the full method in the one drift setting they name."""
    base = CONFIGS / "cifar100-mini10.yaml"

    def drift(name):
        return config_to_dict(load_config([base, CONFIGS / "cifar100-mini10" / f"{name}.yaml"], [])[0])["method"]

    full = drift("rdfcil_plus")
    assert full["drift"]["kind"] == "lstsq" and full["drift"]["passes"] == 1
    for name, changed in {
        "rdfcil_plus_syn": {"synthetic": True},
        "rdfcil_plus_ldc": {"kind": "ldc"},
        "rdfcil_plus_no_drift": {"kind": "none"},
    }.items():
        assert drift(name) == full | {"drift": full["drift"] | changed}, name


def test_an_empty_section_in_a_later_file_changes_nothing(tmp_path):
    """A section whose keys are all commented out is null in YAML: it must not reset the base file's section."""
    overlay = tmp_path / "o.yaml"
    overlay.write_text("method:\n  name: abd\ndata:\n  # num_classes: 10\n")
    cfg, _ = load_config([CONFIGS / "cifar100-mini.yaml", overlay])
    assert (cfg.data.num_classes, cfg.data.num_tasks, cfg.data.train_per_class) == (20, 4, 250)
    overlay.write_text("method:\n")  # an empty method section keeps the base's method and its keys
    base = load_config([CONFIGS / "cifar100-mini" / "lwf.yaml"])[0].method
    assert load_config([CONFIGS / "cifar100-mini" / "lwf.yaml", overlay])[0].method == base


def test_a_section_on_the_command_line_merges_as_a_files_would():
    cfg, _ = load_config([CONFIGS / "cifar100-mini.yaml"], [("method.inversion", "{lr: 0.002}")])
    assert cfg.method.inversion.lr == 0.002 and cfg.method.inversion.steps == 80  # the file's steps stay


IMAGENET100_N5 = [CONFIGS / "imagenet100" / "n5.yaml", CONFIGS / "imagenet100" / "rdfcil.yaml"]


def test_an_explicit_class_order_refuses_a_class_order_seed():
    """A preset with data.class_order (ImageNet-100's) trains that order whatever the seed: a sweep over seeds
    would give three identical runs, so a seed beside an explicit order is an error that says how to draw one."""
    with pytest.raises(ConfigError, match=r"data.class_order is given, so data.class_order_seed \(1\) would be "
                       r"ignored.*set data.class_order: null"):  # fmt: skip
        load_config(IMAGENET100_N5, [("data.class_order_seed", "1")])
    cfg, _ = load_config(IMAGENET100_N5, [("data.class_order", "null"), ("data.class_order_seed", "1")])
    assert cfg.data.class_order is None and cfg.data.class_order_seed == 1


def test_non_finite_numbers_are_refused():
    for key in ("train.lr", "method.lambda_hkd", "train.momentum"):
        for value in (".inf", ".nan", "-.inf"):
            with pytest.raises(ConfigError, match=f"{key}: Input should be (a finite number|greater)"):
                load_config([], [(key, value)])  # nan fails the bound first, with its own words


def test_switching_method_notes_the_keys_kept_away_from_the_new_methods_defaults():
    """lwf_ldc's KD weight 10 stays 10 when the method is switched to DeepInversion (default 1): said, not silent;
    a value the switching source gives itself is its own choice and not noted."""
    lwf_ldc = [CONFIGS / "cifar100" / "n5.yaml", CONFIGS / "cifar100" / "lwf_ldc.yaml"]
    _, notes = load_config(lwf_ldc, [("method.name", "deepinversion")])
    assert "method.lambda_kd kept at 10.0 (deepinversion's default: 1.0)" in notes
    assert "method.ldc dropped (not a key of deepinversion)" in notes
    _, notes = load_config(lwf_ldc, [("method.name", "deepinversion"), ("method.lambda_kd", "10")])
    assert not any(n.startswith("method.lambda_kd") for n in notes)
    faithful = [CONFIGS / "cifar100" / "n5.yaml", CONFIGS / "cifar100" / "abd_faithful.yaml"]
    _, notes = load_config(faithful, [("method.name", "rdfcil")])
    assert "method.inversion.persistent kept at True (rdfcil's default: False)" in notes


def test_integers_are_read_as_decimal_only():
    """YAML 1.1 (PyYAML's) reads 010 as 8, 0x10 as 16 and 1:30 as 90; a config reads decimal integers only, and
    the other forms stay strings, which number fields refuse."""
    from dfcil.config import load_yaml

    assert load_yaml("a: 010\nb: -3\nc: +4\nd: 0\ne: 0.5") == {"a": 10, "b": -3, "c": 4, "d": 0, "e": 0.5}
    assert load_yaml("a: 0x10\nb: 1:30\nc: 1_000") == {"a": "0x10", "b": "1:30", "c": "1_000"}
    assert load_config([], [("seed", "010")])[0].seed == 10
    with pytest.raises(ConfigError, match=r"train.epochs: Input should be a valid integer \(got '1:30'\)"):
        load_config([], [("train.epochs", "1:30")])


def test_an_empty_path_is_refused_not_read_as_the_current_directory():
    for key in ("data.root", "data.cache", "task0_cache"):
        with pytest.raises(ConfigError, match=f"{key}: an empty path; give a directory, or leave it unset"):
            load_config([], [(key, "''")])


def test_a_switch_notes_no_key_kept_at_the_new_methods_default_however_yaml_wrote_it(tmp_path):
    """`lr: 1e-3` (YAML: the text '1e-3') equals ABD's default 0.001; a section given whole on the command line is
    the switching source's own choice."""
    base = tmp_path / "a.yaml"
    base.write_text("method:\n  name: rdfcil\n  inversion:\n    lr: 1e-3\n    steps: 80\n")
    _, notes = load_config([base], [("method.name", "abd")])
    assert notes == ["method.inversion.steps kept at 80 (abd's default: 5000)"]
    _, notes = load_config([base], [("method.name", "abd"), ("method.inversion", "{steps: 80}")])
    assert notes == []


def test_an_optional_nested_section_given_in_part_keeps_its_fields_default():
    import dataclasses

    from dfcil.config import configclass, validate_section
    from dfcil.methods.memory import DriftConfig

    @configclass
    class WithOptional:
        drift: DriftConfig | None = dataclasses.field(default_factory=lambda: DriftConfig(kind="lstsq", passes=1))

    drift = validate_section(WithOptional, {"drift": {"synthetic": True}}, "method").drift
    assert (drift.kind, drift.passes, drift.synthetic) == ("lstsq", 1, True)
    assert validate_section(WithOptional, {"drift": None}, "method").drift is None


def test_what_a_run_saves_reads_back_the_same_and_no_number_form_but_decimal_is_read(tmp_path):
    """A string that reads as a decimal number ('09') is saved quoted, so config.yaml reads back what was saved;
    YAML 1.1's base-60 floats are text, and an explicit `!!int` on another form is an error, not a traceback."""
    from dfcil.config import dump_config, load_yaml

    cfg = load_config([], [("data.root", "'09'"), ("data.cache", "'1:30.5'")])[0]
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(cfg))
    again = load_config([saved])[0]
    assert (again.data.root, again.data.cache) == ("09", "1:30.5")
    assert load_yaml("a: 1:30.5\nb: 5.0e-4\nc: .5") == {"a": "1:30.5", "b": 0.0005, "c": 0.5}
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: !!int 0x10\n")
    with pytest.raises(ConfigError, match="not a decimal integer"):
        load_config([bad])


INTERNALS = ("constrained-int", "function-after", "functools", "<function", "int_from_float", "pydantic", "http")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("train.milestones", "[1.5]", "train.milestones.0: takes an integer >= 0 or a number > 0 and < 1 (got 1.5)"),
        ("train.milestones", "[yes]", "train.milestones.0: takes an integer >= 0 or a number > 0 and < 1 (got True)"),
        ("train.milestones", "['a']", "train.milestones.0: takes an integer >= 0 or a number > 0 and < 1 (got 'a')"),
        ("data.mean", "[0.5, 0.5]", "data.mean: takes a list of 3 values, each a number (got [0.5, 0.5])"),
        ("train.epochs", "1.5", "train.epochs: Input should be a valid integer (got 1.5)"),
    ],
)
def test_a_value_of_the_wrong_kind_names_its_key_and_what_it_takes_not_the_validators_internals(key, value, message):
    with pytest.raises(ConfigError) as err:
        load_config([CONFIGS / "smoke.yaml"], [(key, value)])
    assert str(err.value) == message
    assert not any(word in str(err.value) for word in INTERNALS)


def test_a_fifo_given_as_a_config_is_said_to_be_no_file_not_missing(tmp_path, capsys):
    import os

    from dfcil.cli import main

    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"config file '.*config.yaml' is a FIFO, not a regular file"):
        load_config([fifo])  # at once: a FIFO's reader would wait for a writer
    assert main(["train", "--config", str(fifo), "--dry-run"]) == 2
    assert "is a FIFO, not a regular file; give a .yaml file" in capsys.readouterr().err
