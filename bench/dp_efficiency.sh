#!/usr/bin/env bash
# Data-parallel efficiency on this machine's 2 cores: meshtrain --dp 2 against PyTorch DDP.
#
#   bench/dp_efficiency.sh [--reps N] [--steps N] [--reverse] [--data FILE] [MODEL ...]
#
# MODEL: gpt-4l-256 (bench/configs/gpt-4l-256.json: 4 layers, d=256, 4 heads, vocab 256; B=16 T=128,
# 20 steps) and gpt2-124m (B=4 T=64, 6 steps); default both. Each step count includes WARMUP=2
# untimed steps; --steps N sets it for every model (a quick check: --steps 4). Per model and rep, the runs alternate between the two programs:
#   meshtrain --dp 1 --threads 2 | PyTorch 1 process, intra-op 1 + OpenBLAS 2 |
#   meshtrain --dp 2 --threads 1 | PyTorch DDP gloo 2 processes x 1 thread |
#   PyTorch 1 process, intra-op 2 + OpenBLAS 1 |
#   meshtrain --dp 1 --threads 1 on B/2 rows | PyTorch 1 process x 1 thread on B/2 rows |
#   two of those meshtrain runs at once | two of those PyTorch runs at once
# (the order reversed on even reps; --reverse starts with the reversed order, so a second
# invocation complements a first one). The global batch is the same in every run (DDP and meshtrain
# split it over the ranks). Tokens/s = B*T / median step time of the timed steps; per setting the
# best rep counts (other processes only slow a run down). PyTorch's single-process figure is the
# better of its two thread settings. Efficiency = tokens/s at 2 ranks / tokens/s at 1 process;
# meshtrain's should be at least PyTorch's. The last two runs are each program's ceiling for dp 2 on
# these cores: one rank's share of the work (B/2 rows) on one thread, with no communication; "of
# ceiling" = tokens/s at 2 ranks / (2 x tokens/s of that run), 1.00 when splitting the batch over
# two ranks costs nothing beyond the split itself. The pair runs start two such processes at once,
# with no communication between them: tokens/s = B*T / the slower one's median step; "dp 2 / pair"
# is what data parallelism costs beyond running two independent ranks side by side on these cores
# (on a machine whose two cores are not equally fast the pair waits for the slower, as dp 2 does).
# "hidden" is meshtrain's share of all-reduce time hidden
# behind backward at dp 2, from its --trace line (rank 0).
# Before each run it waits up to QUIET_WAIT=60 s for the 1-minute load average (uptime) to drop
# below QUIET_LOAD=1.0, or for the machine to be idle right now (under 0.25 busy cores over 2 s:
# the load average lags a finished run by a minute); then it runs anyway and prints the load.
# Each run stops after RUN_TIMEOUT=300 s and counts the steps timed by then. About 5-6 minutes on
# 2 idle cores with --reps 1 (default); on a loaded machine up to 4x longer plus the waits.
set -uo pipefail
cd "$(dirname "$0")/.."

MESHTRAIN=${MESHTRAIN:-build/meshtrain}
QUIET_WAIT=${QUIET_WAIT:-60}
QUIET_LOAD=${QUIET_LOAD:-1.0}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
WARMUP=2
REPS=1
STEPS_ALL=""
REVERSE=0
DATA=""
MODELS=()

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) REPS=${2:?--reps needs a number}; shift 2 ;;
    --data) DATA=${2:?--data needs a file}; shift 2 ;;
    --reverse) REVERSE=1; shift ;;
    --steps) STEPS_ALL=${2:?--steps needs a number}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    gpt-4l-256|gpt2-124m) MODELS+=("$1"); shift ;;
    *) echo "dp_efficiency.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[ ${#MODELS[@]} -gt 0 ] || MODELS=(gpt-4l-256 gpt2-124m)
case "$REPS" in ''|*[!0-9]*|0) echo "dp_efficiency.sh: --reps must be a positive integer" >&2; exit 2 ;; esac
if [ -z "$DATA" ]; then
  for f in data/corpus.txt ../shared/data/tinyshakespeare.txt; do
    [ -s "$f" ] && { DATA=$f; break; }
  done
fi
[ -s "$DATA" ] || { echo "dp_efficiency.sh: no data (run scripts/setup.sh for data/corpus.txt, or --data FILE)" >&2; exit 2; }
[ -x "$MESHTRAIN" ] || { echo "dp_efficiency.sh: $MESHTRAIN not built (cmake --build build --target meshtrain)" >&2; exit 2; }

declare -A MSPEC=([gpt-4l-256]="--config bench/configs/gpt-4l-256.json" [gpt2-124m]="--model gpt2-124m")
declare -A BATCH=([gpt-4l-256]=16 [gpt2-124m]=4)
declare -A SEQ=([gpt-4l-256]=128 [gpt2-124m]=64)
declare -A STEPS=([gpt-4l-256]=20 [gpt2-124m]=6)        # including the WARMUP steps
if [ -n "$STEPS_ALL" ]; then
  case "$STEPS_ALL" in ''|*[!0-9]*) echo "dp_efficiency.sh: --steps must be an integer" >&2; exit 2 ;; esac
  [ "$STEPS_ALL" -gt "$WARMUP" ] || { echo "dp_efficiency.sh: --steps must exceed the $WARMUP warm-up steps" >&2; exit 2; }
  for m in "${!STEPS[@]}"; do STEPS[$m]=$STEPS_ALL; done
fi
declare -A PT_REF=([gpt-4l-256]=1.24 [gpt2-124m]=0.90)  # PyTorch efficiency seen before

PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# busy_cores, wait_quiet (QUIET_WAIT, QUIET_LOAD; sets LOAD and BUSY), best, ratio
source bench/lib.sh

# meshtrain: "tokens_per_s median_step_ms timed_steps median_comm_wait_ms" from a metrics file.
summarise_metrics() {
  "$PY" - "$1" "$2" "$WARMUP" <<'EOF'
import json, statistics, sys
path, bt, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = []
for line in open(path):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if isinstance(r, dict) and "step_ms" in r:
        rows.append(r)
timed = rows[warm:]
if not timed:
    sys.exit(1)
med = statistics.median(float(r["step_ms"]) for r in timed)
wait = statistics.median(float(r.get("comm_wait_ms", 0.0)) for r in timed)
print(f"{bt / (med / 1e3):.1f} {med:.1f} {len(timed)} {wait:.1f}")
EOF
}

# One meshtrain run; sets TPS and NOTE (or returns 1).
run_meshtrain() {  # model dp threads tag [batch]
  local m=$1 dp=$2 th=$3 tag=$4.$BASHPID b=${5:-${BATCH[$1]}} rc sum tps med n wait hid
  local mf="$TMP/$tag.jsonl" log="$TMP/$tag.log"
  rm -f "$mf"
  # shellcheck disable=SC2086
  timeout "$RUN_TIMEOUT" "$MESHTRAIN" train ${MSPEC[$m]} --data "$DATA" --dp "$dp" --threads "$th" \
    --batch "$b" --seq "${SEQ[$m]}" --steps "${STEPS[$m]}" --eval-every 0 --eval-batches 1 \
    --log-every 0 --metrics "$mf" --trace "$TMP/$tag.trace.json" > "$log" 2>&1
  rc=$?
  if { [ "$rc" = 0 ] || [ "$rc" = 124 ]; } && [ -s "$mf" ] && sum=$(summarise_metrics "$mf" $((b * SEQ[$m]))); then
    read -r tps med n wait <<< "$sum"
    hid=$(sed -n 's/.*communication \([0-9.]*\) ms, \([0-9.]*\)% of it hidden.*/\2% of \1 ms hidden/p' "$log" | head -n 1)
    TPS=$tps
    NOTE="median $med ms/step over $n steps, comm wait $wait ms/step${hid:+, $hid}$([ "$rc" = 124 ] && echo ", cut off at ${RUN_TIMEOUT}s")"
    HIDDEN=$(sed -n 's/.*communication \([0-9.]*\) ms, \([0-9.]*\)% of it hidden.*/\2/p' "$log" | head -n 1)
    return 0
  fi
  NOTE="FAILED (exit $rc): $(tail -n 3 "$log" | tr '\n' ' ')"
  return 1
}

# One PyTorch run (bench/torch_ddp.py); sets TPS and NOTE (or returns 1; 2 when torch is missing).
run_torch() {  # model nproc intra blas [batch]
  local m=$1 b=${5:-${BATCH[$1]}} out rc spec err="$TMP/torch.$BASHPID.err"
  spec=${MSPEC[$m]}
  # shellcheck disable=SC2086
  out=$(timeout $((RUN_TIMEOUT + 120)) "$PY" bench/torch_ddp.py $spec --data "$DATA" --nproc "$2" \
          --intra-threads "$3" --blas-threads "$4" --batch "$b" --seq "${SEQ[$m]}" \
          --steps $((STEPS[$m] - WARMUP)) --warmup "$WARMUP" --max-seconds "$RUN_TIMEOUT" \
          --json --quiet 2> "$err")
  rc=$?
  if [ "$rc" != 0 ]; then
    NOTE="FAILED (exit $rc): $(tail -n 3 "$err" | tr '\n' ' ')"
    grep -q "not installed" "$err" && return 2
    return 1
  fi
  read -r TPS NOTE <<< "$("$PY" - "$out" <<'EOF'
import json, sys
r = json.loads(sys.argv[1].strip().splitlines()[-1])
c = r.get("cpu_cores", {})
print(r["tokens_per_s"], f"median {r['step_ms']['median']} ms/step over {r['steps']} steps, "
      f"loss {r['loss']['first']} -> {r['loss']['last']}, cores own {c.get('own')} others {c.get('others')}")
EOF
)"
}


# Runs "$@" (run_meshtrain or run_torch) twice at once; TPS = 2 x the slower run's tokens/s.
pair() {
  local a b
  ( "$@" > /dev/null 2>&1; echo "${TPS:-}" > "$TMP/pair.1" ) &
  ( "$@" > /dev/null 2>&1; echo "${TPS:-}" > "$TMP/pair.2" ) &
  wait
  a=$(cat "$TMP/pair.1") b=$(cat "$TMP/pair.2")
  if [ -z "$a" ] || [ -z "$b" ]; then NOTE="FAILED: one of the two runs gave no figure"; return 1; fi
  TPS=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.1f", 2 * (a < b ? a : b) }')
  NOTE="the two runs: $a and $b tok/s of B/2 rows each"
}

echo "== data-parallel efficiency: $(date -u '+%Y-%m-%d %H:%M UTC'), $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p'), $(nproc) cores"
echo "   data $DATA, $WARMUP warm-up steps, $REPS rep(s); load:$(uptime | sed 's/.*load average://')"
echo "   meshtrain: $MESHTRAIN ($(git log -1 --format='%h %cd' --date=format:'%H:%M' 2>/dev/null))"

declare -A R   # R[model,setting] = space-separated tokens/s of the reps
declare -A HID
declare -A P   # P[model,setting,rep] = tokens/s of that rep
LOADS=()
SETTINGS=(mt1 pt1a mt2 ddp pt1b mtc ptc mtp ptp)
for m in "${MODELS[@]}"; do
  echo "== $m: B=${BATCH[$m]} T=${SEQ[$m]}, ${STEPS[$m]} steps ($WARMUP warm-up)"
  for ((r = 1; r <= REPS; r++)); do
    order=("${SETTINGS[@]}")
    if [ $(((r + REVERSE) % 2)) = 0 ]; then order=(ptp mtp ptc mtc pt1b ddp mt2 pt1a mt1); fi
    for s in "${order[@]}"; do
      wait_quiet
      LOADS+=("$LOAD")
      TPS="" HIDDEN=""
      case $s in
        mt1) label="meshtrain dp 1 x 2 threads"; run_meshtrain "$m" 1 2 "$m.$r.dp1" ;;
        mt2) label="meshtrain dp 2 x 1 thread "; run_meshtrain "$m" 2 1 "$m.$r.dp2" ;;
        pt1a) label="PyTorch 1 proc, intra 1 BLAS 2"; run_torch "$m" 1 1 2 ;;
        pt1b) label="PyTorch 1 proc, intra 2 BLAS 1"; run_torch "$m" 1 2 1 ;;
        ddp) label="PyTorch DDP 2 proc x 1 thread"; run_torch "$m" 2 1 1 ;;
        mtc) label="meshtrain 1 thread, B/2 rows"; run_meshtrain "$m" 1 1 "$m.$r.half" $((BATCH[$m] / 2)) ;;
        ptc) label="PyTorch 1 proc x 1 thread, B/2"; run_torch "$m" 1 1 1 $((BATCH[$m] / 2)) ;;
        mtp) label="meshtrain pair, at once"; pair run_meshtrain "$m" 1 1 "$m.$r.pair" $((BATCH[$m] / 2)) ;;
        ptp) label="PyTorch pair, at once"; pair run_torch "$m" 1 1 1 $((BATCH[$m] / 2)) ;;
      esac
      rc=$?
      [ "$rc" = 2 ] && { echo "   PyTorch is not installed (apt-get install -y python3-torch python3-numpy)"; exit 2; }
      printf '   rep %d %-31s %9s tok/s  (%s; load %s, busy %s cores before)\n' "$r" "$label" "${TPS:--}" "$NOTE" "$LOAD" "$BUSY"
      [ "$rc" = 0 ] && R[$m,$s]="${R[$m,$s]:-} $TPS" && P[$m,$s,$r]=$TPS
      [ "$s" = mt2 ] && [ -n "$HIDDEN" ] && HID[$m]="${HID[$m]:-} $HIDDEN%"
    done
  done
done

echo
printf '%-11s %10s %10s %6s | %10s %10s %6s %8s | %s\n' model "mt dp1" "mt dp2" "eff" "pt 1proc" "pt DDP" "eff" "pt seen" "meshtrain hidden at dp 2; verdict"
for m in "${MODELS[@]}"; do
  mt1=$(best ${R[$m,mt1]:-}) mt2=$(best ${R[$m,mt2]:-}) ddp=$(best ${R[$m,ddp]:-})
  a=$(best ${R[$m,pt1a]:-}) b=$(best ${R[$m,pt1b]:-})
  pt1=$(best $a $b) which=""
  [ -n "$pt1" ] && { [ "$pt1" = "$a" ] && which="1,2" || which="2,1"; }
  em=$(ratio "$mt2" "$mt1") ep=$(ratio "$ddp" "$pt1")
  verdict=$(awk -v a="$em" -v b="$ep" 'BEGIN { if (a == "-" || b == "-") print "incomplete"; else if (a + 0 >= b + 0) print "meets (>= PyTorch)"; else print "below PyTorch" }')
  printf '%-11s %10s %10s %6s | %10s %10s %6s %8s | %s; %s\n' "$m" "${mt1:--}" "${mt2:--}" "$em" \
    "${pt1:--}${which:+ ($which)}" "${ddp:--}" "$ep" "${PT_REF[$m]}" "${HID[$m]:- -}" "$verdict"
done
echo "(tokens/s of the global batch, best of $REPS rep(s); pt 1proc: best of intra-op,OpenBLAS = 1,2 and 2,1;"
echo " eff = tokens/s at 2 ranks / at 1 process; loads before the runs: ${LOADS[*]}; load at end:$(uptime | sed 's/.*load average://'))"
echo
echo "Per rep (the runs of one rep are minutes apart, so they share the machine's speed of the moment):"
for m in "${MODELS[@]}"; do
  ems="" eps="" mps="" pps=""
  for ((r = 1; r <= REPS; r++)); do
    ems="$ems $(ratio "${P[$m,mt2,$r]:-}" "${P[$m,mt1,$r]:-}")"
    eps="$eps $(ratio "${P[$m,ddp,$r]:-}" "$(best "${P[$m,pt1a,$r]:-}" "${P[$m,pt1b,$r]:-}")")"
    mps="$mps $(ratio "${P[$m,mt2,$r]:-}" "${P[$m,mtp,$r]:-}")"
    pps="$pps $(ratio "${P[$m,ddp,$r]:-}" "${P[$m,ptp,$r]:-}")"
  done
  printf '%-11s meshtrain eff:%s (median %s) | PyTorch eff:%s (median %s)\n' "$m" "$ems" "$(median $ems)" "$eps" "$(median $eps)"
  printf '%-11s meshtrain dp 2 / pair:%s (median %s) | PyTorch DDP / pair:%s (median %s)\n' "" "$mps" "$(median $mps)" "$pps" "$(median $pps)"
done
echo
echo "Against each program's own ceiling for dp 2 (1 thread on B/2 rows, no communication; x2 = the"
echo "tokens/s two such ranks would give if the split cost nothing):"
printf '%-11s %12s %12s %8s | %12s %12s %8s | %s\n' model "mt B/2 x2" "mt dp2" "of ceil" "pt B/2 x2" "pt DDP" "of ceil" "1-to-2-thread gain of the single process (mt, pt)"
for m in "${MODELS[@]}"; do
  mtc=$(best ${R[$m,mtc]:-}) ptc=$(best ${R[$m,ptc]:-})
  mtc2=$(awk -v a="$mtc" 'BEGIN { if (a != "") printf "%.1f", 2 * a }') ptc2=$(awk -v a="$ptc" 'BEGIN { if (a != "") printf "%.1f", 2 * a }')
  mt1=$(best ${R[$m,mt1]:-}) mt2=$(best ${R[$m,mt2]:-}) ddp=$(best ${R[$m,ddp]:-})
  pt1=$(best ${R[$m,pt1a]:-} ${R[$m,pt1b]:-})
  printf '%-11s %12s %12s %8s | %12s %12s %8s | %s, %s\n' "$m" "${mtc2:--}" "${mt2:--}" "$(ratio "$mt2" "$mtc2")" \
    "${ptc2:--}" "${ddp:--}" "$(ratio "$ddp" "$ptc2")" "$(ratio "$mt1" "$mtc2")" "$(ratio "$pt1" "$ptc2")"
done
echo "(gain = tokens/s at 1 process / the ceiling x2; eff = 'of ceil' / gain exactly, so a single process"
echo " that already uses both cores fully (gain near 1.00) leaves dp 2 nothing to win)"
