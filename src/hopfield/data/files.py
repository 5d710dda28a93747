"""Locating dataset files: a data directory (argument or ``$HOPFIELD_DATA``), checksums, origins.

A :class:`DataFile` names a file by its path relative to the data root (the layout of the
project's ``shared/data`` folder), its SHA-256 and where a user with internet finds the original.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

DATA_ENV = "HOPFIELD_DATA"

_VERIFIED: dict[tuple[str, float, int], str] = {}


class DataNotFoundError(FileNotFoundError):
    """A dataset file is not in the data directory; the message says where to get it."""


class ChecksumError(ValueError):
    """A dataset file exists but its SHA-256 differs from the expected one."""


@dataclass(frozen=True)
class DataFile:
    """A dataset file.

    Attributes:
        relative_path: path below the data root, e.g. ``"images/mnist/t10k-images-idx3-ubyte.gz"``.
        sha256: expected SHA-256 hex digest, or ``""`` to skip verification (user-supplied files).
        url: where the canonical file lives, for users with internet.
        system_paths: absolute paths tried when the data root lacks the file (Debian packages).
    """

    relative_path: str
    sha256: str
    url: str
    system_paths: tuple[str, ...] = ()


def data_root(data_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The data root: ``data_dir`` if given, else ``$HOPFIELD_DATA``, else ``None``."""
    if data_dir is not None:
        return Path(data_dir)
    env = os.environ.get(DATA_ENV)
    return Path(env) if env else None


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, read in blocks of 1 MiB (no cache: every call reads the file)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    """SHA-256 of a file, cached per (path, mtime, size) for the life of the process."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime, stat.st_size)
    if key not in _VERIFIED:
        _VERIFIED[key] = file_sha256(path)
    return _VERIFIED[key]


def locate(
    file: DataFile, data_dir: str | os.PathLike[str] | None = None, *, verify: bool = True
) -> Path:
    """The path of ``file`` below the data root (or a system path), checksum verified.

    Raises:
        DataNotFoundError: the file is in none of the places; the message names the expected
            path, the environment variable and the canonical URL.
        ChecksumError: the file is there but its content differs from the expected one.
    """
    root = data_root(data_dir)
    if root is not None and (root / file.relative_path).is_file():
        path = root / file.relative_path
        if verify and file.sha256:
            actual = sha256_of(path)
            if actual != file.sha256:
                raise ChecksumError(
                    f"{path}: SHA-256 is {actual}, expected {file.sha256}; "
                    f"the file is damaged or a different version (original: {file.url})"
                )
        return path
    # System copies (e.g. Debian's dataset packages) are recompressed, so their bytes differ from
    # the upstream checksum; their packaging is their verification.
    for system_path in map(Path, file.system_paths):
        if system_path.is_file():
            return system_path
    system = ", ".join(file.system_paths)
    if root is None:
        where = f"no data folder is set (neither --data-dir / data_dir=... nor ${DATA_ENV})"
        where += f" and it is not at {system}" if system else ""
    else:
        source = "--data-dir / data_dir" if data_dir is not None else f"${DATA_ENV}"
        where = f"not at {(root / file.relative_path).absolute()}" + (
            f" nor at {system}" if system else ""
        )
        where += f" (data folder {root.absolute()}, from {source})"
    raise DataNotFoundError(
        f"dataset file {file.relative_path!r} not found: {where}. Pass --data-dir DIR "
        f"(data_dir=DIR in Python) or set ${DATA_ENV}=DIR, where DIR/{file.relative_path} is the "
        f"file; the original is at {file.url}"
    )
