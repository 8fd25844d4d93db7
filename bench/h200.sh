#!/usr/bin/env bash
# The H200 measurements, in two runs of under 10 minutes each, or one:
#
#   bash bench/h200.sh search     # 1. campaign + exhaustive sweep + head to head on llama-8b
#   bash bench/h200.sh decode F   # 2. the build the campaign in F kept, beside the peers, and hot vs cold
#   bash bench/h200.sh all        # 1 without the sweep (an earlier one's best), then batch-1 decode
#
# 1. bench/search_quality.py on llama-8b bf16: the reference alone, an exhaustive sweep of the
#    decode-path knobs (paired with a fused anchor), then a 30-experiment campaign from the
#    reference with the search agent in the same engine, and the campaign's best paired with the
#    exhaustive best and its contenders. Records experiments/hour with and without torch.compile
#    prepare time.
# 2. bench/decode.py: Polymorph's reference and the campaign's build, the gpt-fast-style compiled
#    peer, HF eager and HF compiled, both shapes; then bench/hot_vs_cold.py on llama-8b.
# Results go to $OUT (default bench/results/h200-run/). Needs torch with CUDA, triton and
# transformers; pydantic, structlog and boto3 & co. come from PYTHONPATH when the image lacks them.
set -euo pipefail
OUT=${OUT:-bench/results/h200-run}
mkdir -p "$OUT"
export PYTHONPATH=operator:engine_image${PYTHONPATH:+:$PYTHONPATH}
DATE=$(date -u +%F)

case "${1:-}" in
search)
    python3 bench/search_quality.py --model llama-8b --device cuda --dtype bfloat16 \
        --knobs "${SWEEP_KNOBS:-kv_cache,decode_step,kernels,capture_buckets,sampling,prefill}" \
        --skip kernels=compile --anchor decode_step=fused,sampling=device --experiment-timeout 60 \
        --max-experiments 30 --deadline "${CAMPAIGN_DEADLINE:-240s}" \
        --out "$OUT/search-quality-llama-8b-h200-$DATE.json" >/dev/null
    ;;
decode)
    FOUND=$(python3 -c '
import json, sys
best = (json.load(open(sys.argv[1]))["campaign"].get("best") or {})
print(",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in (best.get("knobs") or {}).items()))
' "$2")
    echo "campaign kept: ${FOUND:-nothing}"
    python3 bench/decode.py --models llama-8b,llama-1b --batches 1,8,32 --compiled-batches 1 \
        --steps 128 --knobs "${FOUND:-kv_cache=concat}" --budget-s "${DECODE_BUDGET_S:-300}" --json \
        --out "$OUT/decode-h200-$DATE.json" >/dev/null
    python3 bench/hot_vs_cold.py --model llama-8b --device cuda --dtype bfloat16 --builds 6 \
        --repeats 2 --out "$OUT/llama-8b-h200-$DATE.json" --json >/dev/null
    ;;
all)
    # Both in one run of under 10 minutes: the campaign under a deadline, judged head to
    # head against the best points of the sweep recorded earlier (SWEEP_FROM; the sweep
    # itself takes ~2 minutes), then batch-1 decode of the build it kept beside the peers (rows
    # past the budget are recorded as skipped).
    timeout 360 python3 bench/search_quality.py --model llama-8b --device cuda --dtype bfloat16 \
        --sweep-from "${SWEEP_FROM:-bench/results/search-quality-llama-8b-h200-2026-12-01-b.json}" \
        ${CAMPAIGN_FLAGS:-} \
        --out "$OUT/search-quality-llama-8b-h200-$DATE.json" >/dev/null || echo "search exited $?"
    FOUND=$(python3 -c '
import json, sys
best = (json.load(open(sys.argv[1])).get("campaign") or {}).get("best") or {}
print(",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in (best.get("knobs") or {}).items()))
' "$OUT/search-quality-llama-8b-h200-$DATE.json" || true)
    echo "campaign kept: ${FOUND:-nothing}"
    python3 bench/decode.py --models llama-8b,llama-1b --batches 1 --compiled-batches 1 \
        --engines polymorph-reference,polymorph,compiled-peer --steps 128 \
        --knobs "${FOUND:-kv_cache=concat}" --budget-s "${DECODE_BUDGET_S:-220}" --json \
        --out "$OUT/decode-h200-$DATE-campaign.json" >/dev/null
    ;;
*)
    echo "usage: bash bench/h200.sh search | decode SEARCH_QUALITY_JSON | all" >&2
    exit 2
    ;;
esac
