"""The files of a run: guarded writes (a full disk is one error), the log, the checkpoint
folders."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hopfield.data.files import file_sha256

LOG_FILE = "log.jsonl"
CHECKPOINT_DIR = "checkpoints"
_STEP_DIR = re.compile(r"step-(\d+)")
#: The file that makes a checkpoint folder complete: the size and SHA-256 of every other file
#: and the facts of the run that wrote it (:func:`write_manifest`).
MANIFEST = "manifest.json"
_FORMAT = "hopfield-checkpoint/2"
#: Free bytes below which a failed write counts as a full disk (``torch.save`` and
#: ``safetensors`` given a path report ``ENOSPC`` as a ``RuntimeError`` without ``errno``).
_NEARLY_FULL_BYTES = 1 << 20


class DiskFullError(OSError):
    """No space was left on the device to write a file of a run; the message names the file
    (one line), and the temporary file of the write is removed."""

    def __str__(self) -> str:
        return str(self.strerror)


#: The ``errno`` values of a full disk (no space left, disk quota exceeded).
FULL_DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT)


@contextmanager
def writing(target: Path, *temporaries: Path) -> Iterator[None]:
    """Guard the write of ``target`` through ``temporaries`` (files or folders renamed into
    place when complete): when the block raises, the temporaries are removed, and a full disk
    (``ENOSPC``, ``EDQUOT``, or a failed write with less than 1 MiB left on the file system,
    which is how ``torch.save`` to a path reports it) becomes a :class:`DiskFullError` naming
    ``target``."""
    try:
        yield
    except BaseException as error:
        full = _is_full_disk(error, target)
        for temporary in temporaries:
            if temporary.is_dir():
                shutil.rmtree(temporary, ignore_errors=True)
            else:
                temporary.unlink(missing_ok=True)
        if full:
            code = getattr(error, "errno", None)
            raise DiskFullError(
                code if code in FULL_DISK_ERRORS else errno.ENOSPC,
                f"no space left on the device to write {target}; free some space and run "
                "again (what the run wrote before is kept)",
            ) from error
        raise


def _is_full_disk(error: BaseException, target: Path) -> bool:
    """Whether ``error``, raised while writing ``target``, means that its disk is full."""
    if isinstance(error, OSError) and error.errno in FULL_DISK_ERRORS:
        return True
    if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit
        return False
    folder = next((p for p in target.parents if p.exists()), None)
    try:
        return folder is not None and shutil.disk_usage(folder).free < _NEARLY_FULL_BYTES
    except OSError:
        return False


def read_log(out_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of ``out_dir/log.jsonl`` (empty when there is none)."""
    path = Path(out_dir) / LOG_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class DamagedCheckpoint(Exception):
    """A checkpoint folder whose files do not match its manifest (cut short, changed, missing)
    or whose manifest cannot be read; the message names the file."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path


def _files_of(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: Path, facts: Mapping[str, Any]) -> None:
    """Write ``folder/manifest.json``: the size and SHA-256 of every other file of the
    checkpoint folder, and ``facts`` (step, process count, precision, ...). Written last, it
    marks the folder complete."""
    files = {
        str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
        for p in _files_of(folder)
    }
    text = json.dumps({"format": _FORMAT, "facts": dict(facts), "files": files}, indent=1)
    (folder / MANIFEST).write_text(text)


def verify_checkpoint(folder: Path) -> dict[str, Any]:
    """The facts of checkpoint ``folder`` after checking every file against its manifest:
    present, of the recorded size and SHA-256, and no file left out. :class:`DamagedCheckpoint`
    naming the file otherwise; nothing is loaded before this check passes."""
    manifest = folder / MANIFEST
    try:
        saved = json.loads(manifest.read_text())
        facts, files = saved["facts"], saved["files"]
        if saved["format"] != _FORMAT or not isinstance(facts, dict):
            raise ValueError(f"format {saved['format']!r}, expected {_FORMAT!r}")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DamagedCheckpoint(manifest, f"unreadable manifest ({error})") from error
    for name, recorded in files.items():
        path = folder / name
        if not path.is_file():
            raise DamagedCheckpoint(path, "missing")
        size = path.stat().st_size
        if size != recorded["bytes"]:
            raise DamagedCheckpoint(path, f"{size} bytes, the manifest says {recorded['bytes']}")
        if file_sha256(path) != recorded["sha256"]:
            raise DamagedCheckpoint(path, "its SHA-256 differs from the manifest's")
    extra = [str(p.relative_to(folder)) for p in _files_of(folder)]
    unknown = sorted(set(extra) - set(files))
    if unknown:
        raise DamagedCheckpoint(folder / unknown[0], "not in the manifest")
    return facts


def checkpoint_folders(out_dir: str | os.PathLike[str]) -> list[Path]:
    """The checkpoint folders ``out_dir/checkpoints/step-<N>`` with a manifest, newest first.

    ``ValueError`` naming the folder for one written by hopfield before the manifest (a
    ``trainer.pt`` without ``manifest.json``): resuming it needs that older version, and
    starting over would delete it."""
    root = Path(out_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.fullmatch(child.name)
        if match is None:
            continue
        if (child / MANIFEST).is_file():
            found.append((int(match[1]), child))
        elif (child / "trainer.pt").is_file():
            raise ValueError(
                f"checkpoint {child} was written by hopfield before 28 Nov 2026 (trainer.pt, no "
                "manifest.json): finish that run with the version that started it, or delete "
                "the folder to start over"
            )
    return [path for _, path in sorted(found, reverse=True)]


def latest_checkpoint(out_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint folder under ``out_dir/checkpoints`` (or ``None``)."""
    folders = checkpoint_folders(out_dir)
    return folders[0] if folders else None


def prune_checkpoints(out_dir: str | os.PathLike[str], keep: int) -> None:
    """Delete all but the ``keep`` newest ``step-<N>`` folders of ``out_dir/checkpoints``."""
    root = Path(out_dir) / CHECKPOINT_DIR
    kept = sorted(
        (int(m[1]), p) for p in root.iterdir() if (m := _STEP_DIR.fullmatch(p.name)) is not None
    )
    for _, old in kept[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
