"""Generated code against independent baselines (benchmarks/baselines/), in interleaved rounds.

    .venv/bin/python benchmarks/independent.py            # N = 512 and 2048, about 25 minutes
    .venv/bin/python benchmarks/independent.py --quick    # N = 128, one round: a smoke run
    .venv/bin/python benchmarks/independent.py --cases rope --lengths 512 --rounds 9

benchmarks/run.py compares each spec with the fast forward of its own reference module;
these baselines are written from the paper's or the library's algorithm instead, the way a
skilled engineer would write the computation if indexattn did not exist (chunked causal
linear attention, chunkwise retention, a fused q/k/v weight in either layout, rotary
embeddings as the model libraries write them, FlexAttention for the masks and score changes
it expresses). Each case builds the spec's module, hands its parameters to the baseline,
checks that both compute the same, then times the generated module, the baseline eager and
the baseline under torch.compile (FlexAttention: compiled only, as it must be), forward
(inference mode) and forward+backward (FlexAttention: forward only on a CPU, where torch has
no backward for it; `--device cuda` times both), at width 768, 12 heads of 64, batch 1, one
thread (steadier ratios on a loaded machine). "× best": the generated time over the faster
baseline's, the median of the ratios within interleaved rounds, with their range. Prints one
JSON line per case, length and mode.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import spec_memory  # noqa: E402
import torch  # noqa: E402
from baselines import chunked_linear, flex, fused_qkv, retention, rotary  # noqa: E402
from run import interleaved, run_once  # noqa: E402

import indexattn  # noqa: E402

SIZES = {"d_m": 768, "h": 12, "d_k": 64}  # and each case's own names for the same
SEPARATE = {"d_in": 768, "d_out": 768, "h": 12, "d_k": 64}  # mha_separate.attn's names
ROTARY = {"d_m": 768, "h": 12, "d_r": 32}
WINDOW = {"w": 256}  # benchmarks/cases.py's window and Gemma 2's scalars at these widths
GEMMA = {**SIZES, **WINDOW, "c": 50.0, "query_pre_attn_scalar": 64}


@dataclass(frozen=True)
class Case:
    spec: Path
    baselines: dict  # name -> function(*inputs, params, sizes)
    sizes: dict = field(default_factory=SIZES.copy)
    compiled: bool = True  # also time each baseline under torch.compile (flex compiles itself)
    backward: bool = True  # False: FlexAttention, whose backward runs on a GPU only


def flex_case(spec: str, baseline, sizes: dict = SIZES) -> Case:
    """A FlexAttention baseline: forward only on a CPU (torch 2.13 has no CPU backward)."""
    return Case(ROOT / "specs" / f"{spec}.attn", {"flex": baseline}, sizes, False, False)


CASES = {
    "linear_attention_causal": Case(
        ROOT / "specs" / "linear_attention_causal.attn", {"chunked": chunked_linear.forward}
    ),
    "retention": Case(ROOT / "specs" / "retention.attn", {"chunkwise": retention.forward}),
    "mha (head-major weight)": Case(
        ROOT / "specs" / "mha.attn", {"head_major": fused_qkv.head_major}
    ),
    "mha_one_equation (the whole of mha in one equation)": Case(
        HERE / "specs" / "mha_one_equation.attn", {"head_major": fused_qkv.head_major}
    ),
    "mha_qkv_major (q/k/v-major weight)": Case(
        HERE / "specs" / "mha_qkv_major.attn", {"qkv_major": fused_qkv.qkv_major}
    ),
    "rope": Case(ROOT / "specs" / "rope.attn", {"llama": rotary.llama}, ROTARY),
    "rope_interleaved": Case(
        ROOT / "specs" / "rope_interleaved.attn", {"gptj": rotary.gptj}, ROTARY
    ),
    "rope_partial": Case(  # heads of 64, a quarter rotated
        ROOT / "specs" / "rope_partial.attn", {"neox": rotary.neox}, ROTARY | {"d_r": 8, "d_p": 48}
    ),
    "mha (FlexAttention)": flex_case("mha", flex.mha),
    "sliding_window (FlexAttention)": flex_case(
        "sliding_window", flex.sliding_window, SEPARATE | WINDOW
    ),
    "softcap_window (FlexAttention)": flex_case("softcap_window", flex.softcap_window, GEMMA),
    "alibi (FlexAttention)": flex_case("alibi", flex.alibi, SEPARATE),
    "doc_mask (FlexAttention)": flex_case("doc_mask", flex.doc_mask),
}
MODES = ("forward", "forward+backward")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 128, one round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--lengths", help="comma-separated N (default: 512,2048)")
    parser.add_argument("--device", default="cpu", help="where to run (cuda: flex's backward too)")
    parser.add_argument(
        "--memory", action="store_true", help="peak memory of forward+backward, not time"
    )
    hidden = argparse.SUPPRESS  # internal: CASE N IMPL, one memory probe in a fresh process
    parser.add_argument("--probe", nargs=3, help=hidden)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.probe:
        name, n, impl = args.probe
        return print(json.dumps(peak(name, int(n), impl, torch.device(args.device))))
    lengths = (128,) if args.quick else (512, 2048)
    lengths = tuple(map(int, args.lengths.split(","))) if args.lengths else lengths
    names = args.cases.split(",") if args.cases else list(CASES)
    if args.memory:
        return memory(names, lengths, args.device)
    for name in names:
        case = CASES[name]
        for n in lengths:
            built = build(case, n, torch.device(args.device), compiled=not args.quick)
            for mode in modes(case, args.device):
                samples = interleaved(built, mode, 1 if args.quick else args.rounds)
                print(json.dumps({"case": name, "N": n, "mode": mode, **summary(samples)}))


def modes(case: Case, device: str) -> tuple[str, ...]:
    return MODES if case.backward or device != "cpu" else MODES[:1]


def build(case: Case, n: int, device: torch.device, compiled: bool) -> dict:
    """name -> (call, inputs, params), as benchmarks/run.py's `interleaved` takes them."""
    torch.manual_seed(0)
    spec = indexattn.compile_spec(case.spec)
    module = spec.module(**case.sizes).to(device).eval()
    params = dict(module.named_parameters())
    inputs = make_inputs(spec, n, device)
    built = {"generated": (module, inputs, list(params.values()))}
    for key, fn in case.baselines.items():
        call = lambda *a, fn=fn: fn(*a, params, case.sizes)  # noqa: E731
        built[key] = (call, inputs, list(params.values()))
        if compiled and case.compiled:
            built[key + " compiled"] = (torch.compile(call), inputs, list(params.values()))
    with torch.no_grad():
        want = module(*inputs)
        for key, (call, inputs, _) in built.items():
            torch.testing.assert_close(call(*inputs), want, atol=1e-4, rtol=1e-3, msg=key)
    return built


def make_inputs(spec, n: int, device: torch.device) -> list[torch.Tensor]:
    """X of (1, n, width); document ids, where the spec takes them, in four documents."""
    ids = (torch.arange(n, device=device) * 4 // n)[None]
    x = torch.randn(1, n, 768, device=device)
    return [ids if t.dtype == "int" else x for t in spec.ir.tensors_of("input")]


def memory(names: list[str], lengths: tuple[int, ...], device: str) -> None:
    """The generated module's and each eager baseline's peak, each in a fresh process with
    glibc mapping every block above 128 kB on its own (so the peak counts tensors alive
    together, as benchmarks/spec_memory.py does); on a GPU, what its allocator holds."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    for name in names:
        for n in lengths:
            for impl in ("generated", *CASES[name].baselines):
                command = [sys.executable, __file__, "--probe", name, str(n), impl]
                command += ["--device", device]
                done = subprocess.run(command, stdout=subprocess.PIPE, check=True, env=env)
                print(json.dumps({"case": name, "N": n, "impl": impl, **json.loads(done.stdout)}))


def peak(name: str, n: int, impl: str, device: torch.device) -> dict:
    """MB that memory rises by at the peak of one forward+backward: the second one, since the
    first builds per-shape tables and the gradients' storage. On a CPU, resident memory; on
    a GPU, what the caching allocator holds above its start."""
    built = build(CASES[name], n, device, compiled=False)[impl]
    run_once(*built, MODES[1])
    if device.type == "cpu":
        return {"forward+backward MB": spec_memory.growth(lambda: run_once(*built, MODES[1]))}
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    run_once(*built, MODES[1])
    torch.cuda.synchronize()
    return {"forward+backward MB": round((torch.cuda.max_memory_allocated() - start) / 1e6, 1)}


def summary(samples: dict[str, list[float]]) -> dict:
    ms = {k: statistics.median(s) for k, s in samples.items()}
    best = min((k for k in ms if k != "generated"), key=ms.get)
    ratios = [g / b for g, b in zip(samples["generated"], samples[best])]
    return {
        "ms": {k: round(v, 3) for k, v in ms.items()},
        "best_baseline": best,
        "ratio": round(statistics.median(ratios), 3),
        "range": [round(min(ratios), 3), round(max(ratios), 3)],
    }


if __name__ == "__main__":
    main()
