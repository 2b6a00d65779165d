"""Avatar packets: one folder per avatar, a JSON manifest plus flat binary arrays.

Why flat files: every array opens as a memory map (`mmap` under a numpy view, then `torch.from_numpy`) without a copy
or a parse, so switching avatars costs a few system calls (~1 ms), and any engine can add its
own named arrays later (a registry of arrays, namespaced `engine/name`).

Integrity: the manifest records dtype, shape, byte size and SHA-256 of every file. Opening
checks sizes (cheap, catches truncation); `verify()` checks the hashes (catches tampering).
Writing is atomic: a new packet is built in a temp folder and renamed into place; adding arrays
to an existing packet writes new files first and then atomically replaces the manifest, which
is the single commit point.
"""
from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT_NAME = "newsstudio-avatar"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_HASH_BLOCK = 1 << 22


class PacketError(ValueError):
    """A packet that cannot be opened or trusted: missing, truncated, resized or tampered."""


@dataclass(frozen=True)
class ArraySpec:
    """How one named array is stored: file name, dtype, shape, byte size and SHA-256."""

    file: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "dtype": self.dtype, "shape": list(self.shape), "nbytes": self.nbytes, "sha256": self.sha256}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ArraySpec:
        return cls(str(d["file"]), str(d["dtype"]), tuple(int(s) for s in d["shape"]), int(d["nbytes"]), str(d["sha256"]))


def _file_name(name: str) -> str:
    return name.replace("/", "__") + ".bin"


def _check_name(name: str) -> None:
    ok = name and all(c.isalnum() or c in "_-/." for c in name) and ".." not in name and not name.startswith("/")
    if not ok:
        raise ValueError(f"invalid array name {name!r}")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def _write_array(folder: Path, name: str, array: np.ndarray) -> ArraySpec:
    _check_name(name)
    array = np.ascontiguousarray(array)
    fname = _file_name(name)
    h = hashlib.sha256()
    mv = memoryview(array.reshape(-1).view(np.uint8)) if array.size else memoryview(b"")
    with open(folder / fname, "wb") as f:
        for i in range(0, len(mv), _HASH_BLOCK):
            block = mv[i : i + _HASH_BLOCK]
            h.update(block)
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    return ArraySpec(fname, array.dtype.str, tuple(array.shape), int(array.nbytes), h.hexdigest())


def _write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    tmp = folder / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MANIFEST)


@dataclass
class Packet:
    """An opened packet: manifest plus memory-mapped arrays (nothing is read until touched)."""

    path: Path
    manifest: dict[str, Any]
    specs: dict[str, ArraySpec]
    _maps: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def id(self) -> str:
        return str(self.manifest["id"])

    @property
    def meta(self) -> dict[str, Any]:
        """Free-form geometry and provenance (fps, frame count, output size, ROI, engines...)."""
        return self.manifest["meta"]

    @property
    def n_frames(self) -> int:
        return int(self.meta["n_frames"])

    @property
    def fps(self) -> float:
        return float(self.meta["fps"])

    @property
    def size(self) -> tuple[int, int]:
        """Output (width, height)."""
        w, h = self.meta["size"]
        return int(w), int(h)

    def names(self) -> list[str]:
        return sorted(self.specs)

    def __contains__(self, name: str) -> bool:
        return name in self.specs

    def array(self, name: str) -> np.ndarray:
        """Read-only numpy view of a stored array (memory-mapped; no copy)."""
        if name not in self.specs:
            raise KeyError(f"avatar {self.id!r} has no array {name!r} (has: {', '.join(self.names())})")
        if name not in self._maps:
            spec = self.specs[name]
            if spec.nbytes == 0:
                self._maps[name] = np.zeros(spec.shape, dtype=np.dtype(spec.dtype))
            else:
                # a plain mmap under a plain ndarray: np.memmap costs ~40 % more per array (its
                # constructor and subclass hooks), a Python file object another ~3 us, and a str path,
                # not pathlib, skips resolving folders
                try:
                    fd = os.open(os.path.join(os.fspath(self.path), spec.file), os.O_RDONLY)
                    try:
                        mapped = mmap.mmap(fd, spec.nbytes, access=mmap.ACCESS_READ)
                    finally:
                        os.close(fd)  # the map keeps its own handle
                except (OSError, ValueError) as e:  # removed or truncated since the packet was opened
                    raise PacketError(f"avatar packet {self.path}: cannot map {spec.file} ({name}): {e}") from None
                self._maps[name] = np.frombuffer(mapped, dtype=np.dtype(spec.dtype)).reshape(spec.shape)
        return self._maps[name]

    def tensor(self, name: str) -> torch.Tensor:
        """CPU tensor sharing the memory map (read-only: never write into it)."""
        import warnings

        arr = self.array(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # non-writable numpy array
            return torch.from_numpy(arr)

    def engine_meta(self, engine: str) -> dict[str, Any] | None:
        return self.manifest.get("engines", {}).get(engine)

    def verify(self) -> None:
        """Recompute every checksum; raises PacketError naming the first bad file."""
        for name, spec in sorted(self.specs.items()):
            p = self.path / spec.file
            _check_size(self.path, spec, name)
            if sha256_file(p) != spec.sha256:
                raise PacketError(f"avatar packet {self.path}: {spec.file} ({name}) fails its checksum: the file was modified")

    def add_arrays(self, arrays: Mapping[str, np.ndarray], engine: str | None = None, engine_meta: dict[str, Any] | None = None) -> Packet:
        """Add or replace arrays (and an engine's metadata); the manifest swap is the commit point."""
        new_specs = dict(self.specs)
        for name, arr in arrays.items():
            spec = _write_array(self.path, name + ".new", arr)
            final = _file_name(name)
            os.replace(self.path / spec.file, self.path / final)
            new_specs[name] = ArraySpec(final, spec.dtype, spec.shape, spec.nbytes, spec.sha256)
        manifest = json.loads(json.dumps(self.manifest))
        manifest["arrays"] = {k: v.to_json() for k, v in sorted(new_specs.items())}
        if engine is not None:
            manifest.setdefault("engines", {})[engine] = engine_meta or {}
        _write_manifest(self.path, manifest)
        return open_packet(self.path)


def _check_size(folder: Path, spec: ArraySpec, name: str) -> None:
    try:
        size = os.stat(os.path.join(os.fspath(folder), spec.file)).st_size  # os, not pathlib: runs per array per open
    except FileNotFoundError:
        raise PacketError(f"avatar packet {folder}: file {spec.file} ({name}) is missing") from None
    if size != spec.nbytes:
        raise PacketError(f"avatar packet {folder}: {spec.file} ({name}) has {size} bytes, manifest says {spec.nbytes}: truncated or resized")
    expect = math.prod(spec.shape) * np.dtype(spec.dtype).itemsize
    if expect != spec.nbytes:
        raise PacketError(f"avatar packet {folder}: manifest entry {name} is inconsistent (shape {spec.shape} x {spec.dtype} != {spec.nbytes} bytes)")


def open_packet(path: str | os.PathLike[str]) -> Packet:
    """Open a packet folder: parse the manifest, check every file's size, map nothing yet."""
    folder = Path(path)
    mpath = folder / MANIFEST
    if not mpath.is_file():
        raise PacketError(f"{folder} is not an avatar packet (no {MANIFEST}); build one with `newsstudio prebake`")
    try:
        manifest = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PacketError(f"avatar packet {folder}: {MANIFEST} is corrupt ({e})") from None
    if manifest.get("format") != FORMAT_NAME:
        raise PacketError(f"avatar packet {folder}: not a {FORMAT_NAME} manifest")
    if int(manifest.get("version", -1)) != FORMAT_VERSION:
        raise PacketError(f"avatar packet {folder}: format version {manifest.get('version')} is not supported (this build reads {FORMAT_VERSION}); prebake it again")
    try:
        specs = {k: ArraySpec.from_json(v) for k, v in manifest["arrays"].items()}
    except (KeyError, TypeError, ValueError) as e:
        raise PacketError(f"avatar packet {folder}: manifest array table is malformed ({e})") from None
    for name, spec in specs.items():
        if os.path.basename(spec.file) != spec.file or spec.file in ("", ".", ".."):
            raise PacketError(f"avatar packet {folder}: array {name} points outside the packet ({spec.file!r})")
        _check_size(folder, spec, name)
    return Packet(folder, manifest, specs)


class PacketWriter:
    """Builds a new packet in a temp folder next to the destination; `commit()` renames it in.

    Used as a context manager: an exception inside the block removes the temp folder and
    leaves any existing packet at the destination untouched.
    """

    def __init__(self, dest: str | os.PathLike[str], avatar_id: str, meta: dict[str, Any], overwrite: bool = True):
        self.dest = Path(dest)
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        if self.dest.exists() and not overwrite:
            raise FileExistsError(f"avatar packet {self.dest} exists (use --force to rebuild it)")
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.dest.name}.", suffix=".tmp", dir=self.dest.parent))
        self.avatar_id = avatar_id
        self.meta = dict(meta)
        self.specs: dict[str, ArraySpec] = {}
        self.engines: dict[str, dict[str, Any]] = {}
        self._done = False

    def add(self, name: str, array: np.ndarray | torch.Tensor) -> None:
        if isinstance(array, torch.Tensor):
            array = array.detach().cpu().numpy()
        self.specs[name] = _write_array(self.tmp, name, np.asarray(array))

    def set_engine_meta(self, engine: str, meta: dict[str, Any]) -> None:
        self.engines[engine] = meta

    def commit(self) -> Packet:
        manifest = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "id": self.avatar_id,
            "created_unix": time.time(),
            "meta": self.meta,
            "engines": self.engines,
            "arrays": {k: v.to_json() for k, v in sorted(self.specs.items())},
        }
        _write_manifest(self.tmp, manifest)
        old = None
        if self.dest.exists():
            old = self.dest.with_name(f".{self.dest.name}.old.{os.getpid()}")
            os.replace(self.dest, old)
        os.replace(self.tmp, self.dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self._done = True
        return open_packet(self.dest)

    def abort(self) -> None:
        if not self._done:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self._done = True

    def __enter__(self) -> PacketWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or not self._done:
            self.abort()


def iter_packets(root: str | os.PathLike[str]) -> Iterator[Path]:
    """Packet folders directly under `root` (hidden temp folders excluded)."""
    r = Path(root)
    if not r.is_dir():
        return
    for p in sorted(r.iterdir()):
        if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST).is_file():
            yield p
