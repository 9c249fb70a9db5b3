#!/usr/bin/env bash
# The H200 runs owed by the CPU-only sessions of 2026-12-04 and -05 (experiments/NOTES.md "The
# verify's launches cut again, and a skinny GEMM for the decode" and "The launches around the
# projections fused"), one device call each (each job under
# the 10 minutes a call may run), in the order their results are needed. Done since: tests
# (R-10, R-16), steps (R-11 to R-15, other variants), knee for 9B (R-14); still owed: knee for 9B
# again (its record now carries the fused GDN decode by batch and the attention over the cache
# by batch, kv and tokens: the estimate's gdn_decode_cells and attention_cells, re-derived by
# calibrate.components.factors) and 27B, gemm at 27B and 4B, kernels; split (the
# split verify, fourth session, CPU only: run it first, it decides issue 32's next step);
# deferred (the deferred write against the ring, fifth session, CPU only: second).
#
# Done since on an H100 (experiments/README.md S5-a to S5-c, fifth session): split, deferred's
# bench and GPU test, pytest -m gpu (before factors=False). Done since on the H200 (S6-a, S6-b,
# sixth session): tests with factors=False (63 passed), the random grid (flagged: the bench's
# own defect, fixed after; run it again). Done since on the H200 (S7-a to S7-d, seventh
# session): kernels (the clean grid, chains against the ring, the big-tree table); on an H100
# (S7-f): a reduced knee for 9B (the H200's is still owed). On an H100 (S8-a to S8-f, eighth
# session): decode's sweep (9B, 27B; it set limits.GDN_DECODE_LAUNCH), the step bench with the
# rule, pytest -m gpu; all still owed on the H200. Done since on the H200 (S9-f to S9-h, ninth
# session): decode (9B; 27B at batch 1-16), the cache attention's launch sweep (its rule), the
# step bench's production at batch 1 / 16 and the 9B verify. Still owed: knee (its attention rows
# now at S9-f's rule), the GPU suite with that rule, and the rest below. Tenth session: every call
# came on an H100 (S10-a to S10-c: the GPU suite with the rule, 67 passed; the one-row default
# now takes out_proj, o_proj and down too). Still owed on the H200, first: steps (production
# against production-s9), calibrate --measure for 4B, 9B and 27B on that default, knee for 9B;
# experiments/derive_factors.py then shows the new factors to write into costmodel.py (and
# calibrate.components.H200_RECORDS names the new records). Eleventh session, an H100 (S11-a):
# the state's row stride a constant, shipped (the decode always, the replay commit up to 32 path
# nodes); decode now times the rule's bound on the H200. Twelfth session, an H100 (S12-a): profiles
# on the card the call got, shipped as profiles/h100/. Thirteenth session, the H200 (S13-a): profiles,
# shipped as profiles/h200/ (a fresh machine compiles for minutes first, so a call holds two models
# at their 250 s timeouts: PROFILE_MODELS="4B 9B", then "27B"). Fourteenth and fifteenth sessions, an H100
# (S14-a, S15-a): check for 9B and 27B, both presets, and the GPU suite (71 passed). Fifteenth session,
# an H100 (S15-b): the cache attention's one-tile rule for 17-64 rows over many keys, a change
# to the step at batch 4-16 and long contexts: on the H200 the attention sweep first, then
# profiles (all three models), knee, check. Sixteenth session, an H100 again (S16-a to S16-c):
# the attention job's big-tree part, the one-tile threshold on the keys read again and 64-row
# tiles for big trees over long caches (both rule changes), the GPU suite (74 passed), and
# profiles/h100/ re-measured for 9B and 27B. Seventeenth session, an H100 again (S17-a to
# S17-d): attention64 (the rule retuned at exactly 64 rows and 64 tiles), the GPU suite with
# S16-b (past 330 s on a fresh machine: its job now prints durations), the 4B profile on the
# H100, check for 9B (both presets) and 27B (mbpp) on the new H100 profiles. Eighteenth session, an
# H100 (S18-a to S18-c): the GPU suite with S17-a (184 s from cold), check for 27B paper-cnndm, the
# H100 profiles (4B, 9B, 27B) at S17-a. Nineteenth session, an H100 (S19-a): the GPU suite on the
# eighteenth session's last commit (237 s from cold). Twentieth session, an H100 (S20-a): the GPU
# suite on the nineteenth session's last commit (218 s from cold). Twenty-first session, an H100 (S21-a):
# the commits' target clamp against the unclamped commits and the GPU suite (238 s from cold).
# Twenty-second session, an H100 (S22-a): accepted compared at its width against the truncating
# commits and the GPU suite (201 s from cold); then the H200 at last, for 300 s (S22-b, S22-c):
# attention64, and the attention job's 27B rows a tile before the budget ran out. On the H200,
# first the rest of the attention job (ATTENTION_MODELS=9b: 9B's rows a tile and 27B's big trees;
# its log ends with `experiments/attention_rule.py` on its records: the rule against S9-f's and
# the fastest launch, per cell: retune if it loses there; S22-c's 27B losses split by form, tree
# or drafter level, NOTES "The attention's rule on the H200 at last": key the threshold on it),
# then profiles, knee, check, tests. Twenty-third session (S23-a, no machine for its first hour):
# the threshold keyed on the form and the batch, judged on the committed sweeps; 9B's rows a tile
# on the H200 is its out-of-sample test (NOTES "The one-tile threshold by form and batch").
# Twenty-sixth session, the H200 (S26-a to S26-d): attention (9B's rows a tile, 27B's big trees),
# profiles (shipped), knee (committed; its factors not adopted until `steps` re-derives the
# launches: NOTES "The H200 profiles, knee and GPU suite on the step as of S23"), tests.
# Twenty-seventh session, an H100 (S27-a to S27-c): steps, tests and whole (9B and 27B at batch
# 1) on the H100. Twenty-eighth session, an H100 again (S28-a to S28-f): whole (twice: before
# and after the drafter's two-launch top-k), e2e (9B and 27B, both presets; the job is new),
# tests. Still owed on the H200, first: whole (the whole step against its kernels, the
# drafter's levels, full vocabulary and 32k head: issue 31's two targets), steps (its split,
# then the factors), check, e2e (README's two tables are an H100's), profiles (the drafter's
# level is 0.05 ms faster since S28-c: the shipped profiles' drafting is about 5% high).
# Twenty-ninth session, an H100 again (S29-a to S29-e): whole and tests on 8704e39, e2e with the
# 32k head (9B both presets, 27B mbpp; batch 1-16), profiles/h100/ re-measured and shipped, check
# at batch 1 (9B mbpp also batch 4) on them. Still owed on the H200: as above; then the 32k
# head's own profile and check (calibrate --draft-vocab, new: PROFILE_DRAFT_VOCAB=32768 and
# CHECK_DRAFT_VOCAB=32768; a hot-token profile ships beside the full one, Qwen3.5-9B-vocab32768.yaml).
# Thirtieth session: no command ran (eighteen calls, 1546 s of the budget spent on refused starts);
# all of the above still owed. Thirty-first session, an H100 (S31-a): the 32k head's check for 9B at batch 1
# (CHECK_DRAFT_VOCAB=32768 CHECK_BATCH=1), its calibrate --measure included; its batch 4 and 16, cnndm,
# 27B and every H200 figure above still owed. Thirty-second session, an H100 (S32-a, S32-b): the accepted
# path's walk in one launch (kernels/tree_accept.py; whole_step_bench times the sample phase alone), then the
# 32k head's check at 9B mbpp batch 1 / 4 / 16, 9B cnndm batch 1 / 4, 27B mbpp batch 1 / 4 (one call each,
# 126-244 s warm); still owed on an H100: 9B cnndm batch 16, 27B cnndm, 27B batch 16; every H200 figure above.
# Thirty-third session: fifteen calls refused (1486 s of the budget), then an H100 for the
# last 314 s (S33-a): tree_accept's GPU tests and the new sanitize job (its garbage-table test
# under memcheck: clean; S32's surviving mutant caught). Every H200 figure above still owed.
# Thirty-fourth session: no command ran (six refused starts, 90-180 s each, and one call turned
# away in a cooling window, 646 s of the budget in all; then loans were paused for the rest of
# the session). Everything above still owed, in the order below. Thirty-fifth session: seven refused
# starts (901 s of the budget), then an H100 (S35-a): the 32k head's check at 9B cnndm batch 16 and
# 27B cnndm batch 1 / 4 (185, 248, 178 s); still owed on an H100: 27B batch 16, both presets
# (CHECK_MODEL=27B CHECK_PRESET=P CHECK_DRAFT_VOCAB=32768 CHECK_BATCH=16); every H200 figure above.
# Thirty-sixth session: no command ran (seventeen calls over two hours, each refused or turned away
# in a cooling window, 1426 s of the budget; the last 374 s could not start a machine). All of the
# above still owed, in the order below. Thirty-seventh session: one refused start (181 s of the
# budget), then loans were paused for the rest of the session; all of the above still owed, and a new job,
# memory (any card; calibrate's measured forward now drops its drafters before each verify: NOTES "The
# estimate's GPU memory"), before the estimate's memory check is changed.
# Run the rest in this order (a
# session's 30 device minutes hold about the first three; minutes are the jobs' timeouts, each call also pays the
# machine's start, and a refused start costs 1.5-3.5 minutes):
#
#   ATTENTION_MODELS=9b bash experiments/owed_h200.sh attention # done on the H200 (S26-a, 2.5 min): the cache
#                                          #   attention's rows a tile (S15-b's sweep), 9B (27B's: S22-c);
#                                          #   27B's 16-48-token trees by target programs
#   bash experiments/owed_h200.sh attention64 # done on the H200 (S22-b, 80 s): 49-64 rows, the rule's launches
#   bash experiments/owed_h200.sh decode   # ~5 min: the fused GDN decode by launch (split x warps) and batch,
#                                          #   SGLang's decode beside it: 9B, 27B; the replay commit's row
#                                          #   stride an argument / a constant / the rule, chains of 2-64
#                                          #   (NOTES "The state's row stride a constant")
#   bash experiments/owed_h200.sh knee     # done S26-c (3.2 min): GEMM knee, GDN decode by value split, cache attention
#                                          #   (target and drafter forms): 9B, 27B
#   bash experiments/owed_h200.sh profiles # ~9 min: bole calibrate --measure, 4B, 9B, 27B (ship to profiles/h200/;
#                                          #   done S26-b: again only after a change to the step); two calls:
#                                          #   PROFILE_MODELS="4B 9B", then PROFILE_MODELS=27B (up to 450 s)
#   bash experiments/owed_h200.sh check    # ~10 min: check_decision.py on profiles/<gpu>/ (R-8's form; CHECK_MODEL=9B,
#                                          #   CHECK_PRESET=paper-mbpp; then cnndm, then 27B)
#   bash experiments/owed_h200.sh whole    # ~5 min: whole_step_bench, 9B at batch 1 and 4, 27B at batch 1
#   bash experiments/owed_h200.sh steps    # ~9 min: runtime_step_bench, cublas / production / production-s9
#   E2E_MODEL=9b E2E_PRESET=paper-mbpp bash experiments/owed_h200.sh e2e  # ~3 min on an H100 (27B
#                                          #   2.5 min): bole bench e2e, every decoder, batch 1-64; a call a
#                                          #   model and preset (README's two e2e tables)
#   bash experiments/owed_h200.sh split    # ~6 min: the split verify on the H200 (S5-c was an H100)
#   bash experiments/owed_h200.sh deferred # ~8 min: the deferred write's GPU test on the H200 (its bench: S7-c)
#   bash experiments/owed_h200.sh gemm     # ~9 min: the skinny GEMM against cuBLAS, 9B, 27B and 4B
#   bash experiments/owed_h200.sh sanitize # ~2 min: tree_accept's garbage-table GPU test under memcheck
#   bash experiments/owed_h200.sh tests    # ~7 min: python -m pytest -m gpu (after any kernel change)
#   bash experiments/owed_h200.sh memory   # ~8 min, any card (new, thirty-seventh session): what calibrate --measure
#                                          #   holds (graph pools, the context) against the estimate's count: 27B on
#                                          #   calibrate's grid, 9B batch 16 over 16384 (NOTES "The estimate's GPU memory")
#   bash experiments/owed_h200.sh tune     # ~9 min: bole tune-kernels as served (the verify without its
#                                          #   factors, the replay commit): the H200 table again
#
# A job works in /tmp/owed/<job> and leaves one tarball and its log in $OUT (the device's
# return folder, which brings back at most 8 files; ./out-owed elsewhere). Carry `.whl` for the
# SGLang baselines (BOLE_SGLANG_WHEEL); its py/ folder holds Optuna's wheels for the tune job and
# the GPU suite's tuning test (the device has no Optuna and no network), fetched here with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl/py optuna==5.1.0 colorlog alembic sqlalchemy mako greenlet
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=.  # the device has no install of the package (R-9 lost a sweep to it)
PY=${PYTHON:-python3}
OUT=${OUT:-out-owed}
job=${1:?usage: bash experiments/owed_h200.sh attention|attention64|decode|tests|sanitize|gemm|whole|steps|knee|profiles|check|e2e|kernels|split|deferred|tune|memory}
dir="/tmp/owed/$job"
mkdir -p "$dir" "$OUT"
log="$dir/run.log"
run() { echo "+ $*" | tee -a "$log"; "$@" >>"$log" 2>&1; echo "rc=$? $(date +%T)" | tee -a "$log"; }
$PY -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" >>"$log" 2>&1
# the records are named by the card that made them (a call may get an H100 in place of the H200)
gpu=$($PY -c "import torch; n = torch.cuda.get_device_name(); print('h100' if 'H100' in n else 'h200')" 2>/dev/null || echo h200)

if ls .whl/py/*.whl >/dev/null 2>&1 && ! $PY -c "import optuna" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/py/*.whl \
    && export PYTHONPATH=.:/tmp/site
fi
# the replay commit's row-stride rule on both sides of its bound (32 path nodes)
ROW_CASES=1x2:chain,1x8:chain,1x16:chain,1x32:chain,1x64:chain,16x4:chain,16x8:chain,16x16:chain,16x32:chain
ROW_CASES=$ROW_CASES,16x64:chain,64x2:chain,64x8:chain,1x16,16x16,16x64,64x64
# the cache attention's launches of S15-b's sweep (the rule's 16-row ones first: the reference)
ATTN_LAUNCHES=64x4x3x128x128x16,64x4x2x132x128x16,64x8x2x128x128x32,32x4x3x128x128x32,32x8x3x128x128x64
ATTN_LAUNCHES=$ATTN_LAUNCHES,32x8x3x264x256x64,64x8x2x264x256x32
case "$job" in
  attention)
    for m in ${ATTENTION_MODELS:-27b 9b}; do  # S22-c ran 27B's: ATTENTION_MODELS=9b for the rest
      run timeout 190 $PY experiments/component_bench.py --model "$m" --parts attention --attention-batch 1,4,16 \
        --attention-kv 1024,4096,16384 --attention-tokens 1,4,8 --attention-launches "$ATTN_LAUNCHES" \
        --out "$dir/$gpu-$m-attention-rows-tile.json"
    done
    # 27B's bigger trees (96-288 rows): the 16-row launch's 144 programs on 132 SMs at batch 1
    # (two waves, experiments/NOTES.md "27B's attention reads its keys"): fewer target programs
    run timeout 150 $PY experiments/component_bench.py --model 27b --parts attention --attention-batch 1,4,16 \
      --attention-kv 1024,4096,16384 --attention-tokens 16,32,48 \
      --attention-launches 64x4x3x128x128x16,64x4x3x96x128x16,64x4x3x66x128x16,64x4x2x132x128x16,32x8x3x264x256x64 \
      --out "$dir/$gpu-27b-attention-big-trees.json" ;;
  attention64)  # the 49-64 rows (27B's 10 tokens, 9B's 16), where S16-a's formula takes one tile from a
                # third of the keys: the rule's four launches (an H100 timed them, S17-a; the H200, S22-b)
    for mt in 27b:10 9b:16; do
      run timeout 150 $PY experiments/component_bench.py --model "${mt%%:*}" --parts attention --attention-batch 1,4,16 \
        --attention-kv 1024,4096,16384 --attention-tokens "${mt#*:}" \
        --attention-launches 64x4x3x128x128x16,64x4x2x132x128x16,32x8x3x128x128x64,32x8x3x264x256x64 \
        --out "$dir/$gpu-${mt%%:*}-attention-rows64.json"
    done ;;
  tests)
    # the durations say what to cut if it grows: a fresh H100 ran past 330 s (S17-b), another 184 s (S18-a)
    run timeout 420 $PY -m pytest -q -m gpu tests/ -p no:cacheprovider --durations=25 ;;
  sanitize)  # the accepted path's walk under compute-sanitizer's memcheck, each tensor its own allocation
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 run timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 \
      $PY -m pytest -q -m gpu tests/test_tree_accept.py -k garbage -p no:cacheprovider ;;  # no graphs without the caching allocator
  gemm)
    run timeout 520 $PY experiments/skinny_mm_bench.py --models 9b,27b,4b --grid-rows 1,64 \
      --out "$dir/skinny-$gpu.json" ;;
  whole)  # the whole speculative step against its kernels' sum; the drafter's levels against their floor
    run timeout 280 $PY experiments/whole_step_bench.py --model 9b --batch 1,4 --out "$dir/whole-step-$gpu-9b.json"
    run timeout 250 $PY experiments/whole_step_bench.py --model 27b --batch 1 --out "$dir/whole-step-$gpu-27b.json" ;;
  steps)
    run timeout 540 $PY experiments/runtime_step_bench.py --models 4b,9b,27b --batch 1,16 \
      --variants cublas,production,production-s9 --out "$dir/steps-$gpu.json" ;;
  decode)
    run timeout 200 $PY experiments/component_bench.py --model 9b --parts gdn_decode --sglang \
      --decode-batch 1,4,16,64 --decode-launches 4x1,4x2,8x2 --out "$dir/$gpu-9b-decode.json"
    run timeout 150 $PY experiments/component_bench.py --model 27b --parts gdn_decode --sglang \
      --decode-batch 1,4,16,64 --decode-launches 4x1,4x2,8x2 --out "$dir/$gpu-27b-decode.json"
    for layers in 1 24; do  # the replay commit's row stride by path length (limits.REPLAY_CONST_ROW_PATH)
      run timeout 150 $PY experiments/ab_kernels.py replay r-row-arg r-row-const --layers "$layers" \
        --cases "$ROW_CASES" --out "$dir/$gpu-replay-row-stride-$layers.json"
    done ;;
  knee)
    for m in 9b 27b; do
      run timeout 260 $PY experiments/component_bench.py --model "$m" --decode-launches 1x8,4x2,8x2 \
        --rows 1,2,4,8,16,24,32,48,64,96,128,160,192,256,320,384,512,768,1024,2048,4096 --out "$dir/$gpu-$m.json"
    done ;;
  kernels)
    run timeout 200 $PY -m bole_cli bench kernels --model 9b --trees random --batch 1,4,16 --nodes 16,32,64 \
      --tag kernels-served-$gpu-c12 --out-dir "$dir"
    run timeout 260 $PY -m bole_cli bench kernels --model 9b --trees chain --batch 1,4,16,64 --nodes 2,4,8,16 \
      --tag chains-served-$gpu-c12 --out-dir "$dir"
    run timeout 130 $PY -m bole_cli bench kernels --model 9b --trees chain --batch 1,16,64 --nodes 128,256 \
      --no-sglang --tag chains-big-$gpu-c12 --out-dir "$dir" ;;
  profiles)  # bole calibrate --measure as R-15 / R-16 ran it, on the card the call got (profiles/<gpu>/)
    mkdir -p "$dir/$gpu"
    for m in ${PROFILE_MODELS:-4B 9B 27B}; do
      # 27B took 257 s with its kernels compiled on an H100 and ran past 250 s on a fresh one (S16-c):
      # give it a call of its own (PROFILE_MODELS=27B)
      limit=250; [ "$m" = 27B ] && limit=450
      # -k: a 27B run once stopped by INT on a fresh machine left no line at all (S16-c): if it
      # hangs, KILL follows, so the log still says rc and the next model runs
      v=${PROFILE_DRAFT_VOCAB:-}  # a hot-token head's profile: beside, never over, the full one
      run timeout -k 30 -s INT $limit $PY -m bole_cli calibrate --gpu "$gpu" --model "$m" --batch 1,4,16 --kv 1024,4096,16384 \
        --measure --repeats 3 --warmup 2 --no-plot ${v:+--draft-vocab "$v"} --out "$dir/$gpu/Qwen3.5-$m${v:+-vocab$v}.yaml"
    done ;;
  check)  # the decision check (R-8's form) on the shipped profile of the card the call got; a fresh
           # machine compiles first, so one model and one preset a call
    # CHECK_DRAFT_VOCAB: the hot-token head, calibrated in the check's own run
    m=${CHECK_MODEL:-9B}; a=${CHECK_PRESET:-paper-mbpp}; v=${CHECK_DRAFT_VOCAB:-}
    if [ -n "$v" ]; then src=(--draft-vocab "$v" --gpu "$gpu"); else src=(--profile "profiles/$gpu/Qwen3.5-$m.yaml"); fi
    # with v, calibrate runs first (up to 200 s): batch 1 and 4 fit the call, 16 a call of its own
    b=${CHECK_BATCH:-1,4,16}; [ -n "$v" ] && b=${CHECK_BATCH:-1,4}
    run timeout 560 $PY experiments/check_decision.py --model "$m" --batch "$b" --context 4096 \
      "${src[@]}" --acceptance "$a" \
      --tree-shapes 3x2,4x4,6x2,6x4,8x4 --e2e-timeout 165 --out "$dir/$gpu-$m-$a${v:+-vocab$v}"
    cp "$dir/$gpu-$m-$a${v:+-vocab$v}/check.json" "$OUT/check-$gpu-$m-$a${v:+-vocab$v}.json" 2>/dev/null ;;
  e2e)  # bole bench e2e on the current step, every decoder (README's two e2e tables); one model and
         # one preset a call (E2E_MODEL=9b|27b, E2E_PRESET=paper-mbpp|paper-cnndm); E2E_DRAFT_VOCAB=32768:
         # the drafter's 32k hot-token head (its cost only: the acceptance stays the preset's)
    m=${E2E_MODEL:-9b}; a=${E2E_PRESET:-paper-mbpp}; v=${E2E_DRAFT_VOCAB:-}
    run timeout -k 20 -s INT 540 $PY -m bole_cli bench e2e --model "$m" --batch ${E2E_BATCH:-1,4,16,64} --context 4096 \
      --acceptance "$a" --steps 16 --warmup 2 --no-max-batch --out-dir "$dir" ${v:+--draft-vocab "$v"} \
      --tag "e2e-$gpu-$m-${a#paper-}${v:+-vocab$v}" ;;
  split)
    run timeout 360 $PY experiments/split_bench.py --out "$dir/split-$gpu.json"
    run timeout 200 $PY -m pytest -q -m gpu tests/test_precision_contract.py -p no:cacheprovider ;;
  deferred)
    run timeout 300 $PY -m bole_cli bench kernels --model 9b --trees chain --batch 1,4,16,64 --nodes 2,4,8 \
      --tag chains-deferred-$gpu --out-dir "$dir"
    run timeout 200 $PY -m pytest -q -m gpu tests/test_deferred_write.py -p no:cacheprovider ;;
  memory)  # what calibrate --measure holds against the estimate's count, calibrate's own sweep (any card:
           # the footprint is the card's; 27B's batch 16 over 16384 is the H100's one out-of-memory cell)
    # 27B over calibrate's whole grid (its drafters and graphs held as a real run holds them), then 9B's biggest cell
    run timeout 400 $PY experiments/memory_fit.py --model 27b --out "$dir/memory-$gpu-27b.json"
    run timeout 140 $PY experiments/memory_fit.py --model 9b --batch 16 --kv 16384 --out "$dir/memory-$gpu-9b.json" ;;
  tune)
    run timeout 560 $PY -m bole_cli tune-kernels --model 4b,9b,27b --nodes 16,32,64 --trials 10 --max-minutes 8 \
      --profile "$dir/kernels.yaml" --report "$dir/tune-kernels-$gpu.json" ;;
  *) echo "unknown job $job" >&2; exit 2 ;;
esac
case "$job" in  # the launch rule judged on the sweep just made (the cells where it loses, then geomeans)
  attention|attention64)
    for f in "$dir"/$gpu-*-attention-*.json; do run $PY experiments/attention_rule.py "$f"; done ;;
esac
cp "$log" "$OUT/$job.log"
tar -C /tmp/owed -czf "$OUT/$job.tar.gz" "$job" && echo "wrote $OUT/$job.tar.gz"
