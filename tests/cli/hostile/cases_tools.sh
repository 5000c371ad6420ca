# The tool subcommands (bench comm, schedule, trace render, checkpoint convert, generate):
# strict values, outputs that never overwrite an input, checkpoints that disagree with
# themselves refused. Sourced by tests/cli/hostile.sh ($MT: the program, $WORK: the scratch
# folder with corpus.txt).

# ---- bench comm --sizes: whole, finite, element-sized byte counts that fit in memory ----
B=(bench comm --iters 1 --warmup 0 --reps 1)
expect 2 "--sizes 4:1.8e19: '1.8e19' is more than 1 TiB" -- "$MT" "${B[@]}" --sizes 4:1.8e19
expect 2 "--sizes 1:1.8e19: '1' is 1 bytes, less than one float32 element" -- "$MT" "${B[@]}" --sizes 1:1.8e19
expect 2 "--sizes 64G: the largest size, 64G, needs at least .* available" -- "$MT" "${B[@]}" --sizes 64G
expect 2 "--sizes nan: 'nan' is not a size" -- "$MT" "${B[@]}" --sizes nan
expect 2 "--sizes inf: 'inf' is not a size" -- "$MT" "${B[@]}" --sizes inf
expect 2 "--sizes 0.1: '0.1' is 0.1 bytes, not a whole number of bytes" -- "$MT" "${B[@]}" --sizes 0.1
expect 2 "--sizes 6: '6' is 6 bytes, not a multiple of the 4-byte float32 element; give 4 or 8" -- "$MT" "${B[@]}" --sizes 6
expect 2 "--sizes 4K,,8K: item 2 is empty" -- "$MT" "${B[@]}" --sizes 4K,,8K
expect 2 "--sizes 8K:4K: the range runs backwards" -- "$MT" "${B[@]}" --sizes 8K:4K
expect 2 "--sizes 4K:8K:16K: give either one range" -- "$MT" "${B[@]}" --sizes 4K:8K:16K
expect 2 "8 is less than one float32 element per rank for all_gather over 3 ranks" -- \
  "$MT" "${B[@]}" --op all_gather --world 3 --sizes 8
expect 0 "rounded down to a multiple of 3 ranks" -- "$MT" "${B[@]}" --op all_gather --world 3 --sizes 1K

# ---- schedule: finite costs in range, readable --action-costs, zb, --svg checked first ----
expect 2 "--costs: F must be a finite number from 1e-09 to 1e\+12, not '1e308'" -- \
  "$MT" schedule --costs F=1e308,B=1e308
expect 2 "--costs: W must be a finite number from 1e-09 to 1e\+12, not '1e-320'" -- "$MT" schedule --costs W=1e-320
expect 2 "--costs: send must be a finite number from 0 to 1e\+12, not 'inf'" -- "$MT" schedule --costs send=inf
mkdir -p "$WORK/adir"
expect 2 "--action-costs adir is a directory; give a file of lines" -- "$MT" schedule --action-costs adir
printf '0F0 1e300\n' > "$WORK/times.txt"
expect 2 "the time of 0F0 must be a finite number from 0 to 1e\+12, not '1e300'" -- \
  "$MT" schedule --pp 1 --microbatches 1 --action-costs times.txt
printf '0F0 0\n0B0 0\n' > "$WORK/times.txt"
expect 2 "the simulated step takes 0 units, so it has no bubble to measure" -- \
  "$MT" schedule --pp 1 --microbatches 1 --action-costs times.txt
expect 0 "schedule zb-h1: pp 2" -- "$MT" schedule --schedule zb --pp 2 --microbatches 2
expect 2 "--svg times.txt is the same file as --action-costs times.txt" -- \
  "$MT" schedule --pp 1 --microbatches 1 --action-costs times.txt --svg times.txt
echo "my notes" > "$WORK/notes.svg"
expect 2 "--svg notes.svg already exists and was not written by meshtrain.*--overwrite" -- "$MT" schedule --svg notes.svg
expect 0 "swimlane: notes.svg" --may-write notes.svg -- "$MT" schedule --svg notes.svg --overwrite
expect 0 "swimlane: notes.svg" --may-write notes.svg -- "$MT" schedule --svg notes.svg  # now meshtrain's own
# Unwritable: no output at all, the reason, exit 2 before anything is computed or printed.
expect 2 "^meshtrain: --svg /proc/lane.svg: no file can be created in the directory /proc \(.*\); choose another path$" -- \
  "$MT" schedule --svg /proc/lane.svg
expect 2 "^meshtrain: --svg corpus.txt/lane.svg: corpus.txt is not a directory" -- "$MT" schedule --svg corpus.txt/lane.svg
expect 2 "^meshtrain: --svg missing/lane.svg: the directory missing does not exist" -- "$MT" schedule --svg missing/lane.svg
if [ "$(id -u)" != 0 ]; then
  mkdir -p "$WORK/ro" && chmod 555 "$WORK/ro"
  expect 2 "^meshtrain: --svg ro/lane.svg: the directory ro is not writable" -- "$MT" schedule --svg ro/lane.svg
fi
# A write that fails after the check (a file size limit here, a full disk elsewhere): exit 1
# with the cause, no report printed, no fragment left.
expect 1 "^meshtrain: error: cannot write the swimlane file lane.svg: File too large$" -- \
  bash -c "trap '' XFSZ; ulimit -f 0; exec \"\$0\" schedule --svg lane.svg" "$MT"
rm -rf "$WORK/adir" "$WORK/times.txt" "$WORK/notes.svg"

# ---- trace render: the trace is never the output, paths checked before reading ----
expect 0 "" --may-write t.json --may-write t.svg -- "$MT" train --data corpus.txt --steps 2 --quiet --trace t.json
expect 2 "^meshtrain: -o t.json is the same file as the trace t.json, which this command reads" -- \
  "$MT" trace render t.json -o t.json
ln -sf t.json "$WORK/tlink.json"
expect 2 "^meshtrain: -o t.json is the same file as the trace tlink.json" -- "$MT" trace render tlink.json -o t.json
mkdir -p "$WORK/tdir"
expect 2 "^meshtrain: the trace tdir is a directory; give the JSON file" -- "$MT" trace render tdir -o x.svg
expect 2 "^meshtrain: -o /proc/x.svg: no file can be created in the directory /proc" -- \
  "$MT" trace render t.json -o /proc/x.svg
# Checked before reading: a missing trace with an unusable -o names -o.
expect 2 "^meshtrain: -o missing/x.svg: the directory missing does not exist" -- \
  "$MT" trace render nope.json -o missing/x.svg
echo "my drawing" > "$WORK/mine.svg"
expect 2 "^meshtrain: -o mine.svg already exists and was not written by meshtrain.*--overwrite" -- \
  "$MT" trace render t.json -o mine.svg
expect 0 "swimlane: mine.svg" --may-write mine.svg -- "$MT" trace render t.json -o mine.svg --overwrite
expect 0 "swimlane: t.svg" --may-write t.svg -- "$MT" trace render t.json -o t.svg  # train's own swimlane
expect 1 "^meshtrain: error: cannot write the swimlane file r.svg: File too large$" -- \
  bash -c "trap '' XFSZ; ulimit -f 0; exec \"\$0\" trace render t.json -o r.svg" "$MT"
rm -rf "$WORK/tlink.json" "$WORK/tdir" "$WORK/mine.svg" "$WORK/t.json" "$WORK/t.svg"
