#!/usr/bin/env bash
# The H200 measurements in one device call (device time is scarce): a search campaign from the
# reference build on llama-8b, then the build it found side by side with HF transformers and the
# compiled peer at batch 1 on both shapes. Results go to $OUT (default bench/results/h200-run/).
#
#   bash bench/h200.sh            # on the H200, from the repository root
#
# Needs torch with CUDA, triton and transformers; pydantic, structlog and boto3 & co. come from
# PYTHONPATH when the image lacks them.
set -euo pipefail
OUT=${OUT:-bench/results/h200-run}
mkdir -p "$OUT"
export PYTHONPATH=operator:engine_image${PYTHONPATH:+:$PYTHONPATH}
DATE=$(date -u +%F)
CAMPAIGN=${CAMPAIGN_FLAGS:---max-experiments 30 --deadline 270s --experiment-timeout 45s}

# 1. The compile loop from the reference build, with the search agent.
# shellcheck disable=SC2086
python3 bench/compile_campaign.py --out "$OUT/compile-llama-8b-h200-$DATE.json" -- \
    --model llama-8b --device cuda --dtype bfloat16 --fresh $CAMPAIGN

# 2. The found build beside the peers (the knobs of the build the campaign kept).
FOUND=$(python3 -c '
import json, sys
best = json.load(open(sys.argv[1]))["result"].get("best") or {}
print(",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in (best.get("knobs") or {}).items()))
' "$OUT/compile-llama-8b-h200-$DATE.json")
echo "campaign kept: ${FOUND:-nothing}"
python3 bench/decode.py --models llama-8b,llama-1b --batches 1 --compiled-batches 1 \
    --engines polymorph-reference,polymorph,compiled-peer,hf-compiled --steps 128 \
    --knobs "${FOUND:-kv_cache=concat}" --budget-s ${DECODE_BUDGET_S:-200} --json \
    --out "$OUT/decode-h200-$DATE-campaign.json"
