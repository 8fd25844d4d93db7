"""Static checks of engine_image/Dockerfile (no Docker engine here): base as a build argument,
the package installed with its engine extra, a numeric non-root user, ``polymorph`` as entrypoint,
and a build context (per Dockerfile.dockerignore) that holds everything the COPY lines need."""

from __future__ import annotations

import fnmatch
import json
import shlex
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "engine_image" / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and continuation lines joined."""
    out: list[tuple[str, str]] = []
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


def test_base_image_is_a_build_argument_declared_before_from() -> None:
    steps = instructions(DOCKERFILE.read_text())
    assert steps[0][0] == "ARG" and steps[0][1].startswith("BASE_IMAGE=")
    default = steps[0][1].split("=", 1)[1]
    assert default.startswith(("nvidia/cuda:", "pytorch/pytorch:"))
    froms = [args for kw, args in steps if kw == "FROM"]
    assert froms == ["${BASE_IMAGE}"]


def test_installs_the_package_with_the_engine_extra() -> None:
    steps = instructions(DOCKERFILE.read_text())
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for kw, a in steps if kw == "ARG" and "=" in a}
    extras = set(args["EXTRAS"].split(","))
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert "engine" in extras and extras <= declared
    runs = " ".join(a for kw, a in steps if kw == "RUN")
    assert 'pip install --extra-index-url "${TORCH_INDEX_URL}" ".[${EXTRAS}]"' in runs


def test_runs_as_numeric_non_root_user_with_polymorph_entrypoint() -> None:
    steps = instructions(DOCKERFILE.read_text())
    users = [a for kw, a in steps if kw == "USER"]
    assert users, "the image must switch to a non-root user"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or (gid.isdigit() and int(gid) != 0))
    keywords = [kw for kw, _ in steps]
    assert keywords.index("USER") > max(
        i for i, kw in enumerate(keywords) if kw == "RUN"
    )  # nothing runs as root after
    entrypoint = [a for kw, a in steps if kw == "ENTRYPOINT"]
    assert entrypoint and json.loads(entrypoint[-1]) == ["polymorph"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["polymorph"] == "polymorph.cli:main"


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


def test_copied_paths_exist_and_survive_the_dockerignore() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / "engine_image" / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    steps = instructions(DOCKERFILE.read_text())
    sources = [src for kw, a in steps if kw == "COPY" for src in shlex.split(a)[:-1]]
    assert "pyproject.toml" in sources
    for src in sources:
        path = ROOT / src
        assert path.exists(), src
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        kept = [p for p in files if not _ignored(p.relative_to(ROOT).as_posix(), patterns)]
        assert kept, f"{src} would be empty in the build context"
    for needed in (
        "engine_image/polymorph_engine/serving/server.py",
        "engine_image/polymorph_engine/builds/reference/build.toml",
        "operator/polymorph/cli.py",
    ):
        assert (ROOT / needed).is_file(), f"{needed} does not exist: the test must name files the image needs"
        assert not _ignored(needed, patterns), needed
    # Every module and build file of both packages reaches the image.
    for package in ("operator/polymorph", "engine_image/polymorph_engine"):
        for path in (ROOT / package).rglob("*"):
            rel = path.relative_to(ROOT).as_posix()
            if path.suffix in (".py", ".toml") and "__pycache__" not in path.parts:
                assert not _ignored(rel, patterns), rel
    assert _ignored(".venv/bin/python", patterns) and _ignored("tests/conftest.py", patterns)
    assert _ignored("operator/polymorph/__pycache__/cli.cpython-311.pyc", patterns)
