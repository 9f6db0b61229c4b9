#!/usr/bin/env bash
# Issue 35's goals on a CUDA GPU: the 48-layer checkpoint under the routing model's profiles,
# mlx-lm resident beside the slot path at 12.5 / 25 / 50% of the experts, in one machine session.
#
#   bash bench/cuda_goals.sh setup WHEELS_DIR      # install (cuda_check.sh install), the 48-layer
#                                                  # checkpoint, a carried PTX cache if any
#   bash bench/cuda_goals.sh decode OUT PROFILE... # per profile: mlx-lm, then the slot path at
#                                                  # WAYS (default "staged gathered") x SHARES
#                                                  # (default "12 25 50" % of the 15.19 GiB of
#                                                  # experts); ALL=1 adds every expert
#   bash bench/cuda_goals.sh prefill OUT           # 64- and 2k-token prompts at 25% (PROMPTS=64)
#   bash bench/cuda_goals.sh variant OUT NAME CODE PROFILE...  # gathered at SHARES, CODE (Python)
#                                                  # run first, e.g. the settle's copies on the copy
#                                                  # engine (the tree before SlotFill): NAME copies,
#                                                  # CODE "from streamer.cache import settle;
#                                                  # settle.FILL_ON_GPU = False"; the pool left in
#                                                  # host memory: "from streamer.cache import
#                                                  # slot_memory; slot_memory.on_gpu = lambda r: None"
#   bash bench/cuda_goals.sh rounds OUT PROFILE SHARE [NAME=CODE]...  # ROUNDS (default 2)
#                                                  # rounds of mlx-lm, gathered at SHARE and each
#                                                  # variant, interleaved: a lent machine's rate
#                                                  # drifts by up to 1.8x within one call, so a
#                                                  # ratio is taken within its round (tags -rN)
#   bash bench/cuda_goals.sh paired OUT PROFILE SHARE [NAME=CODE]...  # bench/paired.py: mlx-lm
#                                                  # and gathered at SHARE in one process, PAIRS
#                                                  # (default 6) prompts ABBA, then each variant
#                                                  # likewise: ratios a drifting machine keeps
#   bash bench/cuda_goals.sh profile OUT           # one gathered run at 25% under cProfile (the
#                                                  # host's time: a token is host-bound there)
#   bash bench/cuda_goals.sh ptx OUT               # the PTX cache as a tar, to carry next time
#   python3 bench/goals_table.py OUT/*.json        # the table (here or there)
#
# Each run is bench/worker.py in its own process under `timeout`, --routing PROFILE (the same
# experts in both engines), greedy, 2 prompts of DECODE tokens after a warm-up (the first 64 of
# each reported apart as its cold start), its RssFile peak sampled every 20 ms.
set -uo pipefail
cd "$(dirname "$0")/.."
DATA=/root/bench-data SITE=/root/site
DECODE=${DECODE:-128}
declare -A MIB=([12]=1944 [25]=3889 [50]=7777 [all]=24576)  # shares of 15554 MiB of experts

worker() {  # out tag engine folder args...: one run, its JSON and log in out
  local out=$1 tag=$2
  shift 2
  timeout "${RUN_TIMEOUT:-150}" python3 "${WORKER[@]:-bench/worker.py}" "$@" \
    > "$out/$tag.json" 2> "$out/$tag.log"
  echo "$tag: exit $? $(grep -E 'prompt [0-9]+:' "$out/$tag.log" | tr '\n' ' ')"
}

case "${1:-}" in
setup)
  bash bench/cuda_check.sh install "$2" || exit 1
  if [ -f build/ptx-cache.tar ]; then mkdir -p /root/ptx-cache && tar xf build/ptx-cache.tar -C /root/ptx-cache; fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  bash bench/cuda_check.sh data48
  ;;
decode)
  source <(sed -n '/^env_setup()/,/^}/p' bench/cuda_check.sh) && env_setup
  out=$2
  shift 2
  mkdir -p "$out"
  for profile in "$@"; do
    args=(--prompt-tokens 16 --decode-tokens "$DECODE" --repeats 2 --warmup --temp 0 --routing "$profile")
    worker "$out" "$profile-mlx_lm" mlx_lm "$DATA/q48-mlx" "${args[@]}"
    for way in ${WAYS:-staged gathered}; do
      for share in ${SHARES:-12 25 50}; do
        worker "$out" "$profile-$way-$share" streamer "$DATA/q48-stream" "${args[@]}" \
          --read-path slots --memory-budget $((MIB[$share] << 20)) --cuda-misses "$way"
      done
    done
    [ -n "${ALL:-}" ] && worker "$out" "$profile-all" streamer "$DATA/q48-stream" "${args[@]}" \
      --read-path slots --memory-budget $((MIB[all] << 20))
  done
  ;;
prefill)
  source <(sed -n '/^env_setup()/,/^}/p' bench/cuda_check.sh) && env_setup
  out=$2
  mkdir -p "$out"
  args=(--prompt-tokens "${PROMPTS:-64,2048}" --decode-tokens 4 --repeats 2 --warmup --temp 0 --routing medium)
  worker "$out" prefill-mlx_lm mlx_lm "$DATA/q48-mlx" "${args[@]}"
  for way in ${WAYS:-staged gathered}; do
    worker "$out" "prefill-$way-25" streamer "$DATA/q48-stream" "${args[@]}" \
      --read-path slots --memory-budget $((MIB[25] << 20)) --cuda-misses "$way"
  done
  ;;
variant)  # the gathered slot path at SHARES with CODE run first (a constant of the tree changed)
  source <(sed -n '/^env_setup()/,/^}/p' bench/cuda_check.sh) && env_setup
  out=$2 name=$3 code=$4
  shift 4
  mkdir -p "$out"
  WORKER=(-c "import sys; sys.path[:0] = ['bench']
$code
import worker
worker.main(sys.argv[1:])")
  for profile in "$@"; do
    args=(--prompt-tokens 16 --decode-tokens "$DECODE" --repeats 2 --warmup --temp 0 --routing "$profile")
    for share in ${SHARES:-12 25 50}; do
      worker "$out" "$profile-gathered-$share-$name" streamer "$DATA/q48-stream" "${args[@]}" \
        --read-path slots --memory-budget $((MIB[$share] << 20)) --cuda-misses gathered
    done
  done
  ;;
rounds)  # mlx-lm, gathered and each NAME=CODE variant at one share, round after round
  source <(sed -n '/^env_setup()/,/^}/p' bench/cuda_check.sh) && env_setup
  out=$2 profile=$3 share=$4
  shift 4
  mkdir -p "$out"
  args=(--prompt-tokens 16 --decode-tokens "$DECODE" --repeats 2 --warmup --temp 0 --routing "$profile")
  slots=(--read-path slots --memory-budget $((MIB[$share] << 20)) --cuda-misses gathered)
  for round in $(seq 1 "${ROUNDS:-2}"); do
    worker "$out" "$profile-mlx_lm-r$round" mlx_lm "$DATA/q48-mlx" "${args[@]}"
    worker "$out" "$profile-gathered-$share-r$round" streamer "$DATA/q48-stream" "${args[@]}" "${slots[@]}"
    for variant in "$@"; do
      WORKER=(-c "import sys; sys.path[:0] = ['bench']
${variant#*=}
import worker
worker.main(sys.argv[1:])")
      worker "$out" "$profile-gathered-$share-${variant%%=*}-r$round" streamer "$DATA/q48-stream" \
        "${args[@]}" "${slots[@]}"
      WORKER=()
    done
  done
  ;;
paired)  # mlx-lm and gathered in one process, prompt by prompt; then each NAME=CODE variant
  source <(sed -n '/^env_setup()/,/^}/p' bench/cuda_check.sh) && env_setup
  out=$2 profile=$3 share=$4
  shift 4
  mkdir -p "$out"
  for variant in gathered="" "$@"; do
    tag="$profile-paired-$share-${variant%%=*}"
    timeout "${RUN_TIMEOUT:-600}" python3 bench/paired.py "$DATA/q48-mlx" "$DATA/q48-stream" \
      --routing "$profile" --memory-budget $((MIB[$share] << 20)) --pairs "${PAIRS:-6}" \
      --cuda-misses gathered --setup "${variant#*=}" > "$out/$tag.json" 2> "$out/$tag.log"
    echo "$tag: exit $? $(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["summary"])' "$out/$tag.json" 2>&1 | tail -1)"
  done
  ;;
profile)  # where the host's time goes: one gathered run at 25% under cProfile, the top functions
  source <(sed -n '/^env_setup()/,/^}/p' bench/cuda_check.sh) && env_setup
  out=$2
  mkdir -p "$out"
  WORKER=(-m cProfile -o "$out/profile.pstats" bench/worker.py)
  worker "$out" "${PROFILE:-medium}-gathered-25-profiled" streamer "$DATA/q48-stream" \
    --prompt-tokens 16 --decode-tokens "$DECODE" --repeats 1 --warmup --temp 0 \
    --routing "${PROFILE:-medium}" --read-path slots --memory-budget $((MIB[25] << 20)) \
    --cuda-misses gathered
  python3 -c "import pstats, sys; s = pstats.Stats(sys.argv[1]); \
s.sort_stats('tottime').print_stats(40); s.sort_stats('cumulative').print_stats(60)" \
    "$out/profile.pstats" > "$out/profile.txt" 2>&1
  ;;
ptx)
  mkdir -p "$2" && tar cf "$2/ptx-cache.tar" -C /root/ptx-cache . && ls -la "$2/ptx-cache.tar"
  ;;
*)
  echo "usage: $0 setup WHEELS_DIR | decode OUT PROFILE... | prefill OUT |" \
    "variant OUT NAME CODE PROFILE... | rounds OUT PROFILE SHARE [NAME=CODE]... |" \
    "paired OUT PROFILE SHARE [NAME=CODE]... |" \
    "profile OUT | ptx OUT" >&2
  exit 2
  ;;
esac
