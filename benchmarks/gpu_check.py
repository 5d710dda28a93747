"""The GPU check (issue 32): the library's CUDA tests, its speed against PyTorch and peer kernels,
and a bf16 training step, in one run that writes one JSON record.

On one GPU (H100/H200; torch >= 2.4, written against 2.11), from the repository root::

    python3 benchmarks/gpu_check.py --out results/gpu/record-<date>.json --budget-s 480

On the CPU, ``--smoke`` runs every section at tiny sizes in a few seconds (CI does), and
``--render docs/gpu.md`` writes that page from the newest GPU record in ``results/gpu/``.

Sections, in order (each one's failure is recorded with its traceback and the run goes on; a
section or row left when its share of ``--budget-s`` is spent is recorded as skipped, with why):

``tests``
    ``pytest -m cuda`` (the CUDA half of ``tests/test_devices.py`` and any other test on the
    ``device`` fixture) in a subprocess: passed, failed, error and skipped counts.
``attention``
    Softmax_1 and sink attention (``SoftmaxN(e)``: one sink logit of 1) ÷ SDPA (flash), bf16,
    ``B 1, H 8, E 64``, ``N`` = 1k … 16k, forward and forward + backward.
``efficient``
    Top-K(64), RandomMask(64), Window(128), Linear and RandomFeatures attention ÷ SDPA (flash).
``separation``
    Sparsemax, Entmax(1.5) and learnable-α Entmax ÷ the ``entmax`` package (fp32, fwd+bwd), and
    ÷ AdaSplash (``triton_entmax``, ``adasplash``) where its wheel travelled.
``layer``
    ``Hopfield(512, 8)`` ÷ ``nn.MultiheadAttention`` (B 4, N 1024, bf16).
``training``
    Tokens/s of a bf16-autocast AdamW step of a small OPT (4 layers, d 512) for ``sdpa`` and
    every ``hopfield_*`` attention variant, steps timed in turn.
``outliers``
    ``hopfield run outlier-benchmark --preset gpu`` with the time left, where that experiment and
    preset are registered (its results embedded in the record).

Times: every pair of calls ours/peer is timed in turn after warm-up calls (each call ends with
``torch.cuda.synchronize()``), and a row reports the median of the per-pair ratios with their
quartiles (:func:`_timing.interleaved_ratios`). The record is rewritten after every section, so
a run stopped from outside keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's library, installed or not
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from _timing import interleaved_ratios  # noqa: E402

SCHEMA = 1
RECORDS = ROOT / "results" / "gpu"
SINK_LOGIT = 1.0  # sink attention: exp(z) / (exp(SINK_LOGIT) + Σ exp z), i.e. SoftmaxN(e)
OUTLIER_EXPERIMENT, OUTLIER_PRESET = "outlier-benchmark", "gpu"
RESERVE_S = 5.0  # kept back at the end of the budget for the last write
#: Each section's share of the budget (the outliers section takes whatever is left).
SHARES = {
    "tests": 0.22,
    "attention": 0.13,
    "efficient": 0.15,
    "separation": 0.08,
    "layer": 0.04,
    "training": 0.14,
}


@dataclass(frozen=True)
class Sizes:
    """The sizes of one mode (the GPU run, or the CPU smoke run)."""

    attention: tuple[int, ...]  # N of the attention sweep
    efficient: tuple[int, ...]  # N of the efficient-structure sweep
    heads: int
    head_dim: int
    scores: tuple[tuple[int, int], ...]  # (rows, keys) of the separation rows
    adasplash: tuple[int, ...]  # N of the AdaSplash attention rows
    layer: tuple[int, int, int, int]  # B, N, d, heads of the layer rows
    opt: dict[str, Any]  # the small OPT of the training step
    tokens: tuple[int, int]  # batch, length of the training step
    repeats: int  # timed pairs per row (at most)
    rounds: int  # timed training steps per variant (after two warm-up steps)
    variants: tuple[str, ...] | None  # attention variants of the training step (None: all)
    tests: str  # what pytest collects


GPU_SIZES = Sizes(
    attention=(1024, 2048, 4096, 8192, 16384),
    efficient=(1024, 4096, 16384),
    heads=8,
    head_dim=64,
    scores=((8192, 1024), (32768, 1024)),
    adasplash=(1024, 4096, 16384),
    layer=(4, 1024, 512, 8),
    opt=dict(
        num_hidden_layers=4,
        hidden_size=512,
        num_attention_heads=8,
        ffn_dim=2048,
        vocab_size=16384,
        word_embed_proj_dim=512,
        max_position_embeddings=1024,
    ),
    tokens=(8, 1024),
    repeats=10,
    rounds=10,
    variants=None,
    tests="tests",
)
SMOKE_SIZES = Sizes(
    attention=(64, 128),
    efficient=(128,),
    heads=2,
    head_dim=16,
    scores=((64, 32),),
    adasplash=(128,),
    layer=(2, 32, 32, 4),
    opt=dict(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        ffn_dim=64,
        vocab_size=97,
        word_embed_proj_dim=32,
        max_position_embeddings=32,
    ),
    tokens=(2, 16),
    repeats=2,
    rounds=1,
    variants=("softmax1", "gated_clipped_softmax1"),  # Softmax_1, clipping and gates
    tests="tests/test_devices.py",  # the whole suite takes half a minute only to collect
)


class Skipped(Exception):
    """A section (or row) that did not run, and why."""


@dataclass
class Run:
    """The state of one check: mode, device, sizes and the clock."""

    smoke: bool
    device: torch.device
    sizes: Sizes
    deadline: float  # time.perf_counter() at which the budget is spent

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def synced(self, fn: Callable[[], object]) -> Callable[[], object]:
        """``fn`` followed by a device synchronisation (so a wall-clock time is the GPU's)."""

        def call() -> object:
            result = fn()
            self.sync()
            return result

        return call

    def free(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


# --- timing rows ------------------------------------------------------------------------------

Case = Callable[[], tuple[Callable[[], object], Callable[[], object]]]


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def _repeats(run: Run, ours: Callable[[], object], peer: Callable[[], object]) -> int:
    """Timed pairs for a row: about two seconds of pairs, at least 3, at most ``sizes.repeats``
    (the warm-up pair measures one)."""
    start = time.perf_counter()
    ours()
    peer()
    pair = max(time.perf_counter() - start, 1e-6)
    return max(min(run.sizes.repeats, int(2.0 / pair)), min(3, run.sizes.repeats))


def timed_rows(
    run: Run, cases: list[tuple[dict[str, Any], Case]], until: float
) -> list[dict[str, Any]]:
    """One row per case: ``{**fields, ours_ms, peer_ms, ratio, spread, pairs}``, or ``{**fields,
    error}`` for a case that raised (e.g. out of memory), or ``{**fields, skipped}`` for the cases
    left when ``until`` (a ``perf_counter`` time) has passed."""
    rows: list[dict[str, Any]] = []
    for fields, case in cases:
        if time.perf_counter() > until:
            rows.append({**fields, "skipped": "the section's share of the time budget was spent"})
            continue
        try:
            ours, peer = (run.synced(fn) for fn in case())
            pairs = _repeats(run, ours, peer)
            ratio, (q25, q75), ours_s, peer_s = interleaved_ratios(ours, peer, pairs, warmup=1)
            rows.append(
                {
                    **fields,
                    "ours_ms": 1e3 * ours_s,
                    "peer_ms": 1e3 * peer_s,
                    "ratio": ratio,
                    "spread": [q25, q75],
                    "pairs": pairs,
                }
            )
        except Exception as error:  # one row's failure (out of memory, a kernel error) is data
            rows.append({**fields, "error": _first_line(error)})
        finally:
            run.free()
    return rows


def _pass(
    fn: Callable[[], Tensor], inputs: tuple[Tensor, ...], backward: bool
) -> Callable[[], object]:
    """One forward pass of ``fn`` without gradients, or a forward and a backward pass to
    ``inputs`` (a fixed upstream gradient, no accumulation into ``.grad``)."""
    if not backward:

        def forward() -> object:
            with torch.no_grad():
                return fn()

        return forward

    def both() -> object:
        out = fn()
        return torch.autograd.grad(out, inputs, torch.ones_like(out))

    return both


def _qkv(run: Run, n: int, dtype: torch.dtype, grad: bool, seed: int = 0) -> tuple[Tensor, ...]:
    g = torch.Generator(device=run.device).manual_seed(seed + n)
    shape = (1, run.sizes.heads, n, run.sizes.head_dim)
    return tuple(
        torch.randn(shape, generator=g, device=run.device, dtype=dtype).requires_grad_(grad)
        for _ in range(3)
    )


def _sdpa_context(run: Run) -> AbstractContextManager[object]:
    """On CUDA, SDPA restricted to the flash, memory-efficient and math kernels (flash first, so
    the peer is flash wherever it applies, whatever newer defaults such as cuDNN say)."""
    if run.device.type != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(
        [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    )


def _flash_applies(run: Run, dtype: torch.dtype) -> bool:
    """Whether SDPA's flash kernel itself serves the peer's inputs on this device."""
    if run.device.type != "cuda":
        return False
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _qkv(run, 256, dtype, grad=False)
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            F.scaled_dot_product_attention(q, k, v)
    except RuntimeError:
        return False
    return True


def _attention_case(
    run: Run, structure_or_separation: Callable[[], dict[str, Any]], n: int, backward: bool
) -> Case:
    def case() -> tuple[Callable[[], object], Callable[[], object]]:
        from hopfield.functional import associate

        q, k, v = _qkv(run, n, torch.bfloat16, backward)
        options = structure_or_separation()
        if "structure" in options:
            options["structure"] = options["structure"].to(run.device)

        def ours() -> Tensor:
            out = associate(q, k, v, **options)
            assert isinstance(out, Tensor)
            return out

        def peer() -> Tensor:
            return F.scaled_dot_product_attention(q, k, v)

        return _pass(ours, (q, k, v), backward), _pass(peer, (q, k, v), backward)

    return case


def _sweep(
    run: Run, models: dict[str, Callable[[], dict[str, Any]]], sizes: tuple[int, ...], until: float
) -> dict[str, Any]:
    cases: list[tuple[dict[str, Any], Case]] = [
        (
            {
                "row": f"{name} N={n} {'fwd+bwd' if backward else 'fwd'}",
                "model": name,
                "n": n,
                "backward": backward,
            },
            _attention_case(run, make, n, backward),
        )
        for name, make in models.items()
        for n in sizes
        for backward in (False, True)
    ]
    shape = f"B 1, H {run.sizes.heads}, E {run.sizes.head_dim}, bf16"
    with _sdpa_context(run):
        rows = timed_rows(run, cases, until)
    return {
        "shape": shape,
        "peer": "SDPA (flash)" if _flash_applies(run, torch.bfloat16) else "SDPA (default kernel)",
        "rows": rows,
    }


# --- sections ---------------------------------------------------------------------------------


def _child_env() -> dict[str, str]:
    """The environment of a subprocess: this checkout's library first on its path."""
    path = [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def section_tests(run: Run, until: float) -> dict[str, Any]:
    """``pytest -m cuda`` in a subprocess; counts from its JUnit XML report."""
    if importlib.util.find_spec("pytest") is None:
        raise Skipped("pytest is not installed")
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "junit.xml"
        # a module that cannot be imported is counted as an error, and the others still run
        options = ["-m", "cuda", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors"]
        command = [
            sys.executable,
            "-m",
            "pytest",
            *options,
            f"--junitxml={report}",
            run.sizes.tests,
        ]
        timeout = max(until - time.perf_counter(), 1.0)
        try:
            done = subprocess.run(
                command, cwd=ROOT, env=_child_env(), capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as stop:
            raise Skipped(f"pytest did not finish within the section's {timeout:.0f} s") from stop
        if not report.is_file():
            raise RuntimeError(
                f"pytest wrote no report (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
            )
        counts = junit_counts(report.read_text())
    return {
        "command": " ".join(["python -m pytest", *options, run.sizes.tests]),
        "returncode": done.returncode,
        **counts,
        "output_tail": done.stdout[-1500:],
    }


def junit_counts(xml: str) -> dict[str, Any]:
    """``passed, failed, errors, skipped, total`` and the failing tests (at most 40, with the first
    line of their message) of a pytest JUnit XML report."""
    root = ET.fromstring(xml)
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    totals = {
        key: sum(int(s.get(key, 0)) for s in suites)
        for key in ("tests", "failures", "errors", "skipped")
    }
    failing = []
    for case in root.iter("testcase"):
        for outcome in ("failure", "error"):
            found = case.find(outcome)
            if found is not None:
                message = (found.get("message") or "").strip().splitlines()
                failing.append(
                    {
                        "test": f"{case.get('classname')}::{case.get('name')}",
                        "outcome": outcome,
                        "message": (message[0] if message else "")[:300],
                    }
                )
    return {
        "passed": totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"],
        "failed": totals["failures"],
        "errors": totals["errors"],
        "skipped": totals["skipped"],
        "total": totals["tests"],
        "failing": failing[:40],
    }


def section_attention(run: Run, until: float) -> dict[str, Any]:
    from hopfield.functional import SoftmaxN

    models: dict[str, Callable[[], dict[str, Any]]] = {
        "Softmax_1": lambda: {"separation": SoftmaxN(1.0)},
        f"sink (logit {SINK_LOGIT:g})": lambda: {"separation": SoftmaxN(math.exp(SINK_LOGIT))},
    }
    return _sweep(run, models, run.sizes.attention, until)


def section_efficient(run: Run, until: float) -> dict[str, Any]:
    from hopfield.functional import Linear, RandomFeatures, RandomMask, TopK, Window

    models: dict[str, Callable[[], dict[str, Any]]] = {
        "TopK(64)": lambda: {"structure": TopK(64)},
        "RandomMask(64)": lambda: {"structure": RandomMask(64, seed=0)},
        "Window(128)": lambda: {"structure": Window(128)},
        "Linear": lambda: {"structure": Linear()},
        "RandomFeatures": lambda: {"structure": RandomFeatures(seed=0)},
    }
    return _sweep(run, models, run.sizes.efficient, until)


def _separation_case(
    run: Run, ours: nn.Module, peer: Callable[[Tensor], Tensor], rows: int, keys: int
) -> Case:
    def case() -> tuple[Callable[[], object], Callable[[], object]]:
        g = torch.Generator(device=run.device).manual_seed(rows + keys)
        scores = torch.randn(rows, keys, generator=g, device=run.device).requires_grad_(True)
        upstream = torch.randn(rows, keys, generator=g, device=run.device)
        module = ours.to(run.device)

        def call(fn: Callable[[Tensor], Tensor]) -> Callable[[], object]:
            def both() -> object:
                scores.grad = None
                fn(scores).backward(upstream)
                return scores.grad

            return both

        return call(module), call(peer)

    return case


def _bisect_peer(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """``entmax.entmax_bisect`` with ``module``'s α tensor (its graph to the logit included) and
    iteration count."""
    import entmax

    def peer(x: Tensor) -> Tensor:
        out: Tensor = entmax.entmax_bisect(x, alpha=module.alpha, dim=-1, n_iter=module.iterations)
        return out

    return peer


def _entmax_cases(run: Run) -> list[tuple[dict[str, Any], Case]]:
    import entmax

    from hopfield.functional import Entmax, Sparsemax

    cases: list[tuple[dict[str, Any], Case]] = []
    for rows, keys in run.sizes.scores:
        learnable = Entmax(1.3, learnable=True).to(run.device)
        pairs: list[tuple[str, nn.Module, Callable[[Tensor], Tensor], str]] = [
            ("Sparsemax", Sparsemax(), lambda x: entmax.sparsemax(x, dim=-1), "entmax.sparsemax"),
            ("Entmax(1.5)", Entmax(1.5), lambda x: entmax.entmax15(x, dim=-1), "entmax.entmax15"),
            ("Entmax(learnable)", learnable, _bisect_peer(learnable), "entmax.entmax_bisect"),
        ]
        for name, module, peer, peer_name in pairs:
            fields = {"row": f"{name} {rows}x{keys} fwd+bwd", "model": name, "peer": peer_name}
            cases.append((fields, _separation_case(run, module, peer, rows, keys)))
    return cases


def _adasplash_cases(run: Run) -> list[tuple[dict[str, Any], Case]]:
    import adasplash

    from hopfield.functional import Entmax, associate

    cases: list[tuple[dict[str, Any], Case]] = []
    for rows, keys in run.sizes.scores:
        fields = {
            "row": f"Entmax(1.5) {rows}x{keys} fwd+bwd",
            "model": "Entmax(1.5)",
            "peer": "adasplash.triton_entmax",
        }
        peer = lambda x: adasplash.triton_entmax(x, alpha=1.5)  # noqa: E731
        cases.append((fields, _separation_case(run, Entmax(1.5), peer, rows, keys)))

    def attention(n: int) -> Case:
        def case() -> tuple[Callable[[], object], Callable[[], object]]:
            q, k, v = _qkv(run, n, torch.bfloat16, grad=True)
            separation = Entmax(1.5)

            def ours() -> Tensor:
                out = associate(q, k, v, separation=separation)
                assert isinstance(out, Tensor)
                return out

            return (
                _pass(ours, (q, k, v), True),
                _pass(lambda: adasplash.adasplash(q, k, v, alpha=1.5), (q, k, v), True),
            )

        return case

    for n in run.sizes.adasplash:
        fields = {
            "row": f"Entmax(1.5) attention N={n} bf16 fwd+bwd",
            "model": "Entmax(1.5)",
            "peer": "adasplash.adasplash",
        }
        cases.append((fields, attention(n)))
    return cases


def section_separation(run: Run, until: float) -> dict[str, Any]:
    """Sparse maps ÷ the ``entmax`` package and ÷ AdaSplash, each where installed."""
    result: dict[str, Any] = {}
    peers = {"entmax": _entmax_cases, "adasplash": _adasplash_cases}
    for package, cases in peers.items():
        if importlib.util.find_spec(package) is None:
            result[package] = "not installed (carry its wheel: docs/gpu.md)"
        elif package == "adasplash" and run.device.type != "cuda":
            result[package] = "needs CUDA (Triton kernels)"
        else:
            result[package] = timed_rows(run, cases(run), until)
    if all(isinstance(value, str) for value in result.values()):
        raise Skipped(
            f"no peer to time: entmax {result['entmax']}; adasplash {result['adasplash']}"
        )
    return result


def section_layer(run: Run, until: float) -> dict[str, Any]:
    from hopfield.nn import Hopfield

    batch, n, d, heads = run.sizes.layer

    def case(backward: bool) -> Case:
        def make() -> tuple[Callable[[], object], Callable[[], object]]:
            torch.manual_seed(0)
            x = torch.randn(batch, n, d, device=run.device, dtype=torch.bfloat16).requires_grad_(
                backward
            )
            factory: dict[str, Any] = {"device": run.device, "dtype": torch.bfloat16}
            hop = Hopfield(d, heads, **factory).train(backward)
            mha = nn.MultiheadAttention(d, heads, batch_first=True, **factory).train(backward)
            return (
                _pass(lambda: hop(x), (x, *hop.parameters()), backward),
                _pass(
                    lambda: mha(x, x, x, need_weights=False)[0], (x, *mha.parameters()), backward
                ),
            )

        return make

    cases = [
        (
            {
                "row": f"Hopfield({d}, {heads}) B={batch} N={n} {'fwd+bwd' if b else 'fwd'}",
                "backward": b,
            },
            case(b),
        )
        for b in (False, True)
    ]
    return {
        "shape": f"B {batch}, N {n}, d {d}, {heads} heads, bf16",
        "peer": "nn.MultiheadAttention",
        "rows": timed_rows(run, cases, until),
    }


def section_training(run: Run, until: float) -> dict[str, Any]:
    """Tokens/s of one bf16-autocast AdamW step of a small OPT per attention variant."""
    from hopfield.integrations import VARIANTS, attention_name, build_model

    batch, length = run.sizes.tokens
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, run.sizes.opt["vocab_size"], (batch, length), generator=g).to(run.device)
    variants = ["sdpa", *(attention_name(v) for v in run.sizes.variants or VARIANTS)]
    steps: dict[str, Callable[[], object]] = {}
    for variant in variants:
        torch.manual_seed(0)
        model = build_model("opt", variant, **run.sizes.opt).to(run.device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        steps[variant] = run.synced(_training_step(run, model, optimizer, ids))
    times: dict[str, list[float]] = {v: [] for v in variants}
    errors: dict[str, str] = {}
    for round_ in range(-2, run.sizes.rounds):  # two warm-up rounds, then the timed ones
        if round_ > 0 and time.perf_counter() > until:
            break
        for variant, step in steps.items():
            if variant in errors:
                continue
            start = time.perf_counter()
            try:
                step()
            except Exception as error:  # a variant that fails to train is data, not the end
                errors[variant] = _first_line(error)
                continue
            if round_ >= 0:
                times[variant].append(time.perf_counter() - start)
    base = statistics.median(times["sdpa"]) if times["sdpa"] else None
    rows: list[dict[str, Any]] = []
    for variant in variants:
        if variant in errors:
            rows.append({"row": variant, "error": errors[variant]})
        elif times[variant]:
            step_s = statistics.median(times[variant])
            rows.append(
                {
                    "row": variant,
                    "step_ms": 1e3 * step_s,
                    "tokens_per_s": batch * length / step_s,
                    "ratio": None if base is None else step_s / base,
                    "spread_ms": [1e3 * min(times[variant]), 1e3 * max(times[variant])],
                }
            )
        else:
            rows.append(
                {"row": variant, "skipped": "the section's share of the time budget was spent"}
            )
    opt = run.sizes.opt
    return {
        "model": f"OPT {opt['num_hidden_layers']} layers, d {opt['hidden_size']}, {opt['num_attention_heads']} heads, "
        f"FFN {opt['ffn_dim']}, vocab {opt['vocab_size']}",
        "batch": [batch, length],
        "precision": "bf16 autocast, float32 AdamW",
        "timed_rounds": max((len(t) for t in times.values()), default=0),
        "peer": "sdpa",
        "rows": rows,
    }


def _training_step(
    run: Run, model: nn.Module, optimizer: torch.optim.Optimizer, ids: Tensor
) -> Callable[[], object]:
    def step() -> object:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(run.device.type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        return loss

    return step


def outlier_benchmark_available() -> bool:
    """Whether the ``outlier-benchmark`` experiment with a ``gpu`` preset is registered."""
    from hopfield.experiments.registry import all_experiments

    return any(
        e.name == OUTLIER_EXPERIMENT and OUTLIER_PRESET in e.presets for e in all_experiments()
    )


def section_outliers(run: Run, until: float) -> dict[str, Any]:
    """``hopfield run outlier-benchmark --preset gpu`` with the time left."""
    if not outlier_benchmark_available():
        raise Skipped(
            f"not available: no experiment {OUTLIER_EXPERIMENT!r} with a {OUTLIER_PRESET!r} "
            "preset is registered in this checkout"
        )
    if run.smoke:
        raise Skipped(f"smoke mode: the {OUTLIER_PRESET!r} preset is run on the GPU only")
    # a folder of its own, not beside the record: the record (results embedded) is the one file
    folder = Path(tempfile.mkdtemp(prefix="gpu-check-outliers-"))
    command = [
        sys.executable,
        "-m",
        "hopfield",
        "run",
        OUTLIER_EXPERIMENT,
        "--preset",
        OUTLIER_PRESET,
        "--out",
        str(folder),
        "--no-progress",
    ]
    timeout = until - time.perf_counter()
    if timeout < 30:
        raise Skipped(f"only {max(timeout, 0):.0f} s of the budget were left")
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=_child_env(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as stop:
        raise Skipped(f"did not finish in the {timeout:.0f} s left of the budget") from stop
    results = next(
        (
            line.split(":", 1)[1].strip()
            for line in done.stdout.splitlines()
            if line.startswith("results:")
        ),
        None,
    )
    embedded = None
    if results and Path(results).is_file() and Path(results).stat().st_size <= 1 << 20:
        embedded = json.loads(Path(results).read_text())
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return {
        "command": " ".join(["hopfield", *command[3:]]),
        "results_path": results,
        "results": embedded,
    }


SECTIONS: dict[str, Callable[[Run, float], dict[str, Any]]] = {
    "tests": section_tests,
    "attention": section_attention,
    "efficient": section_efficient,
    "separation": section_separation,
    "layer": section_layer,
    "training": section_training,
    "outliers": section_outliers,
}


# --- the record -------------------------------------------------------------------------------


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _commit() -> str | None:
    """The checked-out commit, or ``None`` (no git, or a copy of the tree without its history)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def source_hash() -> str:
    """SHA-256 over the library's source files (paths and contents): which code ran, also where
    the tree travelled without git."""
    digest = hashlib.sha256()
    package = ROOT / "src" / "hopfield"
    for path in sorted(p for p in package.rglob("*") if p.suffix in (".py", ".c")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def environment(device: torch.device) -> dict[str, Any]:
    """Device, driver-side and library versions of this run."""
    from hopfield.functional import native

    info: dict[str, Any] = {
        "device": device.type,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "packages": {
            p: _version(p)
            for p in ("triton", "transformers", "accelerate", "entmax", "adasplash", "pytest")
        },
        "commit": _commit(),
        "source_sha256": source_hash(),
        "native_kernels": native.available(torch.zeros(1)),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
        )
    return info


def _write(record: dict[str, Any], out: Path) -> None:
    """``record`` as JSON at ``out``, replaced in one step (a stopped run keeps the last)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, out)


def check(smoke: bool, budget_s: float, out: Path) -> dict[str, Any]:
    """Run every section (see the module docstring) and write the record to ``out``."""
    if not smoke and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device here; on the CPU use --smoke")
    start = time.perf_counter()
    device = torch.device("cpu" if smoke else "cuda")
    if smoke:
        torch.set_num_threads(1)  # tiny tensors; CI machines are small and shared
    run = Run(smoke, device, SMOKE_SIZES if smoke else GPU_SIZES, start + budget_s - RESERVE_S)
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": "smoke" if smoke else "gpu",
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "budget_s": budget_s,
        "environment": environment(device),
        "sections": {},
    }
    for name, section in SECTIONS.items():
        began = time.perf_counter()
        share = SHARES.get(name)
        until = run.deadline if share is None else min(run.deadline, began + share * budget_s)
        entry: dict[str, Any]
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        if run.left() < 1.0:
            entry = {"status": "skipped", "reason": "the time budget was spent"}
        else:
            try:
                entry = {"status": "ok", **section(run, until)}
            except Skipped as why:
                entry = {"status": "skipped", "reason": str(why)}
            except Exception as error:
                entry = {
                    "status": "error",
                    "reason": _first_line(error),
                    "traceback": traceback.format_exc()[-4000:],
                }
            finally:
                run.free()
        entry["wall_s"] = round(time.perf_counter() - began, 2)
        if device.type == "cuda":  # this process's peak (the tests and outliers run apart)
            entry["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        record["sections"][name] = entry
        record["wall_s"] = round(time.perf_counter() - start, 2)
        _write(record, out)
        print(
            f"{name:11s} {entry['status']:8s} {entry['wall_s']:7.1f} s  {entry.get('reason', '')}",
            flush=True,
        )
    return record


# --- docs/gpu.md ------------------------------------------------------------------------------


def newest_record(folder: Path = RECORDS) -> dict[str, Any] | None:
    """The newest GPU record (``kind == "gpu"``, by ``created``) in ``folder``; smoke records and
    files that are not records of this schema are passed over."""
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if (
            isinstance(record, dict)
            and record.get("schema") == SCHEMA
            and record.get("kind") == "gpu"
        ):
            found.append((str(record.get("created", "")), path.name, record))
    return max(found, key=lambda item: item[:2])[2] if found else None


HOW_TO_RUN = """\
## How to run the check

On a machine with one GPU, from the repository root (about 8 minutes on one H100):

    python3 benchmarks/gpu_check.py --out results/gpu/record-$(date +%Y%m%d).json --budget-s 480
    python3 benchmarks/gpu_check.py --render docs/gpu.md

The `separation` section times the `entmax` package and AdaSplash only where they are installed;
on a machine without a registry, carry their wheels (`pip download entmax adasplash` elsewhere,
then `pip install --no-index --find-links <folder> entmax adasplash`). The `outliers` section runs
`hopfield run outlier-benchmark --preset gpu` with the time left, where that experiment exists.

On the CPU, `python3 benchmarks/gpu_check.py --smoke --out runs/gpu-smoke.json` runs every section
at tiny sizes in seconds (CI does); its record is a test of the script, not a measurement, and
`--render` never reads it. `python -m pytest -m cuda` runs the CUDA tests alone.
"""


def _ms(value: Any) -> str:
    return "–" if value is None else f"{value:.3g}"


def _ratio_table(rows: list[dict[str, Any]], peer: str) -> list[str]:
    lines = [f"| row | ours ms | {peer} ms | ours ÷ peer [q25, q75] |", "|---|---|---|---|"]
    for row in rows:
        if "ratio" in row:
            low, high = row["spread"]
            lines.append(
                f"| {row['row']} | {_ms(row['ours_ms'])} | {_ms(row['peer_ms'])} | "
                f"{row['ratio']:.2f} [{low:.2f}, {high:.2f}] |"
            )
        else:
            lines.append(f"| {row['row']} | – | – | {row.get('error') or row.get('skipped')} |")
    return lines


def _section_lines(name: str, entry: dict[str, Any]) -> list[str]:
    lines = [f"## {name}", ""]
    if entry["status"] != "ok":
        return [*lines, f"**{entry['status']}**: {entry.get('reason', '')}", ""]
    if name == "tests":
        lines.append(
            f"`{entry['command']}`: {entry['passed']} passed, {entry['failed']} failed, "
            f"{entry['errors']} errors, {entry['skipped']} skipped (of {entry['total']})."
        )
        lines += [f"- {f['test']}: {f['outcome']}: {f['message']}" for f in entry["failing"]]
    elif name in ("attention", "efficient", "layer"):
        lines += [
            f"{entry['shape']}; peer {entry['peer']}.",
            "",
            *_ratio_table(entry["rows"], entry["peer"]),
        ]
    elif name == "separation":
        for package in ("entmax", "adasplash"):
            rows = entry[package]
            if isinstance(rows, str):
                lines += [f"Peer package `{package}`: {rows}", ""]
            else:
                lines += [f"Peer package `{package}`:", "", *_ratio_table(rows, "peer"), ""]
    elif name == "training":
        lines += [
            f"{entry['model']}; batch {entry['batch'][0]} × {entry['batch'][1]} tokens; "
            f"{entry['precision']}; {entry['timed_rounds']} timed steps per variant.",
            "",
            "| attention | step ms | tokens/s | ÷ sdpa |",
            "|---|---|---|---|",
        ]
        for row in entry["rows"]:
            if "step_ms" in row:
                ratio = "–" if row["ratio"] is None else f"{row['ratio']:.2f}"
                lines.append(
                    f"| {row['row']} | {row['step_ms']:.1f} | {row['tokens_per_s']:.0f} | {ratio} |"
                )
            else:
                lines.append(f"| {row['row']} | – | – | {row.get('error') or row.get('skipped')} |")
    elif name == "outliers":
        lines.append(
            f"`{entry['command']}`: results embedded in the record ({entry['results_path']})."
        )
    return [*lines, ""]


def render(record: dict[str, Any] | None) -> str:
    """docs/gpu.md for ``record`` (``None``: the page that says no GPU record exists yet)."""
    head = [
        "# The GPU check",
        "",
        "<!-- generated by `python3 benchmarks/gpu_check.py --render docs/gpu.md` from the newest "
        "record in results/gpu/; do not edit -->",
        "",
    ]
    if record is None:
        body = [
            "**No GPU record exists yet: no line of the library has run on CUDA in a recorded "
            "check.** The numbers elsewhere in these docs are CPU numbers. The tests that would run "
            "on a GPU (`tests/test_devices.py`, the `device` fixture) pass on the CPU and are "
            "skipped there for CUDA.",
            "",
        ]
        return "\n".join([*head, *body, HOW_TO_RUN])
    env = record["environment"]
    body = []
    if record["kind"] != "gpu":
        body += [
            f"**This is a {record['kind']} record (device {env['device']}): it tests the script; "
            "its times say nothing about GPU speed.**",
            "",
        ]
    body += [
        f"Record of {record['created']}: {env.get('gpu', env['device'])}"
        + (
            f" (compute capability {env['capability']}, {env['gpu_memory_gib']} GiB)"
            if "gpu" in env
            else ""
        )
        + f"; torch {env['torch']}, CUDA {env['cuda']}; commit {str(env['commit'])[:10]} (sources {env['source_sha256'][:12]}); "
        f"{record['wall_s']:.0f} s of a {record['budget_s']:.0f} s budget.",
        "",
        "| section | status | s | peak GPU memory (GiB, this process) |",
        "|---|---|---|---|",
        *(
            f"| {n} | {e['status']} | {e['wall_s']:.0f} | {e.get('peak_gib', '–')} |"
            for n, e in record["sections"].items()
        ),
        "",
        "Each time is the median over pairs timed in turn (ours, then the peer, each call ending "
        "with a device synchronisation); the ratio is the median of the per-pair ratios with its "
        "quartiles.",
        "",
    ]
    for name, entry in record["sections"].items():
        body += _section_lines(name, entry)
    return "\n".join([*head, *body, HOW_TO_RUN])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the CPU, tiny sizes, seconds (CI)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the record (default: results/gpu/record-<UTC time>.json; "
        "with --smoke runs/gpu-check-smoke.json)",
    )
    parser.add_argument("--budget-s", type=float, default=480.0, help="total time budget (s)")
    parser.add_argument(
        "--render",
        type=Path,
        default=None,
        metavar="MD",
        help="only write this page from the newest GPU record in --records",
    )
    parser.add_argument("--records", type=Path, default=RECORDS, help="folder of the records")
    args = parser.parse_args()
    if args.render is not None:
        args.render.write_text(render(newest_record(args.records)))
        print(f"wrote {args.render}")
        return
    if not args.budget_s > 2 * RESERVE_S:
        parser.error(f"--budget-s must be more than {2 * RESERVE_S:g} s, got {args.budget_s:g}")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = args.out or (
        ROOT / "runs" / "gpu-check-smoke.json" if args.smoke else RECORDS / f"record-{stamp}.json"
    )
    check(args.smoke, args.budget_s, out)
    print(f"record: {out}")


if __name__ == "__main__":
    main()
