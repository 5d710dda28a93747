"""CPU kernels for the gathered structures (Top-K and random-mask attention), compiled on first use.

PyTorch has no fused operator for "the ``k`` largest of each row" that is cheap for wide rows
(:meth:`torch.Tensor.topk` costs about as much as the score product it ranks), nor for products of
queries with per-query gathered keys (``index_select`` then ``mul`` then ``sum`` moves every
gathered key through memory three times). ``native_kernels.c`` (next to this file) does both in
one pass over the data:

- :func:`topk` and :class:`RunningTopK`: the ``k`` largest entries of each row and their
  columns, the latter over columns that arrive in chunks;
- :func:`gather_dot`: ``out[r, j] = ⟨a[r], table[idx[r, j]]⟩``;
- :func:`scatter_outer`: ``dst[idx[r, j]] += w[r, j] · src[r]`` (the gradient of
  :func:`gather_dot` with respect to its table).

The C file has no PyTorch headers: the system C compiler (``$CC``, else ``cc``) builds it in about
a second into ``$HOPFIELD_CACHE`` (default ``~/.cache/hopfield``)``/native/<hash>/``, keyed by the
source, the flags, the compiler and the machine, so processes sharing a home directory on
different machines never load each other's build; several processes building at once each write a
private file and rename it into place. The library is loaded with :mod:`ctypes` and the kernels
run on the data pointers of contiguous CPU float32/float64 tensors, over
:func:`torch.get_num_threads` threads.

:func:`available` says whether the kernels can be used; it is ``False`` with
``HOPFIELD_NATIVE=0`` in the environment, without a C compiler (one warning says why) and for
tensors that are not contiguous-able CPU float32/float64 (e.g. on GPUs, where PyTorch's own
kernels are fast and the callers keep them). Callers fall back to their PyTorch path then; both
paths are tested against the same float64 references.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

__all__ = [
    "RunningTopK",
    "available",
    "enabled",
    "floyd_sample",
    "gather_dot",
    "rms_backward",
    "rms_forward",
    "scatter_outer",
    "topk",
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


def enabled() -> bool:
    """Whether the environment allows the native kernels (``HOPFIELD_NATIVE`` is not ``0``)."""
    return os.environ.get("HOPFIELD_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


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


def _compiler() -> str | None:
    name = os.environ.get("CC", "cc")
    return shutil.which(name)


def _compiler_version(compiler: str) -> str:
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout


def _build(compiler: str, flags: list[str]) -> Path:
    """Compile the kernels with ``flags`` (or find the cached build); returns the library path."""
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(
        source
        + " ".join(flags).encode()
        + _compiler_version(compiler).encode()
        + _machine_key().encode()
    ).hexdigest()[:20]
    folder = _cache_root() / "native" / key
    library = folder / "hopfield_kernels.so"
    if library.exists():
        return library
    folder.mkdir(parents=True, exist_ok=True)
    handle, private = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(handle)
    try:
        command = [compiler, *flags, "-o", private, str(_SOURCE), "-lm"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise OSError(f"{' '.join(command)} failed:\n{done.stderr.strip()}")
        os.replace(private, library)
    finally:
        if os.path.exists(private):
            os.remove(private)
    return library


def _declare(library: ctypes.CDLL) -> ctypes.CDLL:
    """Argument types of the exported functions (pointers, int64 sizes, int threads)."""
    signatures = {
        "hop_topk_push": [
            *(_PTR, _INT64, _INT64, _INT64, _INT64),
            *(_PTR, _PTR, _PTR, _PTR, _PTR, _INT64, ctypes.c_int),
        ],
        "hop_topk_finish": [_INT64, _PTR, _PTR, _PTR, _INT64, _PTR, _PTR, ctypes.c_int],
        "hop_topk": [_PTR, _INT64, _INT64, _INT64, _INT64, _PTR, _PTR, ctypes.c_int],
        "hop_rms_backward": [_PTR, _PTR, _PTR, _PTR, _INT64, _INT64, _PTR, _PTR, ctypes.c_int],
        "hop_gather_dot": [_PTR, _PTR, _PTR, _INT64, _INT64, _INT64, _PTR, ctypes.c_int],
        "hop_scatter_outer": [_PTR, _PTR, _PTR, _INT64, _INT64, _INT64, _PTR, _INT64, ctypes.c_int],
    }
    for name, arguments in signatures.items():
        for suffix in _DTYPES.values():
            function = getattr(library, f"{name}_{suffix}")
            function.argtypes = arguments
            function.restype = None
    library.hop_floyd.argtypes = [_PTR, _PTR, _PTR, _INT64, _INT64, _INT64, _PTR, ctypes.c_int]
    library.hop_floyd.restype = None
    for suffix, real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
        function = getattr(library, f"hop_rms_forward_{suffix}")
        function.argtypes = [_PTR, _PTR, _INT64, _INT64, real, _PTR, _PTR, ctypes.c_int]
        function.restype = None
    return library


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    """The loaded kernels, or ``None`` (with one warning) when they cannot be built."""
    compiler = _compiler()
    if compiler is None:
        warnings.warn(
            "hopfield: no C compiler found (set CC); Top-K and random-mask attention and the "
            "Hyper-SET RMS norms use their slower PyTorch path",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    errors = []
    for flags in _FLAG_SETS:
        try:
            return _declare(ctypes.CDLL(str(_build(compiler, flags))))
        except (OSError, subprocess.SubprocessError) as error:
            errors.append(str(error))
    warnings.warn(
        "hopfield: the native kernels did not build; Top-K and random-mask attention and the "
        "Hyper-SET RMS norms use their slower PyTorch path. " + "\n".join(errors),
        RuntimeWarning,
        stacklevel=3,
    )
    return None


def usable_on(device: torch.device) -> bool:
    """Whether the native kernels can run on ``device``: enabled, the CPU, and built (for the
    kernels on index tensors only, e.g. :func:`floyd_sample`)."""
    return enabled() and device.type == "cpu" and _library() is not None


def available(*tensors: Tensor) -> bool:
    """Whether the native kernels can run on ``tensors``: :func:`usable_on` their device, and
    every tensor a CPU float32/float64 tensor of one dtype (integer index tensors aside)."""
    floats = [t for t in tensors if t.is_floating_point()]
    if not floats:
        return False
    dtype = floats[0].dtype
    if dtype not in _DTYPES or any(t.dtype != dtype for t in floats):
        return False
    if any(t.device.type != "cpu" for t in tensors):
        return False
    return usable_on(floats[0].device)


def _function(name: str, dtype: torch.dtype | None = None) -> Callable[..., None]:
    """The exported kernel ``name`` (its ``dtype`` version for the floating-point ones)."""
    library = _library()
    if library is None:  # callers check available() first
        raise RuntimeError("the hopfield native kernels are not available")
    suffix = "" if dtype is None else f"_{_DTYPES[dtype]}"
    function: Callable[..., None] = getattr(library, name + suffix)
    return function


def _threads() -> int:
    return max(1, torch.get_num_threads())


def _check_index(idx: Tensor, size: int, name: str) -> Tensor:
    """``idx`` as contiguous int64, every entry in ``[0, size)`` (else a ValueError: the kernels
    read memory at those offsets)."""
    idx = idx.to(torch.int64).contiguous()
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= size):
        raise ValueError(f"{name} must hold indices in [0, {size}), got [{idx.min()}, {idx.max()}]")
    return idx


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
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
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
        if not 0 <= rows <= self.capacity:
            raise ValueError(f"rows must lie in [0, {self.capacity}], got {rows}")
        self.rows, self.columns_seen = rows, 0
        self._values, self._columns = self._all_values[:rows], self._all_columns[:rows]
        self._count, self._threshold = self._all_count[:rows], self._all_threshold[:rows]
        self._mode = self._all_mode[:rows]
        self._count.zero_()
        self._mode.zero_()

    def push(self, x: Tensor, offset: int | None = None) -> None:
        """Feed the next columns ``x (..., W)`` (``rows`` rows in all, of the state's dtype),
        numbered from ``offset`` (default: right after the columns pushed so far)."""
        width = x.shape[-1]
        chunk = x.reshape(-1, width)
        if chunk.shape[0] != self.rows or x.dtype != self.dtype:
            raise ValueError(
                f"x must hold {self.rows} rows of {self.dtype}, got {chunk.shape[0]} of {x.dtype}"
            )
        if width == 0:
            return
        if chunk.stride(-1) != 1:
            chunk = chunk.contiguous()
        start = self.columns_seen if offset is None else offset
        _function("hop_topk_push", self.dtype)(
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
            _threads(),
        )
        self.columns_seen = max(self.columns_seen, start + width)

    def result(self) -> tuple[Tensor, Tensor]:
        """``(values, columns)``, each ``(rows, k)``, unsorted; needs at least ``k`` columns
        pushed. The state is spent (its buffers are reordered)."""
        if self.columns_seen < self.k:
            raise ValueError(f"only {self.columns_seen} columns were pushed, fewer than k={self.k}")
        values = torch.empty(self.rows, self.k, dtype=self.dtype)
        columns = torch.empty(self.rows, self.k, dtype=torch.int64)
        _function("hop_topk_finish", self.dtype)(
            self.rows,
            self._values.data_ptr(),
            self._columns.data_ptr(),
            self._count.data_ptr(),
            self.k,
            values.data_ptr(),
            columns.data_ptr(),
            _threads(),
        )
        return values, columns


def topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` largest entries of each row of ``x (..., W)`` and their columns ``(..., k)``
    (int64), unsorted, as ``x.topk(k, sorted=False)`` (:class:`RunningTopK` over one chunk, with
    one buffer per thread instead of per row).
    Needs ``1 <= k <= W``."""
    width = x.shape[-1]
    if not 1 <= k <= width:
        raise ValueError(f"k must lie in [1, {width}] (the row width), got {k}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"x must be float32 or float64, got {x.dtype}")
    rows = x.reshape(-1, width)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    values = x.new_empty(rows.shape[0], k)
    columns = torch.empty(rows.shape[0], k, dtype=torch.int64)
    _function("hop_topk", x.dtype)(
        rows.data_ptr(),
        rows.shape[0],
        width,
        rows.stride(0),
        k,
        values.data_ptr(),
        columns.data_ptr(),
        _threads(),
    )
    return values.view(*x.shape[:-1], k), columns.view(*x.shape[:-1], k)


def gather_dot(a: Tensor, table: Tensor, idx: Tensor) -> Tensor:
    """``out[..., j] = ⟨a[...], table[idx[..., j]]⟩``: ``a (..., E)``, ``table (M, E)``,
    ``idx (..., K)`` (indices into the rows of ``table``) give ``(..., K)``. No autograd."""
    dim = a.shape[-1]
    if table.dim() != 2 or table.shape[-1] != dim:
        raise ValueError(f"table must be (M, {dim}), got {tuple(table.shape)}")
    if idx.shape[:-1] != a.shape[:-1]:
        raise ValueError(f"idx must be {tuple(a.shape[:-1])} + (K,), got {tuple(idx.shape)}")
    slots = idx.shape[-1]
    flat_idx = _check_index(idx, table.shape[0], "idx").view(-1, slots)
    rows = a.reshape(-1, dim).contiguous()
    table = table.contiguous()
    out = a.new_empty(rows.shape[0], slots)
    _function("hop_gather_dot", a.dtype)(
        rows.data_ptr(),
        table.data_ptr(),
        flat_idx.data_ptr(),
        rows.shape[0],
        slots,
        dim,
        out.data_ptr(),
        _threads(),
    )
    return out.view(*idx.shape)


def scatter_outer(dst: Tensor, idx: Tensor, w: Tensor, src: Tensor) -> Tensor:
    """``dst[idx[..., j]] += w[..., j] · src[...]`` in place and returned: ``dst (M, E)``,
    ``idx``/``w (..., K)``, ``src (..., E)``. Zero weights add nothing (not even ``0 · inf``).
    No autograd."""
    dim = dst.shape[-1]
    if dst.dim() != 2 or not dst.is_contiguous():
        raise ValueError(f"dst must be a contiguous (M, E) tensor, got {tuple(dst.shape)}")
    if src.shape[-1] != dim or src.shape[:-1] != idx.shape[:-1] or w.shape != idx.shape:
        raise ValueError(
            f"expected src (..., {dim}) and w, idx (..., K) over the same rows, got src "
            f"{tuple(src.shape)}, w {tuple(w.shape)}, idx {tuple(idx.shape)}"
        )
    slots = idx.shape[-1]
    flat_idx = _check_index(idx, dst.shape[0], "idx").view(-1, slots)
    weights = w.reshape(-1, slots).contiguous()
    rows = src.reshape(-1, dim).contiguous()
    _function("hop_scatter_outer", dst.dtype)(
        weights.data_ptr(),
        flat_idx.data_ptr(),
        rows.data_ptr(),
        rows.shape[0],
        slots,
        dim,
        dst.data_ptr(),
        dst.shape[0],
        _threads(),
    )
    return dst


def rms_forward(x: Tensor, weight: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    """``(y, inv)``: ``y = x · inv · weight`` with ``inv = 1 / sqrt(mean(x²) + eps)`` over the
    last dimension of ``x (..., n)`` (``inv`` is ``(...,)``); ``weight (n,)`` or ``None``.
    No autograd (see :class:`hopfield.nn.rms_norm.RMSNorm`)."""
    width = x.shape[-1]
    rows = x.reshape(-1, width).contiguous()
    w = None if weight is None else weight.contiguous()
    y = torch.empty_like(rows)
    inv = x.new_empty(rows.shape[0])
    _function("hop_rms_forward", x.dtype)(
        rows.data_ptr(),
        None if w is None else w.data_ptr(),
        rows.shape[0],
        width,
        eps,
        y.data_ptr(),
        inv.data_ptr(),
        _threads(),
    )
    return y.view(x.shape), inv.view(x.shape[:-1])


def rms_backward(
    grad: Tensor, x: Tensor, weight: Tensor | None, inv: Tensor, *, weight_grad: bool
) -> tuple[Tensor, Tensor | None]:
    """``(dx, dweight)`` of :func:`rms_forward` for the output gradient ``grad``
    (``dweight`` only with ``weight_grad``). No autograd."""
    width = x.shape[-1]
    rows = x.reshape(-1, width).contiguous()
    g = grad.reshape(-1, width).contiguous()
    w = None if weight is None else weight.contiguous()
    dx = torch.empty_like(rows)
    dw = x.new_empty(width) if weight_grad else None
    _function("hop_rms_backward", x.dtype)(
        g.data_ptr(),
        rows.data_ptr(),
        None if w is None else w.data_ptr(),
        inv.contiguous().data_ptr(),
        rows.shape[0],
        width,
        dx.data_ptr(),
        None if dw is None else dw.data_ptr(),
        _threads(),
    )
    return dx.view(x.shape), dw


def floyd_sample(count: Tensor, n: Tensor, slots: int, rand: Tensor) -> Tensor:
    """:func:`hopfield.functional.efficient.floyd_sample` (the same subsets from the same
    uniforms ``rand (R, slots)``) in ``O(R · slots)`` instead of ``O(R · slots²)``.
    ``count``/``n`` ``(R,)`` int64 with ``0 <= count <= n``; returns ``(R, slots)`` int64."""
    rows = n.shape[0]
    if count.shape != (rows,) or rand.shape != (rows, slots):
        raise ValueError(f"expected count ({rows},) and rand ({rows}, {slots})")
    count = count.to(torch.int64).contiguous()
    n = n.to(torch.int64).contiguous()
    if rows and (bool((count < 0).any()) or bool((count > n).any()) or int(count.max()) > slots):
        raise ValueError("count must lie in [0, min(n, slots)] in every row")
    uniforms = rand.to(torch.float64).contiguous()
    out = torch.empty(rows, slots, dtype=torch.int64)
    _function("hop_floyd")(
        uniforms.data_ptr(),
        count.data_ptr(),
        n.data_ptr(),
        rows,
        slots,
        int(n.max()) if rows else 0,
        out.data_ptr(),
        _threads(),
    )
    return out
