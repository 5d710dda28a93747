"""CPU kernels for the gathered structures (Top-K and random-mask attention), compiled on first use.

PyTorch has no fused operator for "the ``k`` largest of each row" that is cheap for wide rows
(:meth:`torch.Tensor.topk` costs about as much as the score product it ranks), nor for products of
queries with per-query gathered keys (``index_select`` then ``mul`` then ``sum`` moves every
gathered key through memory three times). ``native_kernels.c`` (next to this file) does both in
one pass over the data:

- :func:`topk` and :class:`RunningTopK`: the ``k`` largest entries of each row and their
  columns, the latter over columns that arrive in chunks;
- :func:`topk_keep`: rows with their ``k`` largest entries kept in place (``-inf`` elsewhere),
  or the Softmax_n weights over them, for Top-K on a full score matrix;
- :func:`topk_attend`, :func:`sample_attend` and :func:`attend_backward`: Top-K and random-mask
  Softmax_n attention and its gradients, each in one parallel region (score products by the
  BLAS PyTorch ships, found at run time, see :func:`attention_available`);
- :func:`gather_dot`: ``out[r, j] = ⟨a[r], table[idx[r, j]]⟩``;
- :func:`scatter_outer`: ``dst[idx[r, j]] += w[r, j] · src[r]`` (the gradient of
  :func:`gather_dot` with respect to its table).

The C file has no PyTorch headers: the system C compiler (``$CC``, split as a shell would, else
``cc``) builds it in about a second into ``$HOPFIELD_CACHE`` (default
``~/.cache/hopfield``)``/native/<hash>/``, keyed by the source, the flags, the compiler and the
machine, so processes sharing a home directory on different machines never load each other's
build; several processes building at once each write a private file, load it, and rename it into
place, then its manifest (size, SHA-256, exported kernels). The library is loaded with
:mod:`ctypes` and the kernels run on the data pointers of contiguous CPU float32/float64 tensors,
over :func:`torch.get_num_threads` threads.

Loading a library runs its code, so only this user's verified builds are loaded: the cache
folders must belong to the user and be writable by no one else (else one warning and the PyTorch
path), and a cached library must match its manifest and export every kernel (else it is rebuilt).
The public functions check their arguments (device, dtype, shapes, index ranges) before the C
code sees them; the C code reports failed allocations (a MemoryError here). See docs/efficient.md,
*Native kernels*.

:func:`available` says whether the kernels can be used; it is ``False`` with
``HOPFIELD_NATIVE=0`` in the environment, without a C compiler or a private cache folder (one
warning says why) and for
tensors that are not contiguous-able CPU float32/float64 (e.g. on GPUs, where PyTorch's own
kernels are fast and the callers keep them). Callers fall back to their PyTorch path then; both
paths are tested against the same float64 references.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import math
import os
import platform
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "RunningTopK",
    "attend_backward",
    "attention_available",
    "available",
    "enabled",
    "floyd_sample",
    "gather_dot",
    "rms_backward",
    "rms_forward",
    "sample_attend",
    "scatter_outer",
    "topk",
    "topk_attend",
    "usable_on",
]

_SOURCE = Path(__file__).with_name("native_kernels.c")
# Tried in turn: OpenMP shares PyTorch's thread pool (its libgomp.so.1 is already loaded), and
# -march=native the machine's vector units; the last set needs neither.
_FLAG_SETS = (
    ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fPIC", "-shared", "-pthread"],
    ["-O3", "-fopenmp", "-fno-math-errno", "-fPIC", "-shared", "-pthread"],
    ["-O3", "-fno-math-errno", "-fPIC", "-shared", "-pthread"],
)
_DTYPES = {torch.float32: "f32", torch.float64: "f64"}
_INT64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_REAL = {"f32": ctypes.c_float, "f64": ctypes.c_double}
# Argument types of the exported kernels (pointers, int64 sizes, int threads); a cached library
# must export all of them (its manifest records the list, checked again after loading it).
_SIGNATURES: dict[str, Sequence[type]] = {
    "hop_floyd": [_PTR, _PTR, _PTR, _INT64, _INT64, _INT64, _PTR, ctypes.c_int],
    "hop_sample_indices": [
        *(_PTR, _PTR, _INT64, _INT64, _INT64, ctypes.c_uint64, _INT64, _INT64, _INT64, _PTR),
        ctypes.c_int,
    ],
    **{
        f"{name}_{suffix}": arguments
        for suffix, real in _REAL.items()
        for name, arguments in {
            "hop_topk_push": [
                *(_PTR, _INT64, _INT64, _INT64, _INT64),
                *(_PTR, _PTR, _PTR, _PTR, _PTR, _INT64, ctypes.c_int),
            ],
            "hop_topk_finish": [_INT64, _PTR, _PTR, _PTR, _INT64, _PTR, _PTR, ctypes.c_int],
            "hop_topk": [_PTR, _INT64, _INT64, _INT64, _INT64, _PTR, _PTR, ctypes.c_int],
            "hop_topk_keep": [
                *(_PTR, _INT64, _INT64, _PTR, real, ctypes.c_int, real, _PTR, ctypes.c_int)
            ],
            "hop_sample_keep": [
                *(_PTR, _INT64, _INT64, _PTR, _PTR, ctypes.c_uint64, _INT64, _INT64, _INT64),
                *(real, ctypes.c_int, real, _PTR, ctypes.c_int),
            ],
            "hop_topk_attend": [
                *(_PTR, _PTR, _PTR, _PTR, _PTR, _INT64, _INT64, _INT64, _INT64, _INT64, _PTR, _PTR),
                *(_INT64, _INT64, _PTR, real, real, _INT64, _INT64, _PTR, _PTR, _PTR, ctypes.c_int),
            ],
            "hop_sample_attend": [
                *(_PTR, _PTR, _PTR, _PTR, _PTR, _INT64, _INT64, _INT64, _INT64, _INT64, _PTR, _PTR),
                *(_INT64, _INT64, _PTR, _PTR, ctypes.c_uint64, real, real, _INT64, _PTR, _PTR),
                *(_PTR, ctypes.c_int),
            ],
            "hop_attend_backward": [
                *(_PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _INT64, _PTR, _INT64, _INT64),
                *(_INT64, _INT64, _INT64, _INT64, _INT64, real, _PTR, _PTR, _PTR, ctypes.c_int),
            ],
            "hop_rms_forward": [_PTR, _PTR, _INT64, _INT64, real, _PTR, _PTR, ctypes.c_int],
            "hop_rms_backward": [
                *(_PTR, _PTR, _PTR, _PTR, _INT64, _INT64, _INT64, _PTR, _PTR, _PTR, ctypes.c_int)
            ],
            "hop_gather_dot": [_PTR, _PTR, _PTR, _INT64, _INT64, _INT64, _PTR, ctypes.c_int],
            "hop_scatter_outer": [
                *(_PTR, _PTR, _PTR, _INT64, _INT64, _INT64, _PTR, _INT64, ctypes.c_int)
            ],
        }.items()
    },
}
_EXPORTS = sorted(_SIGNATURES)
_NO_MEMORY = 1  # HOP_NO_MEMORY of native_kernels.c
_BAD_COUNTS = 2  # HOP_BAD_COUNTS
_BAD_INDEX = 4  # HOP_BAD_INDEX
_MANIFEST = "manifest.json"
_TEMP_PREFIX = ".build-"
_STALE_SECONDS = 3600.0  # a build takes seconds (its timeout is 300 s)
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def enabled() -> bool:
    """Whether the environment allows the native kernels (``HOPFIELD_NATIVE`` is not ``0``)."""
    return os.environ.get("HOPFIELD_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def capturing_graph() -> bool:
    """Whether a graph is being captured: for export (:func:`torch.export.export`, and so
    ``torch.onnx.export(..., dynamo=True)``, or the TorchScript tracer of the legacy ONNX
    exporter) or by :func:`torch.compile`.

    Paths step aside then for ones a graph holds: the CPU flash kernel's log-sum-exp (no ONNX
    rule; a custom autograd function that would break a compiled graph) for plain SDPA, which
    the compilers lower themselves, Python branches on tensor values (data-dependent, fixed at
    capture time) for their branch-free form, which gives the same result, and caches keyed by
    data pointers (which a compiled graph cannot read) for the computation they cache; the
    native kernels (ctypes calls on data pointers) for their PyTorch paths (:func:`available`).
    """
    return bool(
        torch.compiler.is_exporting() or torch.jit.is_tracing() or torch.compiler.is_compiling()
    )


def transforming() -> bool:
    """Whether a :mod:`torch.func` transform (``vmap``, ``grad``, ``jacrev``, ...) is running:
    its tensors are wrappers without storage (no data pointers: no caches keyed by them, no
    native kernels) and, under ``vmap``, without one value to branch on in Python. The paths
    that read either step aside then, as while a graph is captured (:func:`capturing_graph`);
    the CPU flash kernel's autograd function stays (it has a vmap rule and, for the double
    backward every transform takes, a differentiable backward)."""
    return torch._C._functorch.maybe_current_level() is not None


def abstract_tensors() -> bool:
    """Whether the tensors of this call have no data to read: a graph is being captured
    (:func:`capturing_graph`) or a :mod:`torch.func` transform runs (:func:`transforming`).
    No data pointers then (no caches keyed by them, no native kernels, no ``out=`` buffers) and
    no value to branch on in Python: the paths that need either take their branch-free,
    pointer-free forms."""
    return capturing_graph() or transforming()


def reading_waits(tensor: Tensor) -> bool:
    """Whether reading a value of ``tensor`` on the host (``bool(t.any())``, ``.item()``) waits
    for a device to finish its queued work (a synchronisation): for every tensor not on the CPU.
    A branch that only saves work where reading is cheap takes its branch-free form then."""
    return not tensor.is_cpu


def _cache_root() -> Path:
    root = os.environ.get("HOPFIELD_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "hopfield"


def _machine_key() -> str:
    """What the build depends on besides the source and flags: CPU model and compiler."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            lines = [line for line in handle if line.startswith(("model name", "flags"))]
        cpu += "".join(sorted(set(lines)))
    except OSError:
        pass
    return cpu


def _compiler() -> list[str] | None:
    """The compiler command, ``$CC`` split as a shell would (``ccache gcc``), else ``cc``;
    ``None`` when its program is not found."""
    try:
        words = shlex.split(os.environ.get("CC", "cc"))
    except ValueError:
        return None
    program = shutil.which(words[0]) if words else None
    return None if program is None else [program, *words[1:]]


def _compiler_version(compiler: list[str]) -> str:
    try:
        done = subprocess.run(
            [*compiler, "--version"], capture_output=True, text=True, errors="replace", timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout


class _UntrustedCache(Exception):
    """The cache folder may hold files of other users: nothing is built or loaded there."""


def _owned_by_us(info: os.stat_result) -> bool:
    geteuid = getattr(os, "geteuid", None)
    return geteuid is None or info.st_uid == geteuid()


def _private_folder(folder: Path) -> None:
    """Create ``folder`` (mode 0700) if missing; raise :class:`_UntrustedCache` unless it is a
    folder of this user that no one else may write to."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    if not stat.S_ISDIR(info.st_mode) or not _owned_by_us(info) or info.st_mode & _OTHERS_WRITE:
        raise _UntrustedCache(
            f"{folder} is not a folder of this user that only it may write to (owner uid "
            f"{info.st_uid}, mode {stat.filemode(info.st_mode)})"
        )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _verified(folder: Path) -> Path | None:
    """The library that ``folder``'s manifest records, if it is a regular file of this user that
    no one else may write to, of the recorded size and SHA-256 (else ``None``: build again)."""
    try:
        manifest = json.loads((folder / _MANIFEST).read_text())
        if not isinstance(manifest, dict):
            return None
        library = folder / str(manifest["library"])
        info = library.lstat()
        if (
            manifest.get("exports") != _EXPORTS
            or library.parent != folder
            or not stat.S_ISREG(info.st_mode)
            or not _owned_by_us(info)
            or info.st_mode & _OTHERS_WRITE
            or info.st_size != manifest["size"]
            or info.st_size == 0
            or _sha256(library) != manifest["sha256"]
        ):
            return None
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return library


def _write_private(folder: Path, suffix: str, data: bytes = b"") -> Path:
    """A new file ``folder/.build-<host>-<pid>-<random><suffix>`` (mode 0600) holding ``data``:
    a name :func:`_clean_up` can tell apart once its process is gone."""
    handle, name = tempfile.mkstemp(
        prefix=f"{_TEMP_PREFIX}{platform.node()}-{os.getpid()}-", suffix=suffix, dir=folder
    )
    with os.fdopen(handle, "wb") as file:
        file.write(data)
    return Path(name)


def _clean_up(folder: Path) -> None:
    """Remove the temporary files of builds that died (killed during a build): those of this
    machine whose process is gone, and any older than an hour."""
    host = platform.node()
    for path in folder.glob(_TEMP_PREFIX + "*"):
        owner_host, _, rest = path.name[len(_TEMP_PREFIX) :].rpartition("-")[0].rpartition("-")
        try:
            stale = time.time() - path.lstat().st_mtime > _STALE_SECONDS
            if not stale and owner_host == host and rest.isdigit():
                stale = not _alive(int(rest))
            if stale:
                path.unlink()
        except OSError:
            pass  # removed by another process meanwhile


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _load(path: Path) -> ctypes.CDLL:
    """``dlopen`` ``path`` and declare its kernels; an :class:`OSError` if any is missing."""
    try:
        return _declare(ctypes.CDLL(str(path)))
    except AttributeError as error:
        raise OSError(f"{path} lacks a kernel: {error}") from error


def _compile(compiler: list[str], flags: list[str], folder: Path) -> ctypes.CDLL:
    """Compile the kernels into a private file, load it and only then publish it under its
    hash, with its manifest, both by atomic renames."""
    private = _write_private(folder, ".so")
    try:
        command = [*compiler, *flags, "-o", str(private), str(_SOURCE), "-lm"]
        done = subprocess.run(
            command, capture_output=True, text=True, errors="replace", timeout=300
        )
        if done.returncode != 0:
            raise OSError(f"{shlex.join(command)} failed:\n{done.stderr.strip()}")
        size = private.stat().st_size
        if size == 0:
            raise OSError(f"{shlex.join(command)} exited 0 but wrote no library")
        os.chmod(private, 0o700)
        digest = _sha256(private)
        library = _load(private)
        final = folder / f"hopfield_kernels-{digest[:16]}.so"
        os.replace(private, final)
        record = {"library": final.name, "size": size, "sha256": digest, "exports": _EXPORTS}
        manifest = _write_private(folder, ".json", json.dumps(record).encode())
        os.replace(manifest, folder / _MANIFEST)
        return library
    finally:
        private.unlink(missing_ok=True)


def _build(compiler: list[str], flags: list[str]) -> ctypes.CDLL:
    """The kernels built with ``flags``: the cached library if its manifest vouches for it (see
    :func:`_verified`) and it loads, else a fresh build."""
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(
        source
        + " ".join(flags).encode()
        + _compiler_version(compiler).encode()
        + _machine_key().encode()
    ).hexdigest()[:20]
    root = _cache_root()
    folder = root / "native" / key
    for path in (root, root / "native", folder):
        _private_folder(path)
    _clean_up(folder)
    cached = _verified(folder)
    if cached is not None:
        try:
            return _load(cached)
        except OSError:
            pass  # a stale library: build again
    return _compile(compiler, flags, folder)


def _declare(library: ctypes.CDLL) -> ctypes.CDLL:
    """Declare the argument types of the kernels; each returns 0 or :data:`_NO_MEMORY` (see
    :func:`_run`). An AttributeError if one is missing."""
    for name, arguments in _SIGNATURES.items():
        function = getattr(library, name)
        function.argtypes = arguments
        function.restype = ctypes.c_int
    return library


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    """The loaded kernels, or ``None`` (with one warning) when they cannot be built."""
    compiler = _compiler()
    if compiler is None:
        _warn(f"no C compiler found (CC={os.environ.get('CC', 'cc')!r}; set CC)")
        return None
    errors = []
    for flags in _FLAG_SETS:
        try:
            return _build(compiler, flags)
        except _UntrustedCache as error:
            _warn(
                f"not building or loading the native kernels in {_cache_root()}: {error}. Set "
                "HOPFIELD_CACHE to a folder only you may write to (or chmod go-w it)"
            )
            return None
        except (OSError, subprocess.SubprocessError) as error:
            errors.append(str(error))
    _warn("the native kernels did not build: " + "\n".join(errors))
    return None


def _warn(reason: str) -> None:
    warnings.warn(
        f"hopfield: {reason}; Top-K and random-mask attention and the Hyper-SET RMS norms use "
        "their slower PyTorch path",
        RuntimeWarning,
        stacklevel=4,
    )


def usable_on(device: torch.device) -> bool:
    """Whether the native kernels can run on ``device``: enabled, the CPU, and built (for the
    kernels on index tensors only, e.g. :func:`floyd_sample`)."""
    return enabled() and device.type == "cpu" and not abstract_tensors() and _library() is not None


def available(*tensors: Tensor) -> bool:
    """Whether the native kernels can run on ``tensors``: :func:`usable_on` their device, and
    every tensor a CPU float32/float64 tensor of one dtype (integer index tensors aside)."""
    dtype = None
    for t in tensors:  # one loop, no lists: this runs on every call of a structure
        if not t.is_cpu:
            return False
        if t.is_floating_point():
            if dtype is None:
                dtype = t.dtype
            elif t.dtype != dtype:
                return False
    return dtype in _DTYPES and enabled() and not abstract_tensors() and _library() is not None


def _function(name: str, dtype: torch.dtype | None = None) -> Callable[..., int]:
    """The exported kernel ``name`` (its ``dtype`` version for the floating-point ones)."""
    library = _library()
    if library is None:  # callers check available() first
        raise RuntimeError("the hopfield native kernels are not available")
    suffix = "" if dtype is None else f"_{_DTYPES[dtype]}"
    function: Callable[..., int] = getattr(library, name + suffix)
    return function


def _run(name: str, dtype: torch.dtype | None, *arguments: object) -> None:
    """Call the kernel ``name`` (see :func:`_function`); a MemoryError if its scratch memory
    could not be allocated, a ValueError if the attention kernels found bad counts or
    indices."""
    status = _function(name, dtype)(*arguments)
    if status & _NO_MEMORY:
        raise MemoryError(f"the native kernel {name} could not allocate its scratch memory")
    if status & _BAD_COUNTS:
        raise ValueError(
            "count and population must hold, for every query, 0 <= count <= population <= S "
            "(the number of keys)"
        )
    if status & _BAD_INDEX:
        raise ValueError("support idx must hold key indices in [0, S)")


# Element operations a thread should get before a kernel splits its rows: smaller calls run on
# the calling thread alone and enter no parallel region (each region waits for every thread it
# starts, which on a busy CPU means waiting for a core; PyTorch's own grain is 32768).
_GRAIN = 1 << 15


def _threads(work: int) -> int:
    """Threads for a call of about ``work`` element operations: :func:`torch.get_num_threads`,
    fewer so that each has at least :data:`_GRAIN` of them, at least 1."""
    return max(1, min(torch.get_num_threads(), work // _GRAIN))


def _cpu_tensor(name: str, value: object, least_dims: int = 0) -> Tensor:
    """``value`` if it is a CPU tensor of at least ``least_dims`` dimensions (else a
    TypeError/ValueError naming ``name``)."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_cpu:
        raise ValueError(f"{name} must be on the CPU, got {value.device}")
    if value.dim() < least_dims:
        raise ValueError(f"{name} must have at least {least_dims} dimension(s), got {value.dim()}")
    return value


def _cpu_floats(*values: object) -> bool:
    """Whether ``values`` are CPU tensors of one dtype, float32 or float64 (the quick check of
    the common case; :func:`_float_dtype` names what is wrong otherwise)."""
    dtype = getattr(values[0], "dtype", None)
    return dtype in _DTYPES and all(
        isinstance(v, Tensor) and v.is_cpu and v.dtype == dtype for v in values
    )


def _float_dtype(**tensors: Tensor | None) -> torch.dtype:
    """The common dtype of the named CPU tensors (``None`` ones skipped): float32 or float64,
    the same for all (else a TypeError naming the first that differs)."""
    dtype: torch.dtype | None = None
    for name, value in tensors.items():
        if value is None:
            continue
        value = _cpu_tensor(name, value)
        if value.dtype not in _DTYPES:
            raise TypeError(f"{name} must be float32 or float64, got {value.dtype}")
        if dtype is not None and value.dtype != dtype:
            raise TypeError(f"{name} must be {dtype} like {next(iter(tensors))}, got {value.dtype}")
        dtype = value.dtype
    if dtype is None:
        raise TypeError("expected at least one floating-point tensor")
    return dtype


def _count(name: str, value: object, least: int) -> int:
    """``value`` if it is an int of at least ``least`` (else a TypeError/ValueError)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < least:
        raise ValueError(f"{name} must be at least {least}, got {value}")
    return value


def _integers(name: str, value: object) -> Tensor:
    """``value`` as a contiguous int64 CPU tensor; a TypeError unless it holds integers."""
    if isinstance(value, Tensor) and value.dtype == torch.int64 and value.is_cpu:
        return value.contiguous()  # the common case, checked first
    tensor = _cpu_tensor(name, value)
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers, got {tensor.dtype}")
    return (tensor if tensor.dtype == torch.int64 else tensor.to(torch.int64)).contiguous()


def _check_index(idx: Tensor, size: int, name: str) -> Tensor:
    """``idx`` as contiguous int64, every entry in ``[0, size)`` (else a ValueError: the kernels
    read memory at those offsets)."""
    idx = _integers(name, idx)
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= size):
        raise ValueError(f"{name} must hold indices in [0, {size}), got [{idx.min()}, {idx.max()}]")
    return idx


def _check_weight(weight: Tensor | None, width: int) -> Tensor | None:
    """``weight`` (``(width,)`` or ``None``) made contiguous (else a ValueError)."""
    if weight is not None and weight.shape != (width,):
        raise ValueError(
            f"weight must be ({width},) (x's last dimension), got {tuple(weight.shape)}"
        )
    return None if weight is None else weight.contiguous()


class RunningTopK:
    """The ``k`` largest entries of each of ``rows`` rows whose columns arrive in chunks
    (:meth:`push`), without concatenating them; :meth:`result` gives them.

    Each row keeps a buffer of up to ``4k`` candidates: its first chunk (of at least ``k``
    columns) sets a lower bound of the row's ``k``-th largest entry from the maxima of ``2k``
    strided column groups, later entries below the bound (or, once the buffer has been cut back
    to its ``k`` largest, not above its ``k``-th) are skipped at the cost of one comparison. The
    result is that of ``torch.topk(row, k, sorted=False)``: NaN counts as the largest, and of
    tied entries at the ``k``-th place the first columns (in push order) are kept.
    """

    def __init__(self, rows: int, k: int, dtype: torch.dtype) -> None:
        _count("rows", rows, 0)
        _count("k", k, 1)
        if dtype not in _DTYPES:
            raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        span = 4 * k + 16
        self.k, self.dtype, self.capacity = k, dtype, rows
        self._all_values = torch.empty(rows, span, dtype=dtype)
        self._all_columns = torch.empty(rows, span, dtype=torch.int64)
        self._all_count = torch.empty(rows, dtype=torch.int64)
        self._all_threshold = torch.empty(rows, dtype=dtype)
        self._all_mode = torch.empty(rows, dtype=torch.int32)
        self.restart(rows)

    def restart(self, rows: int) -> None:
        """Start a new selection over ``rows <= capacity`` rows, reusing the buffers (a fresh
        state per block of queries would cost its page faults again)."""
        _count("rows", rows, 0)
        if rows > self.capacity:
            raise ValueError(f"rows must lie in [0, {self.capacity}], got {rows}")
        self.rows, self.columns_seen, self._spent = rows, 0, False
        self._values, self._columns = self._all_values[:rows], self._all_columns[:rows]
        self._count, self._threshold = self._all_count[:rows], self._all_threshold[:rows]
        self._mode = self._all_mode[:rows]
        self._count.zero_()
        self._mode.zero_()

    def _check_live(self) -> None:
        if self._spent:
            raise RuntimeError("this selection's result() was taken: restart() it first")

    def push(self, x: Tensor, offset: int | None = None) -> None:
        """Feed the next columns ``x (..., W)`` (``rows`` rows in all, of the state's dtype),
        numbered from ``offset >= 0`` (default: right after the columns pushed so far)."""
        self._check_live()
        _cpu_tensor("x", x, least_dims=1)
        if x.dtype != self.dtype:
            raise TypeError(f"x must be {self.dtype} (the selection's dtype), got {x.dtype}")
        start = self.columns_seen if offset is None else _count("offset", offset, 0)
        width = x.shape[-1]
        chunk = x.reshape(-1, width)
        if chunk.shape[0] != self.rows:
            raise ValueError(f"x must hold {self.rows} rows of {self.dtype}, got {chunk.shape[0]}")
        if width == 0:
            return
        if chunk.stride(-1) != 1:
            chunk = chunk.contiguous()
        _run(
            "hop_topk_push",
            self.dtype,
            chunk.data_ptr(),
            self.rows,
            width,
            chunk.stride(0),
            start,
            self._values.data_ptr(),
            self._columns.data_ptr(),
            self._count.data_ptr(),
            self._threshold.data_ptr(),
            self._mode.data_ptr(),
            self.k,
            _threads(self.rows * width),
        )
        self.columns_seen = max(self.columns_seen, start + width)

    def result(self) -> tuple[Tensor, Tensor]:
        """``(values, columns)``, each ``(rows, k)``, unsorted; needs at least ``k`` columns
        pushed. The state is spent (its buffers are reordered): :meth:`restart` it to push
        again."""
        self._check_live()
        if self.columns_seen < self.k:
            raise ValueError(f"only {self.columns_seen} columns were pushed, fewer than k={self.k}")
        self._spent = True
        values = torch.empty(self.rows, self.k, dtype=self.dtype)
        columns = torch.empty(self.rows, self.k, dtype=torch.int64)
        _run(
            "hop_topk_finish",
            self.dtype,
            self.rows,
            self._values.data_ptr(),
            self._columns.data_ptr(),
            self._count.data_ptr(),
            self.k,
            values.data_ptr(),
            columns.data_ptr(),
            _threads(self.rows * 4 * self.k),
        )
        return values, columns


def topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` largest entries of each row of ``x (..., W)`` and their columns ``(..., k)``
    (int64), unsorted, as ``x.topk(k, sorted=False)`` (:class:`RunningTopK` over one chunk, with
    one buffer per thread instead of per row).
    Needs ``1 <= k <= W``."""
    _float_dtype(x=_cpu_tensor("x", x, least_dims=1))
    width = x.shape[-1]
    if not 1 <= _count("k", k, 1) <= width:
        raise ValueError(f"k must lie in [1, {width}] (the row width), got {k}")
    rows = x.reshape(-1, width)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    values = x.new_empty(rows.shape[0], k)
    columns = torch.empty(rows.shape[0], k, dtype=torch.int64)
    _run(
        "hop_topk",
        x.dtype,
        rows.data_ptr(),
        rows.shape[0],
        width,
        rows.stride(0),
        k,
        values.data_ptr(),
        columns.data_ptr(),
        _threads(rows.shape[0] * width),
    )
    return values.view(*x.shape[:-1], k), columns.view(*x.shape[:-1], k)


_KEEP_OUTPUTS = {"values": 0, "bias": 1, "softmax": 2}  # KEEP_* of native_kernels.c


def _row_counts(name: str, value: int | Tensor, shape: torch.Size) -> Tensor:
    """``value`` (one int, or one integer per row of ``shape``) as contiguous int64 ``(rows,)``."""
    if isinstance(value, Tensor):
        counts = _integers(name, value)
        if counts.shape != shape:
            raise ValueError(
                f"{name} must hold one count per row, {tuple(shape)}, got {tuple(counts.shape)}"
            )
        return counts.reshape(-1)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int or an integer tensor, got {type(value).__name__}")
    return torch.full((shape.numel(),), value, dtype=torch.int64)


def _keep_call(
    kernel: str,
    x: Tensor,
    output: str,
    out: Tensor | None,
    arguments: tuple[object, ...],
    scale: float,
    n: float,
) -> Tensor:
    """Check the arguments shared by :func:`topk_keep` and :func:`sample_keep`, run ``kernel``
    with ``arguments`` between the row shape and ``scale``, and return ``out``."""
    _float_dtype(x=_cpu_tensor("x", x, least_dims=1), out=out)
    if output not in _KEEP_OUTPUTS:
        raise ValueError(f"output must be one of {sorted(_KEEP_OUTPUTS)}, got {output!r}")
    width = x.shape[-1]
    rows = x.reshape(-1, width).contiguous()
    if out is None:
        out = torch.empty_like(rows)
    elif out.shape != x.shape or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous tensor of shape {tuple(x.shape)}")
    _run(
        kernel,
        x.dtype,
        rows.data_ptr(),
        rows.shape[0],
        width,
        *arguments,
        float(scale),
        _KEEP_OUTPUTS[output],
        float(n),
        out.data_ptr(),
        _threads(rows.shape[0] * width * 8),
    )
    return out.view(x.shape)


def topk_keep(
    x: Tensor,
    k: int | Tensor,
    *,
    output: str = "values",
    scale: float = 1.0,
    n: float = 0.0,
    out: Tensor | None = None,
) -> Tensor:
    """Each row of ``x (..., W)`` with its ``k`` largest entries kept: the same entries as
    :func:`topk` (first columns among ties, NaN largest). ``output`` says what is written:

    - ``"values"``: ``scale · x`` where kept, ``-inf`` elsewhere;
    - ``"bias"``: 0 where kept (but for ``-inf`` entries), ``-inf`` elsewhere: the additive mask
      of the selection, also as a mask of its own (``x + bias`` is the ``"values"`` output at
      scale 1);
    - ``"softmax"``: the Softmax_n weights of ``scale · x`` over the kept entries,
      ``exp(z_i) / (n + Σ_kept exp(z_j))``, and 0 elsewhere (a row with nothing finite gives
      zeros). In float32 the exponential is a polynomial with relative error below 2e-7.

    ``k`` is one count for every row or an integer tensor with one count per row
    (``x.shape[:-1]``); a count of at least ``W`` keeps the whole row, one of at most 0 keeps
    nothing. ``out`` (contiguous, ``x``'s shape and dtype) receives the result and may be ``x``
    itself (in place); by default a new tensor. No autograd."""
    counts = _row_counts("k", k, x.shape[:-1])
    return _keep_call("hop_topk_keep", x, output, out, (counts.data_ptr(),), scale, n)


def _stream_rows(
    shape: torch.Size, seed: int, start: int, length: int | None
) -> tuple[int, int, int]:
    """``(queries, length, start)`` of the sampling kernels for rows ``shape = (..., queries)``
    (see :func:`sample_keep`), checked with the seed."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 1 << 64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    queries = shape[-1] if len(shape) else 1
    length = start + queries if length is None else length
    if _count("start", start, 0) + queries > _count("length", length, 0):
        raise ValueError(f"start + {queries} queries must be at most length={length}")
    return max(queries, 1), length, start


def sample_keep(
    x: Tensor,
    count: int | Tensor,
    population: int | Tensor,
    seed: int,
    *,
    start: int = 0,
    length: int | None = None,
    output: str = "values",
    scale: float = 1.0,
    n: float = 0.0,
    out: Tensor | None = None,
) -> Tensor:
    """Each row of ``x (..., Lc, W)`` with a uniform random subset of ``count`` of its first
    ``population`` columns kept, and :func:`topk_keep`'s ``output``, ``scale``, ``n`` and ``out``.

    ``count`` and ``population`` are one int or an integer tensor per row (``x.shape[:-1]``),
    clipped to ``[0, W]`` and to the population. The rows are queries ``start .. start + Lc``
    of sequences of ``length`` (default ``start + Lc``), one per leading index: each draws
    Floyd's algorithm (as :func:`floyd_sample`) on its own splitmix64 stream, keyed by ``seed``
    (in ``[0, 2**64)``) and its place in the ``(..., length)`` whole, so a seed gives the same
    subsets for any number of threads and any cut of the queries into blocks, and the same as
    :func:`sample_indices`. No autograd."""
    shape = x.shape[:-1]
    counts = _row_counts("count", count, shape)
    populations = _row_counts("population", population, shape)
    rows = _stream_rows(shape, seed, start, length)
    arguments = (counts.data_ptr(), populations.data_ptr(), seed, *rows)
    return _keep_call("hop_sample_keep", x, output, out, arguments, scale, n)


def sample_indices(
    count: Tensor,
    population: int | Tensor,
    slots: int,
    seed: int,
    *,
    start: int = 0,
    length: int | None = None,
) -> Tensor:
    """The subsets :func:`sample_keep` keeps, as column indices ``(..., Lc, slots)`` (int64, in
    the order they are drawn; slots past a row's ``min(count, population)`` hold 0): ``count``
    ``(..., Lc)`` and ``population`` (one int or a tensor of ``count``'s shape) as there,
    ``slots >= max(count)``."""
    shape = _integers("count", count).shape
    counts = _row_counts("count", count, shape)
    populations = _row_counts("population", population, shape)
    rows = _stream_rows(shape, seed, start, length)
    if counts.numel() and _count("slots", slots, 0) < int(counts.clamp(max=populations).max()):
        raise ValueError(f"slots={slots} is below the largest count")
    out = torch.empty(counts.numel(), slots, dtype=torch.int64)
    width = int(populations.max()) if populations.numel() else 0
    _run(
        "hop_sample_indices",
        None,
        counts.data_ptr(),
        populations.data_ptr(),
        counts.numel(),
        slots,
        width,
        seed,
        *rows,
        out.data_ptr(),
        _threads(counts.numel() * max(slots, 1) * 8),
    )
    return out.view(*shape, slots)


_GEMM_NAMES = {torch.float32: "sgemm_", torch.float64: "dgemm_"}


def _torch_libraries() -> list[Path]:
    """PyTorch's own shared libraries that may export a BLAS (``libtorch_cpu``)."""
    return sorted((Path(torch.__file__).parent / "lib").glob("libtorch_cpu.*"))


@functools.cache
def _blas(dtype: torch.dtype) -> tuple[int, int | None] | None:
    """``(gemm, local_threads)``: the address of a BLAS matrix product (``sgemm_``/``dgemm_``,
    the Fortran interface) for ``dtype`` in this process or PyTorch's library (MKL in PyTorch's
    x86 wheels), if one is found and computes a known product right, and of that library's
    ``MKL_Set_Num_Threads_Local`` (``None`` without: the kernels then leave the BLAS's threads
    as they are); else ``None``. The kernels pass the product's sizes as 64-bit integers, whose
    low word is the 32-bit value on little-endian machines, so either integer width of the BLAS
    reads them right."""
    if sys.byteorder != "little" or not enabled():
        return None
    for source in (None, *map(str, _torch_libraries())):
        try:
            library = ctypes.CDLL(source)
            address = ctypes.cast(getattr(library, _GEMM_NAMES[dtype]), _PTR).value
        except (OSError, AttributeError):
            continue
        if address and _gemm_works(address, dtype):
            local = getattr(library, "MKL_Set_Num_Threads_Local", None)
            return address, None if local is None else ctypes.cast(local, _PTR).value
    return None


def _blas_pointers(dtype: torch.dtype, product: bool = True) -> tuple[int | None, int | None]:
    """The kernels' BLAS arguments ``(gemm, local_threads)`` (both ``None`` without a product
    or with ``product=False``)."""
    found = _blas(dtype) if product else None
    return (None, None) if found is None else found


def _gemm_works(address: int, dtype: torch.dtype) -> bool:
    """Whether the product at ``address`` gives ``2 a bᵀ`` for small ``a (2, 3)`` and ``b (4, 3)``
    called as the attention kernels call it."""
    real = _REAL[_DTYPES[dtype]]
    gemm = ctypes.CFUNCTYPE(None, *[_PTR] * 13)(address)
    a = torch.arange(1, 7, dtype=dtype).view(2, 3)
    b = torch.arange(-6, 6, dtype=dtype).view(4, 3)
    out = torch.full((2, 4), math.nan, dtype=dtype)
    keys, queries, inner = (ctypes.c_int64(size) for size in (4, 2, 3))
    alpha, beta = real(2.0), real(0.0)
    gemm(
        ctypes.c_char_p(b"T"), ctypes.c_char_p(b"N"), ctypes.byref(keys), ctypes.byref(queries),
        ctypes.byref(inner), ctypes.byref(alpha), b.data_ptr(), ctypes.byref(inner),
        a.data_ptr(), ctypes.byref(inner), ctypes.byref(beta), out.data_ptr(), ctypes.byref(keys),
    )  # fmt: skip
    return torch.equal(out, 2 * a @ b.T)


def attention_available(*tensors: Tensor) -> bool:
    """Whether :func:`topk_attend` can run on ``tensors``: :func:`available`, and a BLAS
    product for their dtype (see :func:`_blas`)."""
    return available(*tensors) and _blas(tensors[0].dtype) is not None


class _Sizes(NamedTuple):
    """The sizes of a fused attention call: batch-heads, queries, keys, key and value width."""

    heads: int
    length: int
    size: int
    dim: int
    vdim: int


def _attend_tensors(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor, _Sizes]:
    """Checked patterns of the fused attention kernels: ``q (..., L, E)``, ``k (..., S, E)`` and
    ``v (..., S, Ev)`` with the same leading shape, made contiguous (the kernels read them as
    ``(BH, ·, ·)``), and their sizes."""
    if not _cpu_floats(q, k, v):
        _float_dtype(q=q, k=k, v=v)  # raises the error that names the argument
    for name, value in (("q", q), ("k", k), ("v", v)):
        if value.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dimensions, got {value.dim()}")
    lead, dim = q.shape[:-2], q.shape[-1]
    if k.shape[:-2] != lead or v.shape[:-2] != lead or k.shape[-1] != dim:
        raise ValueError(
            f"q (..., L, E), k (..., S, E) and v (..., S, Ev) must share their leading shape and "
            f"E, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"k and v must hold the same S keys, got {k.shape[-2]} and {v.shape[-2]}")
    sizes = _Sizes(math.prod(lead), q.shape[-2], k.shape[-2], dim, v.shape[-1])
    return q.contiguous(), k.contiguous(), v.contiguous(), sizes


def _per_query(name: str, value: Tensor, queries: torch.Size) -> tuple[Tensor, int]:
    """``value`` as contiguous int64 with its stride per batch-head: one integer per query,
    ``(L,)`` for every batch-head (stride 0) or ``(..., L)``, the queries' shape ``queries``
    (stride ``L``); else a TypeError or ValueError naming it."""
    integers = _integers(name, value)
    length = queries[-1]
    if integers.shape == (length,):
        return integers, 0
    if integers.shape == queries:
        return integers, length
    raise ValueError(
        f"{name} must hold one integer per query, ({length},) or {tuple(queries)}, got "
        f"{tuple(integers.shape)}"
    )


def _per_key(name: str, value: Tensor | None, q: Tensor, k: Tensor) -> Tensor | None:
    """``value`` (``None`` or one entry per key of each batch-head, ``(..., S)`` with ``q``'s
    leading shape) made contiguous; else a ValueError naming it."""
    if value is None:
        return None
    value = _cpu_tensor(name, value)
    shape = (*q.shape[:-2], k.shape[-2])
    if value.shape != shape:
        raise ValueError(
            f"{name} must hold one entry per key of each batch-head, {shape}, got "
            f"{tuple(value.shape)}"
        )
    return value.contiguous()


def _attend_inputs(
    q: Tensor, k: Tensor, v: Tensor, count: Tensor, population: Tensor, bias: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, _Sizes, Tensor, Tensor, Tensor | None, tuple[int, int], Tensor]:
    """Checked inputs of :func:`topk_attend` and :func:`sample_attend`: the patterns and sizes
    of :func:`_attend_tensors`, ``count`` and ``population`` as contiguous int64 (see
    :func:`_per_query`), the per-key ``bias`` (``q``'s dtype), the two strides and the output
    ``(..., L, Ev)``."""
    q3, k3, v3, sizes = _attend_tensors(q, k, v)
    counts, count_stride = _per_query("count", count, q.shape[:-1])
    populations, population_stride = _per_query("population", population, q.shape[:-1])
    bias = _per_key("bias", bias, q, k)
    if bias is not None:
        _float_dtype(q=q, bias=bias)
    out = q.new_empty(*q.shape[:-1], v.shape[-1])
    strides = (count_stride, population_stride)
    return q3, k3, v3, sizes, counts, populations, bias, strides, out


def _pointer(tensor: Tensor | None) -> int | None:
    """``tensor``'s data pointer, ``None`` (a NULL pointer) for ``None``."""
    return None if tensor is None else tensor.data_ptr()


def largest(counts: Tensor) -> int:
    """The largest of ``counts`` (0 when empty)."""
    return int(counts.max()) if counts.numel() else 0


def _support_outputs(
    support: tuple[Tensor, Tensor] | None, q: Tensor, slots: int
) -> tuple[int | None, int | None]:
    """The data pointers of ``support = (idx, weights)``, which the kernels fill with each
    query's kept keys and weights: contiguous int64 and ``q``'s dtype, ``(..., L, K)`` with
    ``K = slots``, the largest count (else a ValueError); ``(None, None)`` without."""
    if support is None:
        return None, None
    idx, weights = support
    shape = (*q.shape[:-1], slots)
    for name, value, dtype in (("idx", idx, torch.int64), ("weights", weights, q.dtype)):
        _cpu_tensor(f"support {name}", value)
        if value.shape != shape or value.dtype != dtype or not value.is_contiguous():
            raise ValueError(
                f"support {name} must be a contiguous {dtype} tensor of shape {shape} (K = the "
                f"largest count), got {value.dtype} {tuple(value.shape)}"
            )
    return idx.data_ptr(), weights.data_ptr()


# Scores per query block of topk_attend and sample_attend (256 KiB in float32: stays in cache).
_ATTEND_SCORES = 1 << 16
# sample_attend takes its scores from a product with all keys where at least 1 key in this many
# is kept (a product costs less per score than a gathered dot product).
_PRODUCT_SHARE = 4
# attend_backward: its four products against per-key updates (measured: 0.6 against 0.75 ms at
# 64 of 128 keys, 2.4 against 1.5 ms at 64 of 256).
_BACKWARD_PRODUCT_SHARE = 2


def topk_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    count: Tensor,
    population: Tensor,
    *,
    scale: float,
    n: float = 0.0,
    chunk: int = 2048,
    bias: Tensor | None = None,
    support: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """Top-K Softmax_n attention without autograd, in one parallel region: query ``i`` of
    ``q (..., L, E)`` keeps the ``count[i]`` largest of its scores ``scale · ⟨q, k_j⟩ + bias_j``
    over its first ``population[i]`` keys of ``k (..., S, E)`` (the keys of :func:`topk`: first
    columns among ties, NaN largest; a key whose bias is ``-inf`` scores ``-inf`` whatever its
    product) and returns ``Σ softmax_n(kept)_j v_j``, ``(..., L, Ev)``. The scores of a block
    of queries and ``chunk`` keys come from the BLAS product (see :func:`attention_available`)
    on the thread that ranks them. ``count`` and ``population`` are integer, ``(L,)`` for every
    batch-head or ``(..., L)`` one row each, with ``0 <= count <= population <= S`` (else a
    ValueError); a query keeping nothing gives zeros, one keeping more keys than its bias
    allows gives the excluded ones weight 0. ``bias``: ``None`` or an additive mask per key
    ``(..., S)`` (``q``'s dtype). ``support = (idx, weights)``, contiguous ``(..., L, K)`` with
    ``K = max(count)`` (int64 and ``q``'s dtype), receives each query's kept keys and weights
    in its first ``count[i]`` slots, 0 in the others (for :func:`attend_backward`)."""
    q3, k3, v3, sizes, counts, populations, bias, strides, out = _attend_inputs(
        q, k, v, count, population, bias
    )
    idx_out, w_out = _support_outputs(support, q, largest(counts) if support else 0)
    gemm, local = _blas_pointers(q.dtype)
    if gemm is None:
        raise RuntimeError("no BLAS product found for the fused Top-K kernel")
    heads, length, size, dim, vdim = sizes
    chunk = max(1, min(_count("chunk", chunk, 1), size))
    threads = _threads(heads * length * size * dim)
    # query blocks: within the score budget, and at least 4 pieces per thread where possible
    rows = min(length, _ATTEND_SCORES // chunk, -(-heads * length // (4 * threads)))
    _run(
        "hop_topk_attend", q.dtype, gemm, local, q3.data_ptr(), k3.data_ptr(), v3.data_ptr(),
        heads, length, size, dim, vdim, counts.data_ptr(), populations.data_ptr(),
        *strides, _pointer(bias), float(scale), float(n), max(1, rows), chunk, out.data_ptr(),
        idx_out, w_out, threads,
    )  # fmt: skip
    return out


def sample_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    count: Tensor,
    population: Tensor,
    seed: int,
    *,
    scale: float,
    n: float = 0.0,
    product: bool | None = None,
    bias: Tensor | None = None,
    keys: Tensor | None = None,
    support: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """Random-mask Softmax_n attention without autograd, in one parallel region: query ``i``
    of ``q (..., L, E)`` keeps a uniform subset of ``count[i]`` of its first ``population[i]``
    keys, drawn on its stream of ``seed`` (the subsets of :func:`sample_indices` and
    :func:`sample_keep` for the whole ``(..., L)`` call), and returns
    ``Σ softmax_n(scale · ⟨q, k_j⟩ + bias_j)_j v_j`` over them, ``(..., L, Ev)``. With
    ``keys``, integer ``(..., S)``: each batch-head's allowed keys in increasing order (in
    ``[0, S)``, else a ValueError; entries past the allowed ones are not read), the draw is
    among the first ``population[i]`` of them instead. ``count``, ``population`` and ``bias``
    as in :func:`topk_attend`. The kept scores come from a block's product with all its keys by
    the BLAS (``product=True``, where one is found) or from one dot product each (``False``);
    ``None`` (default) takes the product where at least one key in :data:`_PRODUCT_SHARE` is
    kept. ``support`` as in :func:`topk_attend`."""
    q3, k3, v3, sizes, counts, populations, bias, strides, out = _attend_inputs(
        q, k, v, count, population, bias
    )
    allowed = _per_key("keys", keys, q, k)
    if allowed is not None:
        allowed = _check_index(allowed, k.shape[-2], "keys")
    kept = largest(counts)
    idx_out, w_out = _support_outputs(support, q, kept)
    _stream_rows(q.shape[:-1], seed, 0, None)
    heads, length, size, dim, vdim = sizes
    if product is None:
        product = kept * _PRODUCT_SHARE >= size
    gemm, local = _blas_pointers(q.dtype, product)
    threads = _threads(heads * length * kept * (dim + vdim))
    rows = min(length, _ATTEND_SCORES // max(1, size), -(-heads * length // (4 * threads)))
    _run(
        "hop_sample_attend", q.dtype, gemm, local, q3.data_ptr(), k3.data_ptr(), v3.data_ptr(),
        heads, length, size, dim, vdim, counts.data_ptr(), populations.data_ptr(),
        *strides, _pointer(bias), _pointer(allowed), seed, float(scale), float(n), max(1, rows),
        out.data_ptr(), idx_out, w_out, threads,
    )  # fmt: skip
    return out


def attend_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    support: tuple[Tensor, Tensor],
    count: Tensor,
    grad: Tensor,
    *,
    scale: float,
    product: bool | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients ``(dq, dk, dv)`` of :func:`topk_attend` or :func:`sample_attend` given the
    ``support = (idx, weights)`` they saved, the ``count`` they were given (``(L,)`` or
    ``(..., L)``) and the output gradient ``grad (..., L, Ev)``: per kept key
    ``dw_j = ⟨grad, v_j⟩``, ``ds_j = scale · w_j (dw_j - Σ_l w_l dw_l)``, ``dq = Σ_j ds_j k_j``,
    ``dk_j += ds_j q``, ``dv_j += w_j grad`` (the support itself, and so a bias, is piecewise
    constant), in one parallel region over the batch-heads: per kept key
    (``O(L · K · (E + Ev))``, ``product=False``) or, for a large share of kept keys, by BLAS
    products over blocks of queries with those matrices zero off the support (``True``, where a
    BLAS is found); ``None`` (default) takes the products where at least half the keys are
    kept."""
    q3, k3, v3, sizes = _attend_tensors(q, k, v)
    counts, count_stride = _per_query("count", count, q.shape[:-1])
    idx, weights = support
    _support_outputs(support, q, largest(counts))  # the kernel checks the indices' range
    if grad.shape != (*q.shape[:-1], v.shape[-1]):
        raise ValueError(
            f"grad must have the output's shape {(*q.shape[:-1], v.shape[-1])}, got "
            f"{tuple(grad.shape)}"
        )
    _float_dtype(q=q, grad=grad)
    g = grad.contiguous()
    dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
    heads, length, size, dim, vdim = sizes
    slots = idx.shape[-1]
    if product is None:
        product = slots * _BACKWARD_PRODUCT_SHARE >= size
    gemm, local = _blas_pointers(q.dtype, product)
    rows = max(1, min(length, _ATTEND_SCORES // max(1, size)))
    _run(
        "hop_attend_backward", q.dtype, gemm, local, q3.data_ptr(), k3.data_ptr(), v3.data_ptr(),
        idx.data_ptr(), weights.data_ptr(), counts.data_ptr(), count_stride, g.data_ptr(), heads,
        length, size, dim, vdim, slots, rows, float(scale), dq.data_ptr(), dk.data_ptr(),
        dv.data_ptr(), _threads(heads * length * slots * (dim + vdim)),
    )  # fmt: skip
    return dq, dk, dv


def gather_dot(a: Tensor, table: Tensor, idx: Tensor) -> Tensor:
    """``out[..., j] = ⟨a[...], table[idx[..., j]]⟩``: ``a (..., E)``, ``table (M, E)``,
    ``idx (..., K)`` (indices into the rows of ``table``) give ``(..., K)``. No autograd."""
    dtype = _float_dtype(a=_cpu_tensor("a", a, least_dims=1), table=table)
    dim = a.shape[-1]
    if table.dim() != 2 or table.shape[-1] != dim:
        raise ValueError(f"table must be (M, {dim}), got {tuple(table.shape)}")
    if _cpu_tensor("idx", idx, least_dims=1).shape[:-1] != a.shape[:-1]:
        raise ValueError(f"idx must be {tuple(a.shape[:-1])} + (K,), got {tuple(idx.shape)}")
    rows = a.reshape(-1, dim).contiguous()
    slots = idx.shape[-1]
    flat_idx = _check_index(idx, table.shape[0], "idx").view(rows.shape[0], slots)
    table = table.contiguous()
    out = a.new_empty(rows.shape[0], slots)
    _run(
        "hop_gather_dot",
        dtype,
        rows.data_ptr(),
        table.data_ptr(),
        flat_idx.data_ptr(),
        rows.shape[0],
        slots,
        dim,
        out.data_ptr(),
        _threads(rows.shape[0] * slots * dim),
    )
    return out.view(*idx.shape)


def scatter_outer(dst: Tensor, idx: Tensor, w: Tensor, src: Tensor) -> Tensor:
    """``dst[idx[..., j]] += w[..., j] · src[...]`` in place and returned: ``dst (M, E)``,
    ``idx``/``w (..., K)``, ``src (..., E)``, ``dst``, ``w`` and ``src`` of one dtype. Zero
    weights add nothing (not even ``0 · inf``). No autograd."""
    dtype = _float_dtype(dst=dst, w=w, src=src)
    if dst.dim() != 2 or not dst.is_contiguous():
        raise ValueError(f"dst must be a contiguous (M, E) tensor, got {tuple(dst.shape)}")
    dim = dst.shape[-1]
    _cpu_tensor("idx", idx, least_dims=1)
    if (
        src.dim() < 1
        or src.shape[-1] != dim
        or src.shape[:-1] != idx.shape[:-1]
        or w.shape != idx.shape
    ):
        raise ValueError(
            f"expected src (..., {dim}) and w, idx (..., K) over the same rows, got src "
            f"{tuple(src.shape)}, w {tuple(w.shape)}, idx {tuple(idx.shape)}"
        )
    rows = src.reshape(-1, dim).contiguous()
    slots = idx.shape[-1]
    flat_idx = _check_index(idx, dst.shape[0], "idx").view(rows.shape[0], slots)
    weights = w.reshape(rows.shape[0], slots).contiguous()
    _run(
        "hop_scatter_outer",
        dtype,
        weights.data_ptr(),
        flat_idx.data_ptr(),
        rows.data_ptr(),
        rows.shape[0],
        slots,
        dim,
        dst.data_ptr(),
        dst.shape[0],
        _threads(rows.shape[0] * slots * dim),
    )
    return dst


def rms_forward(x: Tensor, weight: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    """``(y, inv)``: ``y = x · inv · weight`` with ``inv = 1 / sqrt(mean(x²) + eps)`` over the
    last dimension of ``x (..., n)`` (``inv`` is ``(...,)``); ``weight (n,)`` (of ``x``'s dtype)
    or ``None``; ``eps >= 0``. No autograd (see :class:`hopfield.nn.rms_norm.RMSNorm`)."""
    dtype = _float_dtype(x=_cpu_tensor("x", x, least_dims=1), weight=weight)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < math.inf:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    width = x.shape[-1]
    w = _check_weight(weight, width)
    rows = x.reshape(-1, width).contiguous()
    y = torch.empty_like(rows)
    inv = x.new_empty(rows.shape[0])
    _run(
        "hop_rms_forward",
        dtype,
        rows.data_ptr(),
        None if w is None else w.data_ptr(),
        rows.shape[0],
        width,
        eps,
        y.data_ptr(),
        inv.data_ptr(),
        _threads(rows.numel()),
    )
    return y.view(x.shape), inv.view(x.shape[:-1])


#: Rows per partial sum of :func:`rms_backward`'s weight gradient: the sums of a block stay in
#: cache while its rows pass, and the blocks' sums are few to add.
RMS_ROW_BLOCK = 64


def rms_backward(
    grad: Tensor, x: Tensor, weight: Tensor | None, inv: Tensor, *, weight_grad: bool
) -> tuple[Tensor, Tensor | None]:
    """``(dx, dweight)`` of :func:`rms_forward` for the output gradient ``grad`` (``x``'s shape)
    and its ``inv`` (``x.shape[:-1]``); ``dweight`` only with ``weight_grad``. No autograd."""
    dtype = _float_dtype(x=_cpu_tensor("x", x, least_dims=1), grad=grad, weight=weight, inv=inv)
    if grad.shape != x.shape or inv.shape != x.shape[:-1]:
        raise ValueError(
            f"expected grad {tuple(x.shape)} and inv {tuple(x.shape[:-1])} (x's shape without its "
            f"last dimension), got grad {tuple(grad.shape)} and inv {tuple(inv.shape)}"
        )
    width = x.shape[-1]
    w = _check_weight(weight, width)
    rows = x.reshape(-1, width).contiguous()
    g = grad.reshape(-1, width).contiguous()
    dx = torch.empty_like(rows)
    dw = x.new_empty(width) if weight_grad else None
    # the weight gradient's per-block sums, made in the pass that makes dx
    partial = x.new_empty(-(-rows.shape[0] // RMS_ROW_BLOCK), width) if weight_grad else None
    _run(
        "hop_rms_backward",
        dtype,
        g.data_ptr(),
        rows.data_ptr(),
        None if w is None else w.data_ptr(),
        inv.contiguous().data_ptr(),
        rows.shape[0],
        width,
        RMS_ROW_BLOCK,
        dx.data_ptr(),
        None if dw is None else dw.data_ptr(),
        None if partial is None else partial.data_ptr(),
        _threads(rows.numel()),
    )
    return dx.view(x.shape), dw


def floyd_sample(count: Tensor, n: Tensor, slots: int, rand: Tensor) -> Tensor:
    """:func:`hopfield.functional.efficient.floyd_sample` (the same subsets from the same
    uniforms ``rand (R, slots)``, each in ``[0, 1]``) in ``O(R · slots)`` instead of
    ``O(R · slots²)``. ``count``/``n`` ``(R,)`` integers with ``0 <= count <= min(n, slots)``;
    returns ``(R, slots)`` int64."""
    n = _integers("n", n)
    count = _integers("count", count)
    rows = n.shape[0] if n.dim() == 1 else -1
    _count("slots", slots, 0)
    if rows < 0 or count.shape != (rows,) or _cpu_tensor("rand", rand).shape != (rows, slots):
        raise ValueError(
            f"expected n (R,), count (R,) and rand (R, {slots}), got n {tuple(n.shape)}, count "
            f"{tuple(count.shape)}, rand {tuple(rand.shape)}"
        )
    if rows and (bool((count < 0).any()) or bool((count > n).any()) or int(count.max()) > slots):
        raise ValueError("count must lie in [0, min(n, slots)] in every row")
    if not rand.is_floating_point():
        raise TypeError(f"rand must hold floating-point uniforms, got {rand.dtype}")
    uniforms = rand.to(torch.float64).contiguous()
    low, high = torch.aminmax(uniforms) if uniforms.numel() else (0.0, 0.0)
    if not (low >= 0 and high <= 1):  # one pass (NaN fails both)
        raise ValueError("rand must hold uniforms in [0, 1] (no NaN)")
    out = torch.empty(rows, slots, dtype=torch.int64)
    _run(
        "hop_floyd",
        None,
        uniforms.data_ptr(),
        count.data_ptr(),
        n.data_ptr(),
        rows,
        slots,
        int(n.max()) if rows else 0,
        out.data_ptr(),
        _threads(rows * slots),
    )
    return out
