"""A base image made on this machine, for building the project's images where no registry answers.

``import_base(docker, tag, roots)`` streams a root filesystem into ``docker import`` and returns
the image's tag. The filesystem holds:

- the Python installation the tests run on (``sys.base_prefix``: its interpreter, the standard
  library with ``ensurepip`` but without ``site-packages``, libpython), at its own path, on ``PATH``;
- ``/bin/sh`` and every system library that these, the standard library's extension modules and
  the wheels' compiled modules load (``ldd``), at their own paths, with the symlinks on the way
  (``/lib`` -> ``usr/lib`` on a merged-usr system);
- ``/tmp`` (mode 1777) and an ``/etc/passwd`` and ``/etc/group`` with root alone, as a
  distribution's base image has: the images' user 65532 has no entry, as on a real base;
- ``/wheels``: the distributions that ``roots`` (``(name, extras)`` pairs) need, and what
  ``pyproject.toml`` needs to build the package, repacked as wheels from the test environment
  (each distribution's ``RECORD``), so ``pip install --no-index --find-links /wheels`` installs
  exactly the versions the tests pass with. A build requirement the environment holds only
  inside setuptools (``wheel``, which setuptools vendors) is repacked from that copy.

The image carries the label ``io.polymorph.test=<tag>``, which every image built ``FROM`` it
inherits: ``remove_images`` removes them all, and only them.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import io
import os
import re
import stat
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

__all__ = ["LABEL", "import_base", "remove_images", "wheel_closure"]

REPO = Path(__file__).resolve().parents[2]
LABEL = "io.polymorph.test"
_ELF = b"\x7fELF"
_SKIPPED = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}  # what pip writes at install
_LDD_LINE = re.compile(r"^\s*(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$")


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _environment() -> dict[str, importlib.metadata.Distribution]:
    """The test environment's distributions by normalised name; setuptools' vendored ones last."""
    found: dict[str, importlib.metadata.Distribution] = {}
    vendored = []
    spec = importlib.util.find_spec("setuptools")
    if spec is not None and spec.origin is not None:
        vendored.append(str(Path(spec.origin).parent / "_vendor"))
    for dist in [*importlib.metadata.distributions(), *importlib.metadata.distributions(path=vendored)]:
        found.setdefault(_key(dist.metadata["Name"]), dist)
    return found


def wheel_closure(roots: Iterable[tuple[str, frozenset[str]]]) -> list[importlib.metadata.Distribution]:
    """Every distribution ``roots`` need (markers evaluated here, extras followed), with the build
    requirements of ``pyproject.toml``; the roots themselves are left out (the image builds them)."""
    env = _environment()
    roots = list(roots)
    build = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    todo = [(Requirement(r).name, frozenset(Requirement(r).extras)) for r in build] + roots
    seen: dict[str, frozenset[str]] = {}
    while todo:
        name, extras = todo.pop()
        key = _key(name)
        if key not in env:
            raise LookupError(f"{name} is not installed in {sys.prefix}: the wheelhouse cannot hold it")
        if key in seen and extras <= seen[key]:
            continue
        seen[key] = seen.get(key, frozenset()) | extras
        for line in env[key].requires or []:
            req = Requirement(line)
            wanted = req.marker is None or any(req.marker.evaluate({"extra": e}) for e in {"", *seen[key]})
            if wanted:
                todo.append((req.name, frozenset(req.extras)))
    own = {_key(name) for name, _ in roots}
    return [env[key] for key in sorted(seen) if key not in own]


def _record_hash(data_hash: Any) -> str:
    return "sha256=" + base64.urlsafe_b64encode(data_hash.digest()).rstrip(b"=").decode()


def repack(dist: importlib.metadata.Distribution, folder: Path) -> Path:
    """Write ``dist`` as installed into a wheel in ``folder`` (uncompressed: they are unpacked once)."""
    wheel_text = dist.read_text("WHEEL")
    if wheel_text is None or dist.files is None:
        raise LookupError(
            f"{dist.metadata['Name']} has no WHEEL or RECORD: it was not installed from a wheel"
        )
    tags = [line.split(":", 1)[1].strip() for line in wheel_text.splitlines() if line.startswith("Tag:")]
    parts = [sorted({t.split("-")[i] for t in tags}) for i in range(3)]
    name, version = re.sub(r"[-_.]+", "_", dist.metadata["Name"]), dist.version
    target = folder / f"{name}-{version}-{'-'.join('.'.join(p) for p in parts)}.whl"
    site = Path(str(dist.locate_file("")))
    info = next(f for f in dist.files if f.name == "METADATA").parent.as_posix()  # the .dist-info folder
    data = f"{name}-{version}.data"
    scripts = {ep.name for ep in dist.entry_points if ep.group in ("console_scripts", "gui_scripts")}
    record: list[str] = []
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as whl:
        for file in dist.files:
            rel = file.as_posix()
            if "__pycache__" in file.parts or rel.endswith(".pyc"):
                continue
            if rel.startswith(f"{info}/") and file.name in _SKIPPED:
                continue
            source = Path(os.path.normpath(site / rel))
            if not source.is_file():
                continue
            if rel.startswith("../"):  # outside site-packages: a script in bin/, or data
                outside = source.relative_to(sys.prefix)
                if outside.parts[0] == "bin":
                    if source.name in scripts:
                        continue  # pip writes entry-point scripts itself
                    arcname = f"{data}/scripts/{source.name}"
                else:
                    arcname = f"{data}/data/{outside.as_posix()}"
            else:
                arcname = rel
            content = source.read_bytes() if arcname.startswith(f"{data}/scripts/") else None
            if content is not None and content.startswith(b"#!") and b"python" in content.split(b"\n", 1)[0]:
                content = b"#!python\n" + content.split(b"\n", 1)[1]  # pip points it at the new interpreter
            entry = zipfile.ZipInfo.from_file(source, arcname)
            digest = hashlib.sha256()
            with whl.open(entry, "w", force_zip64=True) as out:
                if content is not None:
                    digest.update(content)
                    out.write(content)
                    size = len(content)
                else:
                    size = 0
                    with source.open("rb") as src:
                        while chunk := src.read(1 << 20):
                            digest.update(chunk)
                            out.write(chunk)
                            size += len(chunk)
            record.append(f"{arcname},{_record_hash(digest)},{size}")
        record.append(f"{info}/RECORD,,")
        whl.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return target


def _libraries(files: Iterable[Path]) -> set[Path]:
    """The shared libraries ``files`` load, as ``ldd`` resolves them here (the loader included)."""
    out: set[Path] = set()
    for path in files:
        done = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=False, timeout=60)
        for line in done.stdout.splitlines():
            match = _LDD_LINE.match(line)
            if match:
                out.add(Path(match.group(1)))
    return out


def _elf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == _ELF
    except OSError:
        return False


class _RootFS:
    """A tar stream of a root filesystem: each path added with its parents, symlinks followed."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.added: set[str] = set()

    def _member(self, name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
        info = tarfile.TarInfo(name.lstrip("/"))
        info.type, info.mode, info.size, info.linkname = kind, mode, size, link
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    def directory(self, path: str, mode: int = 0o755) -> None:
        if path in self.added or path == "/":
            return
        self.directory(os.path.dirname(path))
        self.added.add(path)
        self.tar.addfile(self._member(path, tarfile.DIRTYPE, mode))

    def text(self, path: str, content: str, mode: int = 0o644) -> None:
        self.directory(os.path.dirname(path))
        data = content.encode()
        self.added.add(path)
        self.tar.addfile(self._member(path, tarfile.REGTYPE, mode, len(data)), io.BytesIO(data))

    def copy(self, source: Path, path: str, mode: int = 0o644) -> None:
        """The file ``source`` at ``path`` in the root filesystem."""
        self.directory(os.path.dirname(path))
        self.added.add(path)
        with source.open("rb") as f:
            self.tar.addfile(self._member(path, tarfile.REGTYPE, mode, source.stat().st_size), f)

    def add(self, path: Path | str) -> None:
        """``path`` as it is here: its parent folders (a symlinked one as the symlink and its
        target), then the file, following a chain of symlinks to the real file."""
        path = os.path.normpath(os.path.abspath(path))
        parent = os.path.dirname(path)
        real_parent = self._folder(parent)
        path = os.path.join(real_parent, os.path.basename(path))
        if path in self.added:
            return
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            link = os.readlink(path)
            self.added.add(path)
            self.tar.addfile(self._member(path, tarfile.SYMTYPE, 0o777, link=link))
            self.add(os.path.join(real_parent, link))
            return
        if stat.S_ISDIR(st.st_mode):
            self.directory(path)
            return
        mode = stat.S_IMODE(st.st_mode) | 0o444
        if mode & 0o100:
            mode |= 0o111
        self.added.add(path)
        with open(path, "rb") as f:
            self.tar.addfile(self._member(path, tarfile.REGTYPE, mode, st.st_size), f)

    def _folder(self, path: str) -> str:
        """Add the folder ``path`` (and any symlink on the way); returns its real path."""
        if path == "/":
            return path
        parent = self._folder(os.path.dirname(path))
        here = os.path.join(parent, os.path.basename(path))
        if os.path.islink(here):
            if here not in self.added:
                self.added.add(here)
                self.tar.addfile(self._member(here, tarfile.SYMTYPE, 0o777, link=os.readlink(here)))
            return self._folder(os.path.normpath(os.path.join(parent, os.readlink(here))))
        self.directory(here)
        return here


def _python_files() -> Iterator[Path]:
    """The interpreter, the standard library (without site-packages and its tests) and libpython."""
    prefix = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for name in (version, f"python{sys.version_info.major}", "python"):
        if (prefix / "bin" / name).exists():
            yield prefix / "bin" / name
    stdlib = prefix / "lib" / version
    for path in sorted(stdlib.rglob("*")):
        rel = path.relative_to(stdlib).parts
        if (
            rel[0] in ("site-packages", "dist-packages", "test")
            or rel[0].startswith("config-")
            or path.is_dir()
        ):
            continue
        yield path
    yield from sorted((prefix / "lib").glob("libpython*"))


def import_base(docker: str, tag: str, roots: Iterable[tuple[str, frozenset[str]]], work: Path) -> str:
    """``docker import`` the root filesystem (module docstring) as ``tag``, with the wheels ``roots`` need."""
    wheels = work / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    dists = wheel_closure(roots)
    native = [
        Path(str(d.locate_file(f)))
        for d in dists
        for f in d.files or []
        if ".so" in f.name and _elf(Path(str(d.locate_file(f))))
    ]
    python = list(_python_files())
    shell = Path("/bin/sh")
    libraries = _libraries([p for p in python if _elf(p)] + [shell] + native)
    venv = os.path.realpath(sys.prefix)
    system = sorted(p for p in libraries if not os.path.realpath(p).startswith(venv + os.sep))
    bin_path = f"{sys.base_prefix}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    command = [docker, "import", "--change", f"ENV PATH={bin_path}", "--change", f"LABEL {LABEL}={tag}",
               "-", tag]  # fmt: skip
    with tempfile.TemporaryFile(dir=work) as log:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=log)
        assert proc.stdin is not None
        try:
            with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                root = _RootFS(tar)
                root.directory("/tmp", 0o1777)
                root.text("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n")
                root.text("/etc/group", "root:x:0:\n")
                for path in [*python, shell, *system]:
                    root.add(path)
                root.directory("/wheels")
                for dist in dists:  # one at a time: the folder holds one wheel, however large
                    made = repack(dist, wheels)
                    root.copy(made, f"/wheels/{made.name}")
                    made.unlink()
        finally:
            proc.stdin.close()
            code = proc.wait(timeout=600)
        log.seek(0)
        output = log.read().decode(errors="replace").strip()
    if code != 0:
        raise RuntimeError(f"docker import of {tag} failed ({code}): {output}")
    return tag


def remove_images(docker: str, tag: str) -> None:
    """Remove every image labelled ``io.polymorph.test=<tag>`` (the base and what was built on it)."""
    for _ in range(5):
        listed = subprocess.run(
            [docker, "images", "-a", "-q", "--filter", f"label={LABEL}={tag}"],
            capture_output=True, text=True, check=False, timeout=60,
        ).stdout.split()  # fmt: skip
        if not listed:
            return
        subprocess.run([docker, "image", "prune", "-a", "-f", "--filter", f"label={LABEL}={tag}"],
                       capture_output=True, check=False, timeout=600)  # fmt: skip
        subprocess.run(
            [docker, "rmi", "-f", *dict.fromkeys(listed)], capture_output=True, check=False, timeout=600
        )
