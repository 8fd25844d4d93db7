"""Static checks of the two Dockerfiles, operator/Dockerfile and engine_image/Dockerfile (no Docker
engine needed; test_images_build builds and runs them where a daemon answers).

Both: the base a build argument declared before the first FROM, multi-stage (the image takes only
the virtual environment from the build stage), a numeric non-root user after every RUN of the
image's stage, ``polymorph`` as entrypoint, nothing written at run time outside /tmp
(PYTHONDONTWRITEBYTECODE, HOME, TMPDIR and caches there), every ``${ARG}`` a RUN uses declared
in its stage, and a build context that holds everything the COPY lines need, under the ignore
file BuildKit reads (``<Dockerfile>.dockerignore``) and the one the classic builder reads
(``.dockerignore``). The operator image installs the package without extras (no torch: not in
its install line, not among the package's own dependencies, and the engine's sources never reach
its context); the engine image installs it with its engine extra.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
IMAGES = {
    "operator": ROOT / "operator" / "Dockerfile",
    "engine": ROOT / "engine_image" / "Dockerfile",
}
Steps = list[tuple[str, str]]


def instructions(text: str) -> Steps:
    """(INSTRUCTION, arguments) pairs, with comments dropped and continuation lines joined."""
    out: Steps = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        out.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continuation"
    return out


def stages(steps: Steps) -> list[tuple[str, str | None, Steps]]:
    """(FROM's image, the stage's name, its instructions) for each stage, in order."""
    out: list[tuple[str, str | None, Steps]] = []
    for keyword, args in steps:
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            assert len(words) in (1, 3), f"FROM {args}"
            out.append((words[0], name, []))
        elif out:
            out[-1][2].append((keyword, args))
    return out


def steps_of(image: str) -> Steps:
    return instructions(IMAGES[image].read_text())


def global_args(steps: Steps) -> dict[str, str]:
    """The ARGs before the first FROM, with their defaults."""
    out = {}
    for keyword, args in steps:
        if keyword == "FROM":
            break
        assert keyword == "ARG", f"{keyword} before the first FROM"
        name, _, default = args.partition("=")
        out[name] = default
    return out


@pytest.mark.parametrize("image", list(IMAGES))
def test_base_image_is_a_build_argument_declared_before_from(image: str) -> None:
    steps = steps_of(image)
    default = global_args(steps)["BASE_IMAGE"]
    allowed = {"operator": ("python:3.11-slim",), "engine": ("nvidia/cuda:", "pytorch/pytorch:")}[image]
    assert default.startswith(allowed), default
    names: list[str] = []
    for base, name, _ in stages(steps):
        # Every stage stands on the base, or on a stage before it: nothing else is pulled.
        assert base == "${BASE_IMAGE}" or base in names, base
        if name:
            names.append(name)
    # A syntax directive would fetch BuildKit's frontend image from a registry.
    assert not IMAGES[image].read_text().lstrip().lower().startswith("# syntax")


@pytest.mark.parametrize("image", list(IMAGES))
def test_multi_stage_the_image_takes_only_the_virtual_environment(image: str) -> None:
    built = stages(steps_of(image))
    assert len(built) >= 2
    builder = next(s for s in built if s[1] == "build")
    assert any(kw == "RUN" and "pip install" in a for kw, a in builder[2]), "the build stage installs"
    final = built[-1][2]
    copies = [a for kw, a in final if kw == "COPY"]
    assert copies == ["--from=build /opt/polymorph /opt/polymorph"], copies
    assert not any(kw == "RUN" and "pip" in a for kw, a in final), "nothing is installed in the image's stage"


@pytest.mark.parametrize("image", list(IMAGES))
def test_runs_as_numeric_non_root_user_with_polymorph_entrypoint(image: str) -> None:
    final = stages(steps_of(image))[-1][2]
    users = [a for kw, a in final if kw == "USER"]
    assert users, "the image must switch to a non-root user"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or (gid.isdigit() and int(gid) != 0))
    keywords = [kw for kw, _ in final]
    runs = [i for i, kw in enumerate(keywords) if kw == "RUN"]
    assert not runs or keywords.index("USER") > max(runs)  # nothing runs as root after
    entrypoint = [a for kw, a in final if kw == "ENTRYPOINT"]
    assert entrypoint and json.loads(entrypoint[-1]) == ["polymorph"]
    assert PYPROJECT["project"]["scripts"]["polymorph"] == "polymorph.cli:main"


def _env(stage: Steps) -> dict[str, str]:
    out: dict[str, str] = {}
    for keyword, args in stage:
        if keyword == "ENV":
            for word in shlex.split(args):
                name, _, value = word.partition("=")
                out[name] = value
    return out


@pytest.mark.parametrize("image", list(IMAGES))
def test_nothing_is_written_outside_tmp_at_run_time(image: str) -> None:
    """A read-only root: no bytecode written, and HOME, TMPDIR and caches in /tmp (an emptyDir)."""
    final = stages(steps_of(image))[-1][2]
    env = _env(final)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    assert env["HOME"] == env["TMPDIR"] == "/tmp" and env["XDG_CACHE_HOME"].startswith("/tmp/")
    assert env["PATH"].startswith("/opt/polymorph/bin:") and env["VIRTUAL_ENV"] == "/opt/polymorph"
    assert [a for kw, a in final if kw == "WORKDIR"][-1] == "/tmp"
    assert not any(kw == "VOLUME" for kw, _ in final)  # the chart mounts /tmp; nothing else


@pytest.mark.parametrize("image", list(IMAGES))
def test_every_argument_a_run_uses_is_declared_in_its_stage(image: str) -> None:
    """An ARG before FROM is not seen inside a stage unless the stage declares it again."""
    for base, name, stage in stages(steps_of(image)):
        declared = {a.partition("=")[0] for kw, a in stage if kw == "ARG"} | set(_env(stage))
        for keyword, args in stage:
            if keyword == "RUN":
                used = set(re.findall(r"\$\{(\w+)\}", args))
                assert used <= declared, (name or base, used - declared)


def _install_lines(image: str) -> list[str]:
    builder = next(s for s in stages(steps_of(image)) if s[1] == "build")
    runs = " && ".join(a for kw, a in builder[2] if kw == "RUN")
    return [part.strip() for part in runs.split("&&") if "pip install" in part]


def test_the_operator_image_installs_the_package_without_extras_and_no_torch() -> None:
    assert _install_lines("operator") == [
        "/opt/polymorph/bin/pip install ${PIP_INSTALL_OPTIONS} -c .ci/constraints.txt ."
    ]
    text = " ".join(a for _, a in steps_of("operator")).lower()
    assert "torch" not in text and "engine" not in text and "extras" not in text
    # What `pip install .` brings: the package's own dependencies, none of the engine's or agent's.
    own = {re.split(r"[<>=!~\[; ]", d)[0].lower() for d in PYPROJECT["project"]["dependencies"]}
    assert own.isdisjoint({"torch", "safetensors", "tokenizers", "numpy", "anthropic"}), own
    assert {"kopf", "kubernetes", "pydantic", "boto3"} <= own
    pinned = (ROOT / ".ci" / "constraints.txt").read_text()
    assert not re.search(r"^torch==", pinned, re.MULTILINE)


def test_the_engine_image_installs_the_package_with_the_engine_extra() -> None:
    steps = steps_of("engine")
    builder = next(s for s in stages(steps) if s[1] == "build")[2]
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for kw, a in builder if kw == "ARG" and "=" in a}
    extras = set(args["EXTRAS"].split(","))
    declared = set(PYPROJECT["project"]["optional-dependencies"])
    assert "engine" in extras and extras <= declared
    assert _install_lines("engine") == [
        '/opt/polymorph/bin/pip install ${PIP_INSTALL_OPTIONS} --extra-index-url "${TORCH_INDEX_URL}" ".[${EXTRAS}]"'
    ]


def _patterns(path: Path) -> list[str]:
    return [
        line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes; a directory pattern covers its contents."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        parts = rel.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, pat.replace("**/", "")) for p in prefixes):
            ignored = not negate
    return ignored


def _sources(image: str) -> list[str]:
    return [
        src
        for kw, a in steps_of(image)
        if kw == "COPY" and not a.startswith("--from=")
        for src in shlex.split(a)[:-1]
    ]


# Files each image cannot work without: the test names them, so they must exist.
NEEDED = {
    "operator": [
        "operator/polymorph/cli.py",
        "operator/polymorph/handlers/process.py",
        ".ci/constraints.txt",
    ],
    "engine": [
        "engine_image/polymorph_engine/serving/server.py",
        "engine_image/polymorph_engine/builds/reference/build.toml",
        "operator/polymorph/cli.py",
    ],
}
PACKAGES = {
    "operator": ["operator/polymorph"],
    "engine": ["operator/polymorph", "engine_image/polymorph_engine"],
}


@pytest.mark.parametrize("image", list(IMAGES))
@pytest.mark.parametrize("builder", ["BuildKit", "classic"])
def test_copied_paths_exist_and_survive_the_dockerignore(image: str, builder: str) -> None:
    dockerfile = IMAGES[image]
    ignore = (
        dockerfile.with_name("Dockerfile.dockerignore") if builder == "BuildKit" else ROOT / ".dockerignore"
    )
    patterns = _patterns(ignore)
    sources = _sources(image)
    assert "pyproject.toml" in sources and "README.md" in sources  # pyproject's readme
    for src in sources:
        path = ROOT / src
        assert path.exists(), src
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        kept = [p for p in files if not _ignored(p.relative_to(ROOT).as_posix(), patterns)]
        assert kept, f"{src} would be empty in the build context"
    for needed in NEEDED[image]:
        assert (ROOT / needed).is_file(), f"{needed} does not exist: the test must name files the image needs"
        assert not _ignored(needed, patterns), needed
        assert any(needed == s or needed.startswith(s.rstrip("/") + "/") for s in sources), needed
    # Every module and build file of the packages the image installs reaches the image.
    for package in PACKAGES[image]:
        for path in (ROOT / package).rglob("*"):
            rel = path.relative_to(ROOT).as_posix()
            if path.suffix in (".py", ".toml") and "__pycache__" not in path.parts:
                assert not _ignored(rel, patterns), rel
    for outside in (
        ".venv/bin/python",
        "tests/conftest.py",
        ".git/HEAD",
        "e2e/harness.py",
        "bench/decode.py",
    ):
        assert _ignored(outside, patterns), outside
    assert _ignored("operator/polymorph/__pycache__/cli.cpython-311.pyc", patterns)


def test_the_engine_never_reaches_the_operator_image() -> None:
    """The operator's context (BuildKit) holds none of the engine, and its COPY lines name none of it."""
    patterns = _patterns(IMAGES["operator"].with_name("Dockerfile.dockerignore"))
    assert _ignored("engine_image/polymorph_engine/serving/server.py", patterns)
    assert not any(src.startswith("engine_image") for src in _sources("operator"))
