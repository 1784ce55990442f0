#!/usr/bin/env bash
# The checks that need a GPU, in one run (docs/performance.md, "On a GPU"): the card and the
# versions, the suite's CUDA-marked tests (tests/runtime/test_cuda.py), then generated code against
# FlexAttention and the other independent baselines on the card, time (forward and
# forward+backward) and peak memory of forward+backward. Figures go to $OUT (default: a new
# folder under /tmp; each benchmark's stderr in NAME.err beside its NAME.jsonl). Run from the
# repository root with a Python that has torch with CUDA:
#   PYTHON=python3 benchmarks/on_a_gpu.sh
# Then benchmarks/flex_gpu.py: the specs FlexAttention takes through backend="flex" and
# "blocks", and three cores against hand-written compiled flex_attention, at N = 8192 and
# 32768 (forward, forward+backward, peak memory); FLEX_SPECS= (empty) times every spec flex
# takes (about 35 compiles: more than the 8 minutes the default list fits in).
# benchmarks/triton_gpu.py: the triton backend's kernels against FlexAttention and the blocked
# path (docs/triton.md, "On a GPU").
#   benchmarks/on_a_gpu.sh --device cpu    # the dry run: no card, tiny N, eager flex_attention,
#                                          # Triton's interpreter (DRY_SECTIONS=flex,triton)
set -uo pipefail
python=${PYTHON:-python3}
out=${OUT:-$(mktemp -d)}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
flex_specs=${FLEX_SPECS-mha,sliding_window,softcap_window,alibi,doc_mask,gqa,chunked,prefix_lm,t5_bias,softcap_core,gqa_core}
if [[ "${1:-}" == "--device" && "${2:-}" == "cpu" ]]; then
  status=0
  if [[ ",${DRY_SECTIONS:-flex,triton}," == *,flex,* ]]; then
    timeout "${FLEX_SECONDS:-600}" "$python" benchmarks/flex_gpu.py --device cpu --lengths 64 \
      --rounds 1 --eager --specs "${DRY_SPECS:-$flex_specs}" 2>>"$out/flex.err" | tee "$out/flex.jsonl"
    status=${PIPESTATUS[0]}
  fi
  if [[ ",${DRY_SECTIONS:-flex,triton}," == *,triton,* ]]; then  # Triton's interpreter
    timeout "${TRITON_SECONDS:-600}" "$python" benchmarks/triton_gpu.py --device cpu \
      --lengths 40 --specs "${TRITON_DRY_SPECS:-softcap_core,sigmoid_attention}" 2>>"$out/triton.err" \
      | tee "$out/triton.jsonl"
    (( status |= PIPESTATUS[0] ))
  fi
  echo "dry run: figures in $out"
  exit "$status"
fi
# Every section's timeout is its budget or what is left of TOTAL_SECONDS (default 470: the
# whole run stays under 8 minutes of the card by construction, the card's start aside).
deadline=$((SECONDS + ${TOTAL_SECONDS:-470}))
budget() { local left=$((deadline - SECONDS)); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/card.txt"
"$python" -c "import torch, sympy, opt_einsum, einops, transformers
print('torch', torch.__version__, 'sympy', sympy.__version__, 'opt_einsum', opt_einsum.__version__,
      'einops', einops.__version__, 'transformers', transformers.__version__)" | tee -a "$out/card.txt"
timeout "$(budget "${TESTS_SECONDS:-100}")" "$python" -m pytest -q -m cuda tests/runtime/test_cuda.py \
  -p no:logging --show-capture=no --tb=short -rf 2>&1 | tee "$out/tests.txt"
cases="mha (FlexAttention),sliding_window (FlexAttention),softcap_window (FlexAttention)"
cases+=",alibi (FlexAttention),doc_mask (FlexAttention),linear_attention_causal,retention,rope"
timeout "$(budget "${TIME_SECONDS:-90}")" "$python" benchmarks/independent.py --device cuda \
  --lengths "${LENGTHS:-8192}" --rounds 5 --cases "$cases" 2>>"$out/time.err" | tee "$out/time.jsonl"
flex=$(tr , '\n' <<<"$cases" | grep Flex | paste -sd,)
timeout "$(budget "${MEMORY_SECONDS:-60}")" "$python" benchmarks/independent.py --device cuda --memory \
  --lengths 32768 --cases "$flex" 2>>"$out/memory.err" | tee "$out/memory.jsonl"
# -- triton: the triton backend's printed kernels against FlexAttention where it takes the
# spec and the blocked path, forward and fwd+bwd, peak memory, block sizes from a named set
# (benchmarks/triton_gpu.py; docs/triton.md, "On a GPU"; its CPU dry run: --device cpu)
timeout "$(budget "${TRITON_SECONDS:-180}")" "$python" benchmarks/triton_gpu.py --device cuda \
  --lengths "${TRITON_LENGTHS:-8192,32768}" --rounds 3 2>>"$out/triton.err" | tee "$out/triton.jsonl"
timeout "$(budget "${FLEX_SECONDS:-240}")" "$python" benchmarks/flex_gpu.py --device cuda \
  --lengths "${FLEX_LENGTHS:-8192,32768}" --rounds 3 --specs "$flex_specs" 2>>"$out/flex.err" \
  | tee "$out/flex.jsonl"
echo "figures in $out"
