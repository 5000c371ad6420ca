# `meshtrain launch`: its events file never destroys data, its numbers are read strictly, a
# failure that would repeat is not retried, and it leaves nothing of its own behind.
# Sourced by tests/cli/hostile.sh ($MT: the program, $WORK: the scratch folder with corpus.txt).
J=(train --data corpus.txt --quiet)   # the job: gpt-tiny, two steps unless a case says otherwise
L=("$MT" launch --max-restarts 0)

# ---- --events goes through the output policy ----
echo "my notes" > "$WORK/notes.txt"
expect 2 "--events notes.txt already exists and was not written by meshtrain .*add --overwrite" -- \
  "${L[@]}" --events notes.txt -- "${J[@]}" --steps 2
expect 0 "" --may-write notes.txt -- "${L[@]}" --overwrite --events notes.txt -- "${J[@]}" --steps 2
expect 0 '^\{"args":.*"event":"start"' -- head -1 notes.txt
expect 0 "" --may-write notes.txt -- "${L[@]}" --events notes.txt -- "${J[@]}" --steps 2  # its own: replaced
expect 2 "--events corpus.txt is the same file as the job's --data corpus.txt" -- \
  "${L[@]}" --events corpus.txt -- "${J[@]}" --steps 2
expect 2 "--events m.jsonl is the same file as the job's --metrics m.jsonl" -- \
  "${L[@]}" --events m.jsonl -- "${J[@]}" --steps 2 --metrics m.jsonl
expect 0 "" --may-write ck -- "$MT" "${J[@]}" --steps 2 --checkpoint-dir ck --checkpoint-every 1
expect 2 "--events ck/step_00000002/index.json lies among the files the job's --checkpoint-dir ck manages" -- \
  "$MT" launch --events ck/step_00000002/index.json -- "${J[@]}" --steps 3 --checkpoint-dir ck --resume
expect 2 "--events ck/latest lies among the files the job's --checkpoint-dir ck manages" -- \
  "$MT" launch --events ck/latest -- "${J[@]}" --steps 3 --checkpoint-dir ck --resume
expect 2 "--events missing/ev.jsonl: the directory missing does not exist" -- \
  "${L[@]}" --events missing/ev.jsonl -- "${J[@]}" --steps 2
expect 2 "--events /proc/ev.jsonl: .*(not writable|no file can be created in the directory /proc \(.+\))" -- \
  "${L[@]}" --events /proc/ev.jsonl -- "${J[@]}" --steps 2
expect 2 "--events ck is a directory" -- "${L[@]}" --events ck -- "${J[@]}" --steps 2
rm -rf "$WORK/notes.txt" "$WORK/ck"
# A write that fails while the job runs (a full disk): named with its cause; the job goes on and
# what would have been exit 0 is exit 1. Needs the right to mount a tmpfs (root, as in CI).
mkdir -p "$WORK/full_ev"
if mount -t tmpfs -o size=64k tmpfs "$WORK/full_ev" 2>/dev/null; then
  dd if=/dev/zero of="$WORK/full_ev/filler" bs=64k 2>/dev/null
  expect 1 "error: cannot write events file full_ev/ev.jsonl: No space left on device" --may-write full_ev -- \
    "${L[@]}" --events full_ev/ev.jsonl -- "${J[@]}" --steps 2
  umount "$WORK/full_ev"
else
  echo "skipped: cannot mount a tmpfs on $WORK/full_ev (mounting needs root); the full events file case did not run"
fi
rmdir "$WORK/full_ev"

# ---- every number finite and in range ----
expect 2 "--np: '0' is out of range; give an integer from 1" -- "${L[@]}" --np 0 -- "${J[@]}" --steps 2
expect 2 "--np: '-2' is out of range" -- "${L[@]}" --np -2 -- "${J[@]}" --steps 2
expect 2 "--probe-every-s: 'nan' is not a finite number; give a number above 0 and at most 604800" -- \
  "$MT" launch --grow --probe-every-s nan -- "${J[@]}" --steps 2 --checkpoint-dir ck
expect 2 "--probe-every-s: '0' is out of range" -- "$MT" launch --grow --probe-every-s 0 -- "${J[@]}" --checkpoint-dir ck
expect 2 "--probe-timeout-s: 'inf' is not a finite number" -- "${L[@]}" --probe-timeout-s inf -- "${J[@]}" --steps 2
expect 2 "--probe-timeout-s: '1e9' is out of range" -- "${L[@]}" --probe-timeout-s 1e9 -- "${J[@]}" --steps 2
expect 2 "--stall-timeout-s: 'nan' is not a finite number; give a number from 0 to 604800" -- \
  "${L[@]}" --stall-timeout-s nan -- "${J[@]}" --steps 2
expect 2 "--stall-timeout-s: '-1' is out of range" -- "${L[@]}" --stall-timeout-s -1 -- "${J[@]}" --steps 2
expect 2 "--max-restarts: '-1' is out of range" -- "$MT" launch --max-restarts -1 -- "${J[@]}" --steps 2
expect 2 "--max-restarts: '1.5' is not a whole number" -- "$MT" launch --max-restarts 1.5 -- "${J[@]}" --steps 2
expect 2 "--min-ranks: '0' is out of range" -- "${L[@]}" --min-ranks 0 -- "${J[@]}" --steps 2
expect 2 "--max-ranks: '99999999999' is out of range" -- "${L[@]}" --max-ranks 99999999999 -- "${J[@]}" --steps 2

# ---- a failure that would repeat is not retried (exit 2, said once) ----
if [ "$(id -u)" = 0 ]; then  # mpirun refuses root: said before anything runs
  expect 2 "mpirun refuses to start as root unless told: set OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" -- \
    env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM "$MT" launch --np 2 -- "${J[@]}" --steps 2 --dp 2 --checkpoint-dir ck
  expect 1 "" -- test -e ck
fi
# An mpirun (a wrapper) that refuses root at run time: not restarted, the fix said.
printf '#!/bin/sh\necho "mpirun has detected an attempt to run as root." >&2\nexit 1\n' > "$WORK/root-mpirun"
# An mpirun that fails the same way every time before the job begins: one restart, then stop.
printf '#!/bin/sh\necho "no route to the hosts" >&2\nexit 1\n' > "$WORK/failing-mpirun"
chmod +x "$WORK/root-mpirun" "$WORK/failing-mpirun"
expect 2 "launch: mpirun refused to start the job: .*OMPI_ALLOW_RUN_AS_ROOT=1" -- \
  "$MT" launch --np 2 --mpirun ./root-mpirun -- "${J[@]}" --steps 2 --dp 2 --checkpoint-dir ck
expect 2 "failed again before its first step with the same output \(exit 1\)" -- \
  "$MT" launch --np 2 --mpirun ./failing-mpirun -- "${J[@]}" --steps 2 --dp 2 --checkpoint-dir ck
expect 1 "" -- test -e ck  # the directory the launcher made for a job that never began is gone
rm -f "$WORK/root-mpirun" "$WORK/failing-mpirun"

# ---- nothing of the launcher's own is left ----
# A job that refuses its input: no empty checkpoint directory (train alone makes none).
expect 2 "missing.txt" -- "$MT" launch -- train --data missing.txt --steps 2 --quiet --checkpoint-dir ck_a/b/c
expect 1 "" -- test -e ck_a
# A job that ran: its checkpoints, and no status file of the launcher's.
expect 0 "" --may-write ck -- "$MT" launch -- "${J[@]}" --steps 2 --checkpoint-dir ck --checkpoint-every 1
expect 0 "^latest step_00000001 step_00000002 $" -- bash -c 'printf "%s " $(ls -A ck)'
# Given up (exit 1): the same.
expect 1 "giving up" --may-write ck2 -- \
  "$MT" launch --max-restarts 0 -- "${J[@]}" --steps 4 --dp 2 --checkpoint-dir ck2 --checkpoint-every 1 --fail-rank 1 --fail-at-step 2
expect 0 "^latest step_00000001 step_00000002 $" -- bash -c 'printf "%s " $(ls -A ck2)'
rm -rf "$WORK/ck" "$WORK/ck2"

# ---- two SIGINTs to launch while the job saves every step: `latest` names a whole checkpoint,
# no latest.tmp, nothing of the launcher's left (tests/cli/test_crash_cli.cpp sweeps the delay;
# here a few fixed ones). The exit is 0 (the graceful stop won) or 130 (the second signal).
for delay in 0 0.05 0.2; do
  expect 0 "^whole$" --may-write ck_sig -- bash -c '
    rm -rf ck_sig
    "$0" launch --max-restarts 0 -- train --data corpus.txt --quiet --steps 400 --checkpoint-dir ck_sig \
      --checkpoint-every 1 > /dev/null 2>&1 &
    pid=$!
    for i in $(seq 600); do [ -e ck_sig/latest ] && break; sleep 0.05; done
    kill -INT $pid; sleep "$1"; kill -INT $pid
    wait $pid; rc=$?
    [ "$rc" = 0 ] || [ "$rc" = 130 ] || { echo "exit $rc"; exit 1; }
    [ ! -e ck_sig/latest.tmp ] || { echo "latest.tmp left"; exit 1; }
    ls -A ck_sig | grep -q "^\.launch-status" && { echo "status file left"; exit 1; }
    step=$(cat ck_sig/latest)
    [ -f "ck_sig/$step/index.json" ] && echo whole || echo "latest names $step, which is not whole"' "$MT" "$delay"
done
rm -rf "$WORK/ck_sig"
