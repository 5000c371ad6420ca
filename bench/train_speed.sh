#!/usr/bin/env bash
# The project's training-speed benchmark: meshtrain against the PyTorch reference (bench/torch_gpt.py)
# on the same GPT, batch and sequence length, on this machine's CPU cores.
#
#   bench/train_speed.sh [--data FILE] [--reps N] [--quick] [--no-gemm] [MODEL ...]
#   bench/train_speed.sh --sweep [--reps N] [MODEL ...]   # PyTorch only: intra-op x OpenBLAS threads
#
# MODEL: gpt-tiny gpt-small gpt2-124m (default: all three). For each model the two programs run
# alternately, meshtrain then PyTorch, --reps times (default 2: A B A B, so slow drift of the
# machine hits both alike); each run skips its first WARMUP steps and reports tokens/s = B*T over the
# median step time; the table shows the mean over the reps. PyTorch runs at its best thread setting
# on a 2-core machine (docs/benchmarks.md, "Training speed"); TORCH_THREADS="INTRA,BLAS" overrides.
# If build/meshtrain is missing or fails, the meshtrain column says so and PyTorch still runs.
# If bench_gemm was built, its square SGEMM case runs first (optional; --no-gemm skips it).
# Default data: data/corpus.txt if present, else ../shared/data/tinyshakespeare.txt.
# Before each run it waits (up to QUIET_WAIT=30 s) for the other processes' CPU use to drop below
# half a core, since the machine is shared; each run line shows the CPU others used just before it.
# Each run stops after RUN_TIMEOUT seconds (default 120) and counts the steps it timed by then, so
# the default run takes about 4-6 minutes on 2 idle cores and at most about 30 on a loaded one;
# --quick takes about a third of that.
set -uo pipefail
cd "$(dirname "$0")/.."

MESHTRAIN=${MESHTRAIN:-build/meshtrain}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}   # seconds per run; the steps done by then count (PyTorch: --max-seconds)
WARMUP=3
REPS=2
DATA=""
GEMM=1
QUICK=0
SWEEP=0
QUIET_WAIT=${QUIET_WAIT:-30}
MODELS=()

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --data) DATA=${2:?--data needs a file}; shift 2 ;;
    --data=*) DATA=${1#--data=}; shift ;;
    --reps) REPS=${2:?--reps needs a number}; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --no-gemm) GEMM=0; shift ;;
    --sweep) SWEEP=1; shift ;;
    -h|--help) usage; exit 0 ;;
    gpt-tiny|gpt-small|gpt2-124m) MODELS+=("$1"); shift ;;
    *) echo "train_speed.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[ ${#MODELS[@]} -gt 0 ] || MODELS=(gpt-tiny gpt-small gpt2-124m)
case "$REPS" in ''|*[!0-9]*|0) echo "train_speed.sh: --reps must be a positive integer" >&2; exit 2 ;; esac

if [ -z "$DATA" ]; then
  for f in data/corpus.txt ../shared/data/tinyshakespeare.txt; do
    if [ -s "$f" ]; then DATA=$f; break; fi
  done
  [ -n "$DATA" ] || { echo "train_speed.sh: no data/corpus.txt (run scripts/setup.sh) nor ../shared/data/tinyshakespeare.txt; pass --data FILE" >&2; exit 2; }
fi
[ -s "$DATA" ] || { echo "train_speed.sh: --data $DATA: no such file" >&2; exit 2; }

# Per model: batch, sequence length, timed steps (full run, --quick), target ratio meshtrain/PyTorch,
# PyTorch's best threads "intra-op,OpenBLAS" on 2 cores (sweep in docs/benchmarks.md).
declare -A BATCH=([gpt-tiny]=12 [gpt-small]=8 [gpt2-124m]=4)
declare -A SEQ=([gpt-tiny]=64 [gpt-small]=256 [gpt2-124m]=64)
declare -A STEPS=([gpt-tiny]=40 [gpt-small]=15 [gpt2-124m]=10)
declare -A QSTEPS=([gpt-tiny]=20 [gpt-small]=8 [gpt2-124m]=5)
declare -A TARGET=([gpt-tiny]=2.0 [gpt-small]=1.4 [gpt2-124m]=1.5)
declare -A BEST_THREADS=([gpt-tiny]=1,2 [gpt-small]=1,2 [gpt2-124m]=1,2)

PY=python3
command -v "$PY" > /dev/null || PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "== training speed: $(date -u '+%Y-%m-%d %H:%M UTC'), $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p'), $(nproc) cores"
if [ "$SWEEP" = 1 ]; then what="PyTorch thread sweep"; else what="alternating meshtrain/PyTorch"; fi
echo "   data $DATA, warm-up $WARMUP steps, $REPS rep(s), $what; load:$(uptime | sed 's/.*load average://')"
load1=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load1" 'BEGIN { exit !(l > 0.5) }'; then
  echo "   warning: the machine is busy (1-min load $load1): figures will be low and noisy"
fi

# Optional: the 2-thread SGEMM rate of meshtrain's own GEMM benchmark, its square2048 case.
if [ "$GEMM" = 1 ] && [ "$SWEEP" = 0 ]; then
  gemm=""
  for f in build/bench/bench_gemm build/bench_gemm build/bench/gemm; do
    [ -x "$f" ] && { gemm=$f; break; }
  done
  if [ -n "$gemm" ]; then
    echo "== SGEMM, square case ($gemm, 2 threads)"
    OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2 timeout "$RUN_TIMEOUT" "$gemm" \
      --benchmark_filter='[Ss]quare.*threads:2' 2>&1 | sed 's/^/   /' \
      || echo "   (bench_gemm failed or has no square case)"
  else
    echo "== SGEMM: skipped (no build/bench/bench_gemm; build with Google Benchmark installed)"
  fi
fi

have_meshtrain=1
if [ "$SWEEP" = 0 ] && [ ! -x "$MESHTRAIN" ]; then
  have_meshtrain=0
  echo "== meshtrain: $MESHTRAIN not found (build it with scripts/build.sh): PyTorch column only"
fi

# Summarises a meshtrain metrics file: skips the first WARMUP step lines, prints
# "tokens_per_s median_step_ms first_loss last_loss steps" (tokens/s = B*T / median step_ms).
summarise_metrics() {
  "$PY" - "$1" "$2" "$WARMUP" <<'EOF'
import json, statistics, sys
path, bt, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = []
for line in open(path):
    line = line.strip()
    if not line.startswith("{"):
        continue
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if "step" in r and ("step_ms" in r or "tokens_per_s" in r):
        rows.append(r)
timed = rows[warm:]
if not timed:
    sys.exit(1)
if all("step_ms" in r for r in timed):
    med = statistics.median(float(r["step_ms"]) for r in timed)
    tps = bt / (med / 1e3)
else:
    tps = statistics.median(float(r["tokens_per_s"]) for r in timed)
    med = bt / tps * 1e3
print(f"{tps:.1f} {med:.2f} {rows[0].get('loss', 'nan')} {rows[-1].get('loss', 'nan')} {len(timed)}")
EOF
}

# CPU used by other processes, in cores, over the last second (this script is idle meanwhile).
busy_cores() {
  local a b
  a=($(head -n 1 /proc/stat)); sleep 1; b=($(head -n 1 /proc/stat))
  awk -v u1="${a[1]}" -v n1="${a[2]}" -v s1="${a[3]}" -v i1="${a[4]}" -v w1="${a[5]}" -v q1="${a[6]}" -v sq1="${a[7]}" \
      -v u2="${b[1]}" -v n2="${b[2]}" -v s2="${b[3]}" -v i2="${b[4]}" -v w2="${b[5]}" -v q2="${b[6]}" -v sq2="${b[7]}" \
      -v ncpu="$(nproc)" 'BEGIN {
        busy = (u2 - u1) + (n2 - n1) + (s2 - s1) + (q2 - q1) + (sq2 - sq1); idle = (i2 - i1) + (w2 - w1);
        printf "%.1f", (busy + idle > 0) ? ncpu * busy / (busy + idle) : 0 }'
}
# Waits up to QUIET_WAIT seconds for others' CPU use to fall below half a core; sets BUSY.
wait_quiet() {
  local t=0
  BUSY=$(busy_cores)
  while awk -v b="$BUSY" 'BEGIN { exit !(b >= 0.5) }' && [ "$t" -lt "$QUIET_WAIT" ]; do
    sleep 4; t=$((t + 5)); BUSY=$(busy_cores)
  done
}

# Runs the PyTorch reference; sets TPS, MED, L0, L1 (or returns non-zero, 2 when torch is missing).
run_torch() {  # model intra blas steps
  local m=$1 out rc
  out=$(timeout $((RUN_TIMEOUT + 120)) "$PY" bench/torch_gpt.py --model "$m" --data "$DATA" --batch "${BATCH[$m]}" \
          --seq "${SEQ[$m]}" --steps "$4" --warmup "$WARMUP" --intra-threads "$2" --blas-threads "$3" \
          --max-seconds "$RUN_TIMEOUT" --json --quiet 2> "$TMP/torch.err")
  rc=$?
  if [ "$rc" != 0 ]; then
    if [ "$rc" = 2 ] && grep -q "not installed" "$TMP/torch.err"; then
      echo "   PyTorch: not installed (apt-get install -y python3-torch python3-numpy)"
    else
      echo "   PyTorch: FAILED (exit $rc)"; tail -n 5 "$TMP/torch.err" | sed 's/^/      /'
    fi
    return "$rc"
  fi
  read -r TPS MED L0 L1 OTHERS OWN CORE <<< "$("$PY" -c 'import json,sys; r=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(r["tokens_per_s"], r["step_ms"]["median"], r["loss"]["first"], r["loss"]["last"], r.get("cpu_cores", {}).get("others"), r.get("cpu_cores", {}).get("own"), r.get("blas_core"))' <<< "$out")"
}

mean() { [ $# -gt 0 ] && printf '%s\n' "$@" | awk '{ s += $1 } END { printf "%.0f", s / NR }'; }
maxof() { [ $# -gt 0 ] && printf '%s\n' "$@" | awk 'NR == 1 || $1 > m { m = $1 } END { printf "%.0f", m }'; }
steps_for() { if [ "$QUICK" = 1 ]; then echo "${QSTEPS[$1]}"; else echo "${STEPS[$1]}"; fi; }

if [ "$SWEEP" = 1 ]; then
  # PyTorch's thread sweep: every (intra-op, OpenBLAS) pair, the order rotated each rep.
  COMBOS=(1,1 1,2 2,1 2,2)
  declare -A SW
  for m in "${MODELS[@]}"; do
    S=$(steps_for "$m")
    echo "== sweep $m: B=${BATCH[$m]} T=${SEQ[$m]}, $S timed steps after $WARMUP warm-up"
    for ((r = 0; r < REPS; r++)); do
      for ((k = 0; k < ${#COMBOS[@]}; k++)); do
        c=${COMBOS[$(((k + r) % ${#COMBOS[@]}))]}
        wait_quiet
        if run_torch "$m" "${c%,*}" "${c#*,}" "$S"; then
          echo "   intra-op ${c%,*} OpenBLAS ${c#*,}: $TPS tokens/s (median $MED ms/step; cores: own $OWN, others $OTHERS during, $BUSY before; OpenBLAS $CORE)"
          SW[$m,$c]="${SW[$m,$c]:-} $TPS"
        elif [ $? = 2 ]; then exit 2; fi
      done
    done
  done
  echo
  printf '%-10s' model; for c in "${COMBOS[@]}"; do printf ' %20s' "intra ${c%,*} blas ${c#*,}"; done; echo "  best"
  for m in "${MODELS[@]}"; do
    printf '%-10s' "$m"; best="" bv=0
    for c in "${COMBOS[@]}"; do
      v=$(maxof ${SW[$m,$c]:-}); mv_=$(mean ${SW[$m,$c]:-})
      printf ' %20s' "${v:--}${v:+ ($mv_)}"
      if [ -n "$v" ] && [ "$v" -gt "$bv" ]; then bv=$v best=$c; fi
    done
    echo "  ${best:--}"
  done
  echo "(tokens/s: best (mean) over $REPS rep(s); each run: batch*seq / median step time. Other"
  echo " processes only slow a run down, so on a shared machine the best rep is the cleanest figure)"
  exit 0
fi

declare -A MT_TPS PT_TPS MT_NOTE PT_NOTE
for m in "${MODELS[@]}"; do
  B=${BATCH[$m]} T=${SEQ[$m]}
  S=$(steps_for "$m")
  th=${TORCH_THREADS:-${BEST_THREADS[$m]}}
  intra=${th%,*} blas=${th#*,}
  echo "== $m: B=$B T=$T, $S timed steps after $WARMUP warm-up; PyTorch intra-op $intra, OpenBLAS $blas"
  mt_vals=() pt_vals=()
  for ((r = 1; r <= REPS; r++)); do
    if [ "$have_meshtrain" = 1 ]; then
      mf="$TMP/$m.$r.jsonl"
      rm -f "$mf"
      wait_quiet
      timeout "$RUN_TIMEOUT" "$MESHTRAIN" train --model "$m" --data "$DATA" --steps $((S + WARMUP)) \
        --batch "$B" --seq "$T" --metrics "$mf" > "$TMP/$m.$r.log" 2>&1
      rc=$?
      # A run cut off by RUN_TIMEOUT still counts when it logged timed steps (the metrics file is
      # flushed line by line).
      if { [ "$rc" = 0 ] || [ "$rc" = 124 ]; } && [ -s "$mf" ] && sum=$(summarise_metrics "$mf" $((B * T))); then
        read -r tps med l0 l1 n <<< "$sum"
        cut=""; [ "$rc" = 124 ] && cut="; cut off after ${RUN_TIMEOUT}s"
        echo "   rep $r meshtrain: $tps tokens/s (median $med ms/step over $n steps; loss $l0 -> $l1; others used $BUSY cores before$cut)"
        mt_vals+=("$tps")
      else
        echo "   rep $r meshtrain: FAILED (exit $rc, metrics $([ -s "$mf" ] && echo unreadable || echo missing)); its last lines:"
        tail -n 5 "$TMP/$m.$r.log" | sed 's/^/      /'
        MT_NOTE[$m]="failed"
      fi
    fi
    wait_quiet
    if run_torch "$m" "$intra" "$blas" "$S"; then
      echo "   rep $r PyTorch:   $TPS tokens/s (median $MED ms/step; loss $L0 -> $L1; cores: own $OWN, others $OTHERS during, $BUSY before; OpenBLAS $CORE)"
      pt_vals+=("$TPS")
    else
      rc=$?
      if [ "$rc" = 2 ]; then PT_NOTE[$m]="no torch"; break; fi
      PT_NOTE[$m]="failed"
    fi
  done
  MT_TPS[$m]=$(mean "${mt_vals[@]}")
  PT_TPS[$m]=$(mean "${pt_vals[@]}")
done

echo
printf '%-10s %16s %16s %7s %7s  %s\n' model "meshtrain tok/s" "PyTorch tok/s" ratio target verdict
for m in "${MODELS[@]}"; do
  mt=${MT_TPS[$m]:-} pt=${PT_TPS[$m]:-}
  if [ -z "$mt" ]; then
    if [ "$have_meshtrain" = 1 ]; then mt=${MT_NOTE[$m]:-failed}; else mt="not built"; fi
  fi
  [ -n "$pt" ] || pt=${PT_NOTE[$m]:-failed}
  ratio="-" verdict=""
  if [[ "$mt" =~ ^[0-9]+$ && "$pt" =~ ^[0-9]+$ && "$pt" -gt 0 ]]; then
    ratio=$(awk -v a="$mt" -v b="$pt" 'BEGIN { printf "%.2f", a / b }')
    verdict=$(awk -v r="$ratio" -v t="${TARGET[$m]}" 'BEGIN { print (r >= t ? "meets target" : "below target") }')
  fi
  printf '%-10s %16s %16s %7s %7s  %s\n' "$m" "$mt" "$pt" "$ratio" "${TARGET[$m]}" "$verdict"
done
echo "(tokens/s = batch*seq / median step time, mean over $REPS rep(s); load at end:$(uptime | sed 's/.*load average://'))"
