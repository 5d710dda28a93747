"""Core benchmark: Softmax_1 attention and the Hopfield layer against PyTorch baselines.

Every number is a ratio against a baseline measured in the same run (same process, same
threads), so the results transfer between machines. Run:

    python benchmarks/bench_core.py [--quick] [--retrieve-size N] [--json out.json]

Targets (issue #2): Softmax_1 attention <= 1.10x plain ``scaled_dot_product_attention`` and
>= 5x faster than the explicit formula (B=4, H=8, N=1024, E=64, fp32, CPU, forward and
forward+backward); peak memory at N=8192 <= 1.2x plain SDPA; ``Hopfield`` forward (B=4,
N=1024, d=512, 8 heads) <= 1.15x ``nn.MultiheadAttention``. Issue #16: one step of
``hopfield.memory.retrieve`` with its defaults (10 000 queries x 10 000 memories, d = 784, dense
softmax) <= 1.15x the plain formula ``softmax(βQMᵀ)M``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from _timing import interleaved_ratio, median_time
from hopfield.functional import Softmax, SoftmaxN, associate
from hopfield.functional.structures import explicit_association
from hopfield.memory import retrieve
from hopfield.nn import Hopfield


def attention_inputs(n: int, grad: bool) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return tuple(torch.randn(4, 8, n, 64, requires_grad=grad) for _ in range(3))


def attention_case(kind: str, n: int, backward: bool) -> Callable[[], object]:
    q, k, v = attention_inputs(n, backward)
    softmax1 = SoftmaxN(1.0)

    def forward() -> torch.Tensor:
        if kind == "sdpa":
            return F.scaled_dot_product_attention(q, k, v)
        if kind == "softmax1":
            out = associate(q, k, v, separation=softmax1)
            assert isinstance(out, torch.Tensor)
            return out
        return explicit_association(
            q, k, v, separation=softmax1, scale=0.125, mask=None, dropout=0.0
        )[0]

    if not backward:
        return lambda: forward()
    return lambda: forward().sum().backward()


_PEAK_SNIPPET = """
import sys, re
sys.path.insert(0, 'benchmarks')
from bench_core import attention_case
fn = attention_case({kind!r}, {n}, False)
def rss(field):
    return int(re.search(field + r":\\s+(\\d+)", open('/proc/self/status').read()).group(1))
before = rss('VmRSS')
open('/proc/self/clear_refs', 'w').write('5')  # reset the high-water mark VmHWM
fn()
print(rss('VmHWM') - before)
"""


def peak_memory_mib(kind: str, n: int) -> float:
    """Peak resident-memory growth (MiB) of one forward pass, in a fresh process (Linux)."""
    code = _PEAK_SNIPPET.format(kind=kind, n=n)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) / 1024  # /proc reports KiB


def layer_case(kind: str) -> Callable[[], object]:
    torch.manual_seed(0)
    x = torch.randn(4, 1024, 512)
    if kind == "mha":
        mha = nn.MultiheadAttention(512, 8, batch_first=True).eval()
        return lambda: mha(x, x, x, need_weights=False)
    hop = Hopfield(512, 8).eval()
    return lambda: hop(x)


def retrieve_case(kind: str, n: int, d: int = 784) -> Callable[[], object]:
    """One dense softmax step of ``n`` queries ``(n, d)`` against ``n`` memories ``(n, d)``.

    ``kind="plain"``: the formula ``softmax(βQMᵀ)M``; ``"retrieve"``: ``retrieve`` with its
    defaults (one step, no energy trace).
    """
    generator = torch.Generator().manual_seed(0)
    memories = torch.rand(n, d, generator=generator)
    queries = torch.rand(n, d, generator=generator)
    beta = 1.0 / d
    if kind == "plain":
        return lambda: torch.softmax(beta * queries @ memories.T, dim=-1) @ memories
    return lambda: retrieve(queries, memories, Softmax(), beta=beta)


def run(quick: bool, retrieve_size: int | None = None) -> dict[str, float]:
    repeats = 3 if quick else 10
    n = 256 if quick else 1024
    results: dict[str, float] = {"threads": torch.get_num_threads(), "N": n}
    with torch.inference_mode():
        for label, fn in (("sdpa", "sdpa"), ("softmax1", "softmax1"), ("explicit", "explicit")):
            results[f"forward_s/{label}"] = median_time(attention_case(fn, n, False), repeats)
    for label in ("sdpa", "softmax1", "explicit"):
        results[f"fwd+bwd_s/{label}"] = median_time(attention_case(label, n, True), repeats)
    for phase in ("forward_s", "fwd+bwd_s"):
        base = results[f"{phase}/sdpa"]
        results[f"{phase}/softmax1 ÷ sdpa"] = results[f"{phase}/softmax1"] / base
        results[f"{phase}/explicit ÷ softmax1"] = (
            results[f"{phase}/explicit"] / results[f"{phase}/softmax1"]
        )
    big = 1024 if quick else 8192
    sdpa_mem, s1_mem = peak_memory_mib("sdpa", big), peak_memory_mib("softmax1", big)
    results[f"peak_MiB@{big}/sdpa"] = sdpa_mem
    results[f"peak_MiB@{big}/softmax1"] = s1_mem
    results[f"peak_MiB@{big}/softmax1 ÷ sdpa"] = s1_mem / max(sdpa_mem, 1e-9)
    with torch.inference_mode():
        mha = median_time(layer_case("mha"), repeats)
        hop = median_time(layer_case("hopfield"), repeats)
    results["layer_forward_s/mha"], results["layer_forward_s/hopfield"] = mha, hop
    results["layer_forward_s/hopfield ÷ mha"] = hop / mha
    size = retrieve_size or (2048 if quick else 10_000)
    with torch.inference_mode():
        ratio, ours, plain = interleaved_ratio(
            retrieve_case("retrieve", size), retrieve_case("plain", size), repeats
        )
    results[f"retrieve_s@{size}/plain"], results[f"retrieve_s@{size}/retrieve"] = plain, ours
    results[f"retrieve_s@{size}/retrieve ÷ plain"] = ratio
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument(
        "--retrieve-size",
        type=int,
        default=None,
        help="queries = memories of the retrieve row (default 10000; 2048 with --quick)",
    )
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    if args.retrieve_size is not None and args.retrieve_size < 1:
        parser.error(f"--retrieve-size must be a positive int, got {args.retrieve_size}")
    results = run(args.quick, args.retrieve_size)
    for key, value in results.items():
        print(f"{key:40s} {value:.4g}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
