"""Build directories: build.toml validation, knob resolution, fresh imports, knob variants."""

from __future__ import annotations

import gc
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from polymorph.contract.builds import REFERENCE_BUILD, knob_variant, read_build, resolve_knobs
from polymorph.contract.errors import BuildError
from polymorph_engine.runtime.checkpoint import load_model
from polymorph_engine.runtime.loader import forget_build, import_build, load_hotpath

GOOD = """\
[build]
name = "toy"
description = "a toy build"

# how many widgets
[knobs.width]
choices = [1, 2, 4]
default = 1

[knobs.mode]
choices = ["a", "b"]
default = "a"
description = "which mode"

[knobs.flag]
choices = [false, true]
default = false
"""

ENTRY = """\
from . import helper

STATE_ID = object()


def load(model, knobs):
    return helper.Thing(knobs)
"""

HELPER = """\
class Thing:
    def __init__(self, knobs):
        self.knobs = knobs

    def close(self):
        pass
"""


def _build(root: Path, toml: str = GOOD, entry: str = ENTRY) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "build.toml").write_text(toml)
    (root / "hotpath.py").write_text(entry)
    (root / "helper.py").write_text(HELPER)
    return root


def _live_build_modules() -> set[str]:
    return {k for k in sys.modules if k.startswith("polymorph_build_")}


def test_reference_build_declares_the_search_space() -> None:
    spec = read_build(REFERENCE_BUILD)
    assert spec.name == "reference" and spec.parent is None and spec.entry == "hotpath.py"
    # The plain path is the default of every knob the search started from. The GPU knobs added
    # since are the reference build's own business (tests/engine_builds/).
    plain = {
        "kv_cache": "concat",
        "fused_qkv": False,
        "fused_gate_up": False,
        "attention": "manual",
        "decode_capture": "none",
        "sampling": "host",
    }
    assert {name: spec.defaults()[name] for name in plain} == plain
    assert spec.knobs["decode_capture"].choices == ("none", "cuda_graph", "compile")
    assert spec.knobs["decode_capture"].requires == {"kv_cache": "static", "decode_step": "layered"}
    assert all(k.description for k in spec.knobs.values())


def test_read_build_parses_every_field(tmp_path: Path) -> None:
    spec = read_build(_build(tmp_path))
    assert spec.name == "toy" and spec.description == "a toy build" and spec.dir == tmp_path
    assert spec.knobs["width"].choices == (1, 2, 4)
    assert spec.knobs["mode"].description == "which mode"
    assert spec.defaults() == {"width": 1, "mode": "a", "flag": False}


@pytest.mark.parametrize(
    ("toml", "expect"),
    [
        ("[build\nname=1", "not valid TOML"),
        ("[knobs.a]\nchoices = [1]\ndefault = 1\n", "missing [build]"),
        ('[build]\nname = "x"\ncolour = "red"\n', "build.colour"),
        ('[build]\nname = ""\n', "build.name"),
        ("[build]\nname = 3\n", "build.name"),
        ('[build]\nname = "x"\nentry = "../evil.py"\n', "build.entry"),
        ('[build]\nname = "x"\nentry = "missing.py"\n', "build.entry"),
        ('[build]\nname = "x"\n[extras]\na = 1\n', "[extras]"),
        ('[build]\nname = "x"\n[knobs.k]\nchoices = []\ndefault = 1\n', "knobs.k.choices"),
        ('[build]\nname = "x"\n[knobs.k]\nchoices = [1, 2]\n', "knobs.k.default"),
        ('[build]\nname = "x"\n[knobs.k]\nchoices = [1, 2]\ndefault = 3\n', "knobs.k.default"),
        ('[build]\nname = "x"\n[knobs.k]\nchoices = [true, false]\ndefault = 1\n', "knobs.k.default"),
        ('[build]\nname = "x"\n[knobs.k]\nchoices = [1, 1]\ndefault = 1\n', "knobs.k.choices"),
        ('[build]\nname = "x"\n[knobs.k]\nchoices = [[1]]\ndefault = 1\n', "knobs.k.choices"),
        ('[build]\nname = "x"\n[knobs.k]\nchoices = [1]\ndefault = 1\nmax = 2\n', "knobs.k.max"),
        ('[build]\nname = "x"\n[knobs."bad-name"]\nchoices = [1]\ndefault = 1\n', "bad-name"),
        (
            '[build]\nname = "x"\n[knobs.k]\nchoices = [1]\ndefault = 1\nrequires = { j = 1 }\n',
            "knobs.k.requires",
        ),
        (
            '[build]\nname = "x"\n[knobs.j]\nchoices = [1]\ndefault = 1\n'
            "[knobs.k]\nchoices = [1]\ndefault = 1\nrequires = { j = 2 }\n",
            "knobs.k.requires.j",
        ),
        ('[build]\nname = "x"\n[knobs.k]\nchoices = [1]\ndefault = 1\nrequires = [1]\n', "knobs.k.requires"),
        (
            '[build]\nname = "x"\n[knobs.k]\nchoices = [1, 2]\ndefault = 1\naccelerator_only = [3]\n',
            "knobs.k.accelerator_only",
        ),
        (
            '[build]\nname = "x"\n[knobs.k]\nchoices = [1, 2]\ndefault = 1\naccelerator_only = [1]\n',
            "the default",
        ),
        (
            '[build]\nname = "x"\n[knobs.k]\nchoices = [1, 2]\ndefault = 1\naccelerator_only = 2\n',
            "knobs.k.accelerator_only",
        ),
        (
            '[build]\nname = "x"\n[knobs.k]\nchoices = [1, 2]\ndefault = 1\nslow_prepare = [3]\n',
            "knobs.k.slow_prepare must be a list of its choices",
        ),
    ],
)
def test_bad_build_toml_is_one_sentence_naming_file_and_field(tmp_path: Path, toml: str, expect: str) -> None:
    _build(tmp_path, toml)
    with pytest.raises(BuildError) as e:
        read_build(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and msg.endswith("."), msg
    assert str(tmp_path / "build.toml") in msg and expect in msg, msg


def test_missing_build_toml(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=r"needs a build\.toml"):
        read_build(tmp_path)


def test_resolve_knobs_validates_and_coerces(tmp_path: Path) -> None:
    spec = read_build(_build(tmp_path))
    assert resolve_knobs(spec, {}) == spec.defaults()
    assert resolve_knobs(spec, {"width": 4, "flag": True}) == {"width": 4, "mode": "a", "flag": True}
    # Text from a command line maps onto the typed choice.
    resolved = resolve_knobs(spec, {"width": "2", "flag": "true", "mode": "b"})
    assert resolved == {"width": 2, "mode": "b", "flag": True}
    assert type(resolved["width"]) is int and resolved["flag"] is True
    with pytest.raises(BuildError, match="has no knob 'depth'; its knobs are: flag, mode, width"):
        resolve_knobs(spec, {"depth": 1})
    with pytest.raises(BuildError, match="must be one of 1, 2, 4; got 3"):
        resolve_knobs(spec, {"width": 3})
    with pytest.raises(BuildError, match="must be one of false, true"):
        resolve_knobs(spec, {"flag": 1})  # 1 == True in Python, but not a knob value here


def test_each_import_is_a_distinct_module_that_leaves_no_trace(tmp_path: Path) -> None:
    build = _build(tmp_path / "b")
    gc.collect()  # as below: no earlier test's garbage may leave during this one
    before = _live_build_modules()
    first, second = import_build(build), import_build(build)
    assert first is not second and first.__name__ != second.__name__
    assert first.STATE_ID is not second.STATE_ID  # module state is never shared
    assert first.helper is not second.helper
    assert len(_live_build_modules() - before) == 6  # two packages, each with entry + helper
    forget_build(first)
    forget_build(second.helper.Thing({}))  # any object the build defined identifies it
    assert _live_build_modules() == before
    assert not (build / "__pycache__").exists()  # the build's archive (and id) is untouched


def test_load_hotpath_unregisters_the_build_with_its_hot_path(tmp_path: Path) -> None:
    model = load_model("tiny")
    # An earlier test's hot path in a reference cycle would otherwise be collected by this test's
    # collect below, and its build's modules leave with it (seen once on a pytest-xdist worker).
    gc.collect()
    before = _live_build_modules()
    hotpath, spec, knobs = load_hotpath(model, _build(tmp_path), {"mode": "b"})
    assert spec.name == "toy" and knobs == {"width": 1, "mode": "b", "flag": False}
    assert hotpath.knobs == knobs  # the build's load() received the resolved knobs
    assert len(_live_build_modules() - before) == 3
    del hotpath
    gc.collect()
    assert _live_build_modules() == before


@pytest.mark.parametrize(
    ("entry", "expect"),
    [
        ("def load(model, knobs)\n    return 1\n", "SyntaxError"),
        ("from . import nothing_here\n", "ImportError"),
        ("raise RuntimeError('boom')\n", "RuntimeError: boom"),
        ("x = 1\n", "must define load(model, knobs)"),
    ],
)
def test_broken_entry_modules_are_build_errors(tmp_path: Path, entry: str, expect: str) -> None:
    before = _live_build_modules()
    _build(tmp_path, entry=entry)
    with pytest.raises(BuildError, match=expect.replace("(", r"\(").replace(")", r"\)")) as e:
        load_hotpath(load_model("tiny"), tmp_path)
    assert "\n" not in str(e.value)
    assert _live_build_modules() == before


def test_knob_variant_is_a_new_build_with_new_defaults(tmp_path: Path) -> None:
    base = _build(tmp_path / "base")
    original = (base / "build.toml").read_text()
    dest = knob_variant(
        base, {"width": 4, "flag": "true"}, tmp_path / "variant", name="toy-wide", parent="sha256:" + "a" * 64
    )
    assert (base / "build.toml").read_text() == original
    text = (dest / "build.toml").read_text()
    assert "# how many widgets" in text  # comments survive
    spec = read_build(dest)
    assert spec.defaults() == {"width": 4, "mode": "a", "flag": True}
    assert spec.name == "toy-wide" and spec.parent == "sha256:" + "a" * 64
    assert spec.description == "a toy build"
    assert (dest / "helper.py").read_text() == HELPER
    assert tomllib.loads(text)["knobs"]["mode"]["description"] == "which mode"
    # Loading the variant without overrides gets its own defaults.
    hotpath, _, knobs = load_hotpath(load_model("tiny"), dest)
    assert knobs["width"] == 4 and hotpath.knobs["flag"] is True


def test_knob_variant_of_the_reference_build(tmp_path: Path) -> None:
    dest = knob_variant(REFERENCE_BUILD, {"kv_cache": "static", "attention": "sdpa"}, tmp_path / "v")
    spec = read_build(dest)
    assert spec.defaults()["kv_cache"] == "static" and spec.defaults()["attention"] == "sdpa"
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        p.name for p in REFERENCE_BUILD.iterdir() if p.name != "__pycache__"
    )


def test_a_variant_whose_default_is_an_accelerators_value_leaves_it_out_of_accelerator_only(
    tmp_path: Path,
) -> None:
    # The sweep and the search make kernels = "triton" a variant's default: such a variant runs it
    # wherever it is loaded (on a CPU, as the default computes), so the value leaves the list.
    dest = knob_variant(
        REFERENCE_BUILD,
        {"kv_cache": "static", "decode_step": "fused", "kernels": "triton", "pdl": True},
        tmp_path / "triton",
    )
    spec = read_build(dest)
    assert spec.defaults()["kernels"] == "triton" and spec.defaults()["pdl"] is True
    assert spec.knobs["kernels"].accelerator_only == () and spec.knobs["pdl"].accelerator_only == ()
    assert spec.knobs["gemv"].accelerator_only == ("triton",)  # untouched where the default stays


def test_knob_variant_refuses_bad_input(tmp_path: Path) -> None:
    base = _build(tmp_path / "base")
    with pytest.raises(BuildError, match="has no knob"):
        knob_variant(base, {"depth": 2}, tmp_path / "v1")
    assert not (tmp_path / "v1").exists()
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "x").write_text("")
    with pytest.raises(BuildError, match="not an empty directory"):
        knob_variant(base, {"width": 2}, tmp_path / "v2")
    shutil.rmtree(tmp_path / "v2")


def test_knob_variants_have_their_own_build_ids(tmp_path: Path) -> None:
    from polymorph.contract.store.archive import build_id

    same = knob_variant(REFERENCE_BUILD, {}, tmp_path / "same")
    static = knob_variant(REFERENCE_BUILD, {"kv_cache": "static"}, tmp_path / "static")
    sdpa = knob_variant(REFERENCE_BUILD, {"attention": "sdpa"}, tmp_path / "sdpa")
    ids = {build_id(same), build_id(static), build_id(sdpa)}
    assert len(ids) == 3
    assert build_id(knob_variant(REFERENCE_BUILD, {"kv_cache": "static"}, tmp_path / "again")) == build_id(
        static
    )


def test_a_cpu_searches_no_value_that_acts_only_on_an_accelerator() -> None:
    spec = read_build(REFERENCE_BUILD)
    inert = {
        "decode_capture": "cuda_graph",
        "kernels": "triton",
        "gemv": "triton",
        "pdl": True,
        "residual": "norm",
    }
    for name, value in inert.items():
        assert value in spec.knobs[name].choices_on("cuda") and value not in spec.knobs[name].choices_on(
            "cpu"
        )
    assert spec.knobs["kernels"].choices_on("cpu") == ("torch", "compile")
