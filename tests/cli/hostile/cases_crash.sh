# Full disks (a small tmpfs mounted on $WORK/full): every write is checked. The run exits 1
# naming the file and the cause, the last good checkpoint stays `latest` and converts, and a
# previous trace stays whole (the checksums of lib.sh see any file changed or left behind).
# Needs the right to mount (root, as in CI); prints a "skipped" line where it is refused.
# Sourced by tests/cli/hostile.sh ($MT: the program, $WORK: the scratch folder with corpus.txt).
C=(train --data corpus.txt --batch 4 --seq 16 --eval-batches 1 --threads 1 --quiet)

_fill() {  # _fill BYTES: fills $WORK/full, then gives BYTES back
  dd if=/dev/zero of="$WORK/full/filler" bs=64k 2>/dev/null
  truncate -s $(($(stat -c %s "$WORK/full/filler") - $1)) "$WORK/full/filler"
}

mkdir -p "$WORK/full"
if ! mount -t tmpfs -o size=256k tmpfs "$WORK/full" 2>/dev/null; then
  echo "skipped: cannot mount a tmpfs on $WORK/full (mounting needs root); the full-disk cases did not run"
else
  # ---- the metrics file fills up mid-run: the step's checkpoint (`latest`) records its line ----
  _fill 4096
  expect 1 "cannot write metrics file full/m.jsonl: No space left on device \(at step [0-9]+\); the latest checkpoint stays step_[0-9]+ in ck" \
    --may-write full/m.jsonl --may-write ck -- "$MT" "${C[@]}" --steps 40 --checkpoint-every 1 --checkpoint-dir ck --metrics full/m.jsonl
  expect 0 "" --may-write single.safetensors -- "$MT" checkpoint convert --to-single "ck/$(cat "$WORK/ck/latest" 2>/dev/null)" single.safetensors
  rm -rf "$WORK/ck" "$WORK/single.safetensors" "$WORK/full/m.jsonl" "$WORK/full/filler"

  # ---- the trace at the end of the run: the previous trace and swimlane are kept whole ----
  expect 0 "" --may-write full/t.json --may-write full/t.svg -- "$MT" "${C[@]}" --steps 2 --trace full/t.json
  _fill 0
  expect 1 "cannot write trace full/t.json: No space left on device" --may-write ck -- \
    "$MT" "${C[@]}" --steps 3 --checkpoint-every 1 --checkpoint-dir ck --trace full/t.json
  expect 0 "^step_00000003$" -- cat ck/latest
  rm -rf "$WORK/ck" "$WORK/full/"*

  # ---- a checkpoint: two saves fit, the third fails; step 2 stays `latest` and converts ----
  umount "$WORK/full" && mount -t tmpfs -o size=25m tmpfs "$WORK/full"  # a gpt-tiny save: 9.6 MiB
  expect 1 "cannot save checkpoint full/ck/step_00000003.tmp/.*No space left on device.*the latest checkpoint stays step_00000002 in full/ck" \
    --may-write full/ck --may-write m.jsonl -- \
    "$MT" "${C[@]}" --dp 2 --steps 6 --checkpoint-every 1 --checkpoint-dir full/ck --metrics m.jsonl
  expect 0 "^step_00000002$" -- cat full/ck/latest
  expect 0 "^latest step_00000001 step_00000002 $" -- bash -c 'printf "%s " $(ls -A full/ck)'
  expect 0 "" --may-write single.safetensors -- "$MT" checkpoint convert --to-single full/ck/step_00000002 single.safetensors
  rm -rf "$WORK/full/"* "$WORK/m.jsonl" "$WORK/single.safetensors"
  umount "$WORK/full"
fi
rmdir "$WORK/full"
