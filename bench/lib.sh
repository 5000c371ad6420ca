# Helpers shared by the comparison benchmarks (bench/dp_efficiency.sh, bench/tp_speed.sh).
# Source it from the repository root: source bench/lib.sh

# CPU busy cores of the whole machine over the last 2 s.
busy_cores() {
  local a b
  a=($(head -n 1 /proc/stat)); sleep 2; b=($(head -n 1 /proc/stat))
  awk -v ncpu="$(nproc)" -v a="${a[*]}" -v b="${b[*]}" 'BEGIN {
    split(a, x); split(b, y); busy = 0; idle = 0
    for (i = 2; i <= 8; i++) { d = y[i] - x[i]; if (i == 5 || i == 6) idle += d; else busy += d }
    printf "%.2f", (busy + idle > 0) ? ncpu * busy / (busy + idle) : 0 }'
}
# Waits up to QUIET_WAIT s for the 1-minute load average to drop below QUIET_LOAD, or for the
# machine to be idle right now (under 0.25 busy cores over 2 s: the load average lags a finished
# run by a minute); then returns anyway. Sets LOAD (1-minute load average) and BUSY.
wait_quiet() {
  local t0=$SECONDS
  : "${QUIET_WAIT:=60}" "${QUIET_LOAD:=1.0}"
  while :; do
    LOAD=$(cut -d' ' -f1 /proc/loadavg); BUSY=$(busy_cores)
    awk -v l="$LOAD" -v q="$QUIET_LOAD" -v b="$BUSY" 'BEGIN { exit !(l < q || b < 0.25) }' && return
    [ $((SECONDS - t0)) -ge "$QUIET_WAIT" ] && return
    sleep 3
  done
}

# The largest of the arguments (tokens/s of the reps; other processes only slow a run down).
best() { printf '%s\n' "$@" | awk 'NF && ($1 > m || m == "") { m = $1 } END { if (m != "") printf "%.1f", m }'; }
# a / b to 2 decimals, "-" when either is missing.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b != "" && b > 0) printf "%.2f", a / b; else printf "-" }'; }
# The median of the numeric arguments ("-" and empty ones skipped), "-" when there are none.
median() { printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -n | awk '{ v[n++] = $1 } END {
  if (!n) printf "-"; else printf "%.2f", (n % 2) ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2 }'; }
