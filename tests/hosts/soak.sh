#!/usr/bin/env bash
# A soak of `meshtrain launch --hosts --grow` across hosts (tests/hosts/netns.sh) of one slot
# each, --dp 2: for DURATION seconds a fault every EVERY seconds, in turn a SIGKILL of the rank
# that is not on host a (where the launcher runs), a SIGSTOP of it, and a cut of its host's link
# for 20 s. After each the job must run on two ranks again within a bound; at the end a SIGTERM
# stops it at a step boundary (exit 0).
#   - With two hosts (SOAK_HOSTS=2, the default) a lost host leaves one rank: the job goes on at
#     dp 1 and --grow takes it back to dp 2 when the host answers again.
#   - With three (SOAK_HOSTS=3) and --max-ranks 2, the spare host stands in for the lost one: the
#     layout stays dp 2 throughout, and the run must end on the very loss of an uninterrupted
#     dp 2 run, to the bit.
# Checked:
#   - every fault was noticed and recovered (the events), nothing hung;
#   - the metrics hold each step 1..K exactly once (none repeated, none skipped) and `latest`
#     names step K;
#   - nothing was lost or computed twice: a replay without faults that takes the same layouts
#     at the same steps (each layout's stretch of steps from the events, one uninterrupted run
#     per stretch chained by --resume, mpirun on this host) gives every step's loss within 1e-5
#     relative; where the layout never changed the replay is one uninterrupted run and the
#     final loss must equal it exactly;
#   - beside it (unless SOAK_REF=0), an uninterrupted single-rank run of the K steps, and the loss
#     of the last 200 steps of both: float32 round-off between layouts grows with the steps
#     (docs/launch.md), so this is reported, not held to 1e-5.
# Usage: soak.sh MESHTRAIN MPIRUN [DURATION_S [EVERY_S]]   (exit 77: skipped, with the reason)
set -euo pipefail
bin=$(readlink -f "$1") mpirun=$2 duration=${3:-1800} every=${4:-150}
deadline=5 nhosts=${SOAK_HOSTS:-2}
source "$(dirname "$0")/netns.sh"
hosts_up "$mpirun" "$nhosts"
write_random_corpus "$dir/corpus.txt"
others=("$ns_b") spare=()
if [ "$nhosts" = 3 ]; then
  # Host a (this one, where mpirun runs) not first: mpirun places its own host's ranks first,
  # and so must the launcher (checked below from the start event).
  others+=("$ns_c") spare=(--max-ranks 2)
  printf '%s slots=1\n%s slots=1\n%s slots=1\n' "$ip_b" "$ip_a" "$ip_c" > "$dir/hosts.txt"
else
  printf '%s slots=1\n%s slots=1\n' "$ip_a" "$ip_b" > "$dir/hosts.txt"
fi
# A constant rate after the warm-up: a run's curve does not depend on its --steps, so the soak
# may ask for more steps than it takes and the replays stop where its segments did.
common=(train --data "$dir/corpus.txt" --batch 16 --seq 64 --warmup 5 --lr-schedule step --lr-step-every 1000000000
        --eval-every 0 --eval-batches 1 --threads 1 --comm-timeout "$deadline" --quiet)
out=${SOAK_OUT:-$dir/out}
mkdir -p "$out"

ip netns exec "$ns_a" env "${mpi_env[@]}" "$bin" launch --hosts "$dir/hosts.txt" --mpirun "$mpirun" --grow "${spare[@]}" \
  --probe-every-s 2 --probe-timeout-s 10 --max-restarts 1000 --events "$out/events.jsonl" -- \
  "${common[@]}" --steps 1000000000 --dp 2 --checkpoint-dir "$dir/ck" --checkpoint-every-s 15 --keep-checkpoints 3 \
  --metrics "$out/run.jsonl" > "$out/launch.log" 2>&1 &
job=$!
t_start=$(date +%s)
lines() { [ -f "$out/run.jsonl" ] && wc -l < "$out/run.jsonl" || echo 0; }
fail() { grep -v '^$' "$out/launch.log" | tail -40; echo "FAIL: $*"; exit 1; }
rank_in() {  # the pid of the job's rank in namespace $1 (none: empty)
  local p
  for p in $(ip netns pids "$1"); do
    if [ "$(cat /proc/$p/comm 2> /dev/null)" = meshtrain ] && grep -qa -- "--metrics" /proc/$p/cmdline 2> /dev/null \
       && ! grep -qa launch /proc/$p/cmdline; then echo "$p"; return; fi
  done
}
# The namespace of host b or c that runs a rank of the job (none: empty).
remote() {
  local ns
  for ns in "${others[@]}"; do [ -n "$(rank_in "$ns")" ] && { echo "$ns"; return; }; done
}
# Host a and another host run a rank and the job is making steps; at most $1 seconds.
on_two_hosts() {
  local until=$(($(date +%s) + $1)) n
  while :; do
    kill -0 "$job" 2> /dev/null || return 1
    if [ -n "$(rank_in "$ns_a")" ] && [ -n "$(remote)" ]; then
      n=$(lines); sleep 1
      [ "$(lines)" -gt "$n" ] && [ -n "$(remote)" ] && return 0
    fi
    [ "$(date +%s)" -lt "$until" ] || return 1
    sleep 0.5
  done
}

on_two_hosts 120 || fail "the job did not start on two hosts"
faults=(kill stop partition)
i=0
: > "$out/faults.txt"
while [ $(($(date +%s) + every)) -le $((t_start + duration)) ]; do
  sleep "$every"
  on_two_hosts 180 || fail "the job was not back on two hosts before fault $((i + 1))"
  f=${faults[$((i % 3))]}
  ns=$(remote)
  [ -n "$ns" ] || fail "no rank on host b or c"
  victim=$(rank_in "$ns")
  [ -n "$victim" ] || fail "no rank on host b or c"
  case $f in
    kill) kill -KILL "$victim" ;;
    stop) kill -STOP "$victim" ;;
    partition) ip -n "$ns" link set "v$ns" down ;;
  esac
  echo "$(($(date +%s) - t_start)) s: fault $((i + 1)): $f of host ${ns: -1} at step $(lines)" | tee -a "$out/faults.txt"
  if [ "$f" = partition ]; then
    sleep 20
    ip -n "$ns" link set "v$ns" up
  fi
  i=$((i + 1))
done
on_two_hosts 180 || fail "the job was not back on two hosts after the last fault"
while [ "$(date +%s)" -lt $((t_start + duration)) ]; do  # the whole duration, faults or not
  kill -0 "$job" 2> /dev/null || fail "the job ended before its stop"
  sleep 1
done
kill -TERM "$job"
rc=0
wait "$job" || rc=$?
[ "$rc" -eq 0 ] || fail "launch exited $rc after its SIGTERM"
echo "soak: $(($(date +%s) - t_start)) s, $i faults, $(lines) steps"
cp "$dir/ck/latest" "$out/latest"

# The replay without faults: each layout's stretch of steps, chained by --resume (mpirun here).
python3 - "$out/events.jsonl" "$(lines)" > "$out/segments.txt" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
end = int(sys.argv[2])
starts = [(0, "dp=2 tp=1 pp=1")] + [(e["from_step"], e["layout"]) for e in ev if e["event"] == "restart"]
segments = []
for k, (s, layout) in enumerate(starts):
    stop = starts[k + 1][0] if k + 1 < len(starts) else end
    if stop <= s:  # a segment that reached no checkpoint beyond its start
        continue
    dp = layout.split()[0].split("=")[1]
    if segments and segments[-1][2] == dp:  # the same layout on: one uninterrupted stretch
        segments[-1][1] = stop
    else:
        segments.append([s, stop, dp])
for s, stop, dp in segments:
    print(s, stop, dp)
PY
echo "replay: $(wc -l < "$out/segments.txt") stretch(es) of one layout"
while read -r from to dp; do
  resume=(); [ "$from" -gt 0 ] && resume=(--resume)
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=vader,self "$mpirun" -np "$dp" "$bin" "${common[@]}" --backend mpi --dp "$dp" \
    --steps "$to" --checkpoint-dir "$dir/replay" --metrics "$out/replay.jsonl" "${resume[@]}" < /dev/null > /dev/null 2>&1 \
    || fail "the replay of steps $from..$to at dp $dp failed"
done < "$out/segments.txt"
# The uninterrupted single-rank run (SOAK_REF=0: skipped, it costs as long as the replay).
if [ "${SOAK_REF:-1}" = 1 ]; then
  "$bin" "${common[@]}" --steps "$(lines)" --metrics "$out/ref.jsonl"
fi

python3 - "$out" "$i" "$(wc -l < "$out/segments.txt")" "$ip_a" <<'PY'
import json, sys
out, faults, stretches, ip_a = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
load = lambda name: [json.loads(l) for l in open(f"{out}/{name}")]
import os
ev, run, replay = load("events.jsonl"), load("run.jsonl"), load("replay.jsonl")
ref = load("ref.jsonl") if os.path.exists(f"{out}/ref.jsonl") else None
k = len(run)
steps = [x["step"] for x in run]
assert steps == list(range(1, k + 1)), "the metrics repeat or skip steps"
latest = open(f"{out}/latest").read().strip()
assert latest == f"step_{k:08d}", f"latest names {latest}, not step {k}"
failures = [e for e in ev if e["event"] == "failure"]
grows = [e for e in ev if e["event"] == "restart" and e["reason"] == "grow"]
layouts = sorted({e["layout"] for e in ev if e["event"] in ("start", "restart")})
assert len(failures) >= faults, f"{faults} faults but {len(failures)} failures noticed"
assert ev[-1]["event"] == "done", ev[-1]
assert [x["step"] for x in replay] == steps, "the replay's steps differ"
rel = [abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(run, replay)]
worst = max(rel)
lost = sum(e["work_lost_s"] for e in failures)
print(f"{faults} faults, {len(failures)} failures noticed, {len(grows)} grows back to two hosts, {k} steps; "
      f"work lost {lost:.1f} s in all; layouts: {', '.join(layouts)}")
print(f"the soak against its replay without faults (same layouts at the same steps, {stretches} uninterrupted "
      f"stretch(es)): worst relative difference {worst:.2e}")
if os.environ.get("SOAK_HOSTS") == "3":  # a spare host for every lost one: the layout must hold
    assert ev[0]["hosts"].startswith(ip_a + ":"), f"the launcher did not put its own host first: {ev[0]['hosts']}"
    assert stretches == 1 and layouts == ["dp=2 tp=1 pp=1"], f"the layout changed: {layouts}"
if stretches == 1:  # the layout never changed: the replay is the uninterrupted run
    print(f"final loss: soak {run[-1]['loss']!r}, uninterrupted run {replay[-1]['loss']!r}")
    assert run[-1]["loss"] == replay[-1]["loss"], "the final loss differs from the uninterrupted run's"
tail = lambda xs: sum(x["loss"] for x in xs[-200:]) / len(xs[-200:])
if ref:
    print(f"the loss of the last 200 steps: soak {tail(run):.4f}, uninterrupted single rank {tail(ref):.4f} "
          f"({abs(tail(run) - tail(ref)) / tail(ref):.2%} apart); final step {run[-1]['loss']:.4f} vs {ref[-1]['loss']:.4f}")
assert worst < 1e-5, "the soak lost or repeated work: it left its replay's curve"
print("SOAK OK")
PY
