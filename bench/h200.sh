#!/usr/bin/env bash
# The H200 measurements, in two runs of under 10 minutes each, or one:
#
#   bash bench/h200.sh search     # 1. campaign + exhaustive sweep + head to head on llama-8b
#   bash bench/h200.sh decode F   # 2. the build the campaign in F kept, beside the peers, and hot vs cold
#   bash bench/h200.sh all        # 1 without the sweep (an earlier one's best), then batch-1 decode
#   bash bench/h200.sh fidelity   # 3. the sampled-steps estimate against full replays, three shapes
#   bash bench/h200.sh shapes     # 4. a sweep and a campaign per shape (bench/shapes/*.yaml)
#   bash bench/h200.sh moe [decode|search]  # 5. qwen3-30b-a3b: MoE builds beside the peers at batch 1, 8,
#                                 #    32 (decode); a sweep and a campaign (search); both by default
#
# 1. bench/search_quality.py on llama-8b bf16: the reference alone, an exhaustive sweep of the
#    decode-path knobs (paired with a fused anchor), then a 30-experiment campaign from the
#    reference with the search agent in the same engine, and the campaign's best paired with the
#    exhaustive best and its contenders. Records experiments/hour with and without torch.compile
#    prepare time.
# 2. bench/decode.py: Polymorph's reference and the campaign's build, the gpt-fast-style compiled
#    peer, HF eager and HF compiled, both shapes; then bench/hot_vs_cold.py on llama-8b.
# 3. bench/fidelity.py: five builds on each of bench/shapes/{chat-default,long-batch,chat-single}.yaml,
#    each estimated by sampled passes (what an experiment measures) and fully replayed.
# 4. bench/search_quality.py --workload per shape: an anchored sweep of the knobs that move with
#    the shape (or a recorded one, SWEEPS), a campaign from the reference on polymorph compile's
#    --device cuda budget and timeout (its defaults; CAMPAIGN_FLAGS adds flags), head to head by
#    the estimate; then bench/fidelity.py replays the campaign's kept build and the sweep's best
#    in full on the same shape; then bench/decode.py runs the kept build, the compiled peer and
#    HF compiled at the shape's concurrency and mean context, with prefills at its prompt
#    lengths, and composes each one's tok/s on the shape from those timings. The sweep screens
#    each point and measures its contenders again by the full protocol (--sweep-screen). PEERS=0
#    skips the decode step (the peers of an earlier run on the shape stand); SEARCHED=shape=F
#    skips the search (F's campaign and sweep stand) and goes to the full replays and peers.
# 5. bench/decode.py on qwen3-30b-a3b (random bf16 weights): three MoE builds (the stacked experts
#    grouped, in the Triton fused-MoE kernel, and that with the batch-1 GEMV), verified,
#    beside the MoE compiled peer and HF compiled at batch 1, 8 and 32, against the MoE roofline,
#    each row with its top kernels (--profile-batches; MOE_BATCHES=1,8 then 32 splits it over two
#    calls); then bench/search_quality.py: a sweep of
#    the MoE knobs on the fused Triton step and a campaign from the reference on polymorph
#    compile's --device cuda defaults, head to head with the sweep's best.
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
fidelity)
    F=kv_cache=static,decode_step=fused,kernels=triton,attention=sdpa,sampling=device
    timeout 570 python3 bench/fidelity.py --model llama-8b --device cuda --dtype bfloat16 \
        --shapes bench/shapes/chat-default.yaml,bench/shapes/long-batch.yaml,bench/shapes/chat-single.yaml \
        --builds "$F;$F,gemv=triton,pdl=true,residual=norm;$F,capture_buckets=max;$F,prefill=bucketed;${F/triton/torch}" \
        --full-passes 1 --out "$OUT/fidelity-llama-8b-$DATE.json"
    ;;
shapes)
    MODEL=${MODEL:-llama-8b} DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16}  # tiny, cpu, float32: a smoke run
    SHAPES=${SHAPES:-chat-single chat-default long-batch} SWEEPS=${SWEEPS:-} SEARCHED=${SEARCHED:-}
    # A paired experiment holds two builds, each with its own cache: at concurrency 32 and 4k
    # positions, llama-8b needs about 70 GB, which an 80 GB card cannot spare. There, long-batch
    # runs at concurrency 16.
    if [ "$DEVICE" = cuda ] && [ "$(python3 -c 'import torch; print(torch.cuda.get_device_properties(0).total_memory >> 30)')" -lt 100 ]; then
        SHAPES=$(for s in $SHAPES; do if [ "$s" = long-batch ]; then echo long-batch-16; else echo "$s"; fi; done)
        echo "under 100 GiB of device memory: long-batch runs as long-batch-16"
    fi
    # SWEEPS and SEARCHED (below) name a shape of this run and a recorded result each.
    for pair in ${SWEEPS//,/ } ${SEARCHED//,/ }; do
        if ! [[ " $(echo $SHAPES) " == *" ${pair%%=*} "* ]]; then
            echo "bench/h200.sh shapes: SWEEPS and SEARCHED name shapes of this run ($(echo $SHAPES)); got '${pair%%=*}'" >&2
            exit 2
        elif [ ! -f "${pair#*=}" ]; then
            echo "bench/h200.sh shapes: SWEEPS and SEARCHED name recorded results; '${pair#*=}' is not a file" >&2
            exit 2
        fi
    done
    for s in $SHAPES; do
        # SWEEPS="shape=RESULT.json,...": that shape's campaign starts from a recorded sweep (its
        # points are not measured again); SWEEP_ONLY=1 measures the sweeps alone (a shape whose
        # sweep and campaign do not fit one 10-minute call takes two).
        SWEEP=(--knobs kv_cache,decode_step,kernels,capture_buckets,prefill,gemv --skip kernels=compile
            --anchor kv_cache=static,decode_step=fused,sampling=device,attention=sdpa --sweep-timeout 60
            --sweep-screen)
        for pair in ${SWEEPS//,/ }; do
            if [ "${pair%%=*}" = "$s" ]; then SWEEP=(--sweep-from "${pair#*=}"); fi
        done
        if [ -n "${SWEEP_ONLY:-}" ]; then SWEEP+=(--sweep-only); fi
        # SEARCHED="shape=RESULT.json,...": that shape's search stands as recorded (a sweep and a
        # campaign); its kept build and sweep best go straight to the full replays and the peers.
        RESULT=""
        for pair in ${SEARCHED//,/ }; do
            if [ "${pair%%=*}" = "$s" ]; then RESULT=${pair#*=}; fi
        done
        if [ -z "$RESULT" ]; then
            RESULT="$OUT/search-quality-$MODEL-$s-$DATE.json"
            echo "$(date -u +%T) $s: search ${SWEEP[*]}"
            timeout "${SHAPE_BUDGET_S:-330}" python3 bench/search_quality.py --model "$MODEL" --device "$DEVICE" \
                --dtype "$DTYPE" --workload "bench/shapes/$s.yaml" "${SWEEP[@]}" \
                ${CAMPAIGN_FLAGS:-} --out "$RESULT" >/dev/null || echo "$s: search exited $?"
        else
            echo "$(date -u +%T) $s: the search recorded in $RESULT stands"
        fi
        if [ -n "${SWEEP_ONLY:-}" ]; then continue; fi
        KEPT=$(python3 -c '
import json, sys
doc = json.load(open(sys.argv[1]))
sets = [((doc.get("campaign") or {}).get("best") or {}).get("knobs"), ((doc.get("exhaustive") or {}).get("best") or {}).get("config")]
print(";".join(",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in s.items()) for s in sets if s))
' "$RESULT" || true)
        echo "$(date -u +%T) $s: kept ${KEPT:-nothing}; full replays"
        [ -n "$KEPT" ] && python3 bench/fidelity.py --model "$MODEL" --device "$DEVICE" --dtype "$DTYPE" \
            --shapes "bench/shapes/$s.yaml" --builds "$KEPT" --full-passes 1 \
            --out "$OUT/fidelity-$MODEL-$s-kept-$DATE.json" >/dev/null || echo "$s: fidelity exited $?"
        if [ "${PEERS:-1}" = 0 ]; then continue; fi
        echo "$(date -u +%T) $s: peers"
        # The peers at the shape: batch decode at its concurrency and its full-batch steps' mean context.
        read -r C CTX < <(python3 -c '
import statistics, sys
from polymorph.contract.steps import plan
from polymorph.contract.workload import read_workload
w = read_workload(sys.argv[1])[0]
print(w.concurrency, round(statistics.fmean(plan(w).homes)))
' "bench/shapes/$s.yaml")
        python3 bench/decode.py --models "$MODEL" --device "$DEVICE" --dtype "$DTYPE" --batches "$C" --compiled-batches "$C" --hf-batches "$C" \
            --engines polymorph,compiled-peer,hf-compiled --prompt "$CTX" --steps 128 --profile-batches "$C" \
            --workload "bench/shapes/$s.yaml" --knobs "${KEPT%%;*}" --budget-s "${DECODE_BUDGET_S:-240}" --json \
            --out "$OUT/decode-$MODEL-$s-$DATE.json" >/dev/null || echo "$s: decode exited $?"
    done
    ;;
moe)
    MODEL=${MODEL:-qwen3-30b-a3b} DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16}  # qwen3-moe-tiny, cpu, float32: a smoke run
    F=kv_cache=static,decode_step=fused,kernels=triton,attention=sdpa,sampling=device,moe_routing=fused
    PART=${2:-all}
    case "$PART" in all | decode | search) ;; *) echo "bench/h200.sh moe: the part must be decode or search; got $PART" >&2; exit 2 ;; esac
    if [ "$PART" != search ]; then
        echo "$(date -u +%T) moe: decode"
        B=${MOE_BATCHES:-1,8,32}  # the peers compile for 75-111 s a batch: MOE_BATCHES=1,8, then 32, fits two calls
        python3 bench/decode.py --models "$MODEL" --device "$DEVICE" --dtype "$DTYPE" --batches "$B" \
            --compiled-batches "$B" --hf-batches "$B" --engines polymorph,compiled-peer,hf-compiled \
            --steps 128 --verify --profile-batches "$B" --budget-s "${DECODE_BUDGET_S:-300}" --json \
            --knobs "$F,moe_experts=grouped;$F,moe_experts=triton;$F,moe_experts=triton,gemv=triton" \
            --out "$OUT/decode-$MODEL-$DATE${MOE_BATCHES:+-b${MOE_BATCHES//,/-}}.json" >/dev/null || echo "moe: decode exited $?"
    fi
    if [ "$PART" != decode ]; then
        echo "$(date -u +%T) moe: search"
        # The sweep varies the MoE knobs on the fused Triton step ($F); the loop (every expert
        # over every row in a captured step) is left out. SWEEP_ONLY=1 stops after it, and
        # SWEEP_FROM=RESULT.json runs the campaign from a recorded one (two calls of 10 minutes).
        # MOE_SWEEP_KNOBS narrows the sweep (e.g. moe_experts,gemv: the fused routing stays).
        SWEEP=(--sweep-base "$F" --knobs "${MOE_SWEEP_KNOBS:-moe_experts,moe_routing,gemv}" --skip moe_experts=loop
            --anchor "$F,moe_experts=triton" --sweep-timeout 90)
        if [ -n "${SWEEP_FROM:-}" ]; then SWEEP=(--sweep-from "$SWEEP_FROM"); fi
        if [ -n "${SWEEP_ONLY:-}" ]; then SWEEP+=(--sweep-only); fi
        timeout "${SHAPE_BUDGET_S:-240}" python3 bench/search_quality.py --model "$MODEL" --device "$DEVICE" \
            --dtype "$DTYPE" "${SWEEP[@]}" ${CAMPAIGN_FLAGS:-} \
            --out "$OUT/search-quality-$MODEL-$DATE.json" >/dev/null || echo "moe: search exited $?"
    fi
    ;;
*)
    echo "usage: bash bench/h200.sh search | decode SEARCH_QUALITY_JSON | all | fidelity | shapes | moe [decode|search]" >&2
    exit 2
    ;;
esac
