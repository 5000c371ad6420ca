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
# Unwritable (/proc: refused by access() for a user, by trying to create a file for root): no
# output at all, the reason, exit 2 before anything is computed or printed.
expect 2 "^meshtrain: --svg /proc/lane.svg: (the directory /proc is not writable|no file can be created in the directory /proc \(.*\)); choose another path$" -- \
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
expect 2 "^meshtrain: -o /proc/x.svg: (the directory /proc is not writable|no file can be created in the directory /proc)" -- \
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

# ---- checkpoints: a small one, and copies altered behind valid CRCs ----
expect 0 "" --may-write ck -- "$MT" train --data corpus.txt --steps 2 --quiet --checkpoint-dir ck --checkpoint-every 1
# alter_ck FOLDER MODE: rewrites FOLDER/model-00000.safetensors (MODE nan: one weight of
# ln_f.weight becomes NaN; shape: ln_f.weight's header shape [C] becomes [2, C/2], the same bytes)
# and records the file's new size and CRC32 in index.json with the index's own CRC, in the form
# meshtrain writes, so that only the check aimed at finds it.
alter_ck() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys, zlib
folder, mode = sys.argv[1], sys.argv[2]
path = folder + "/model-00000.safetensors"
b = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
header = json.loads(b[8:8 + n])
data = b[8 + n:]
e = header["ln_f.weight"]
if mode == "nan":
    data[e["data_offsets"][0]:e["data_offsets"][0] + 4] = struct.pack("<f", float("nan"))
else:
    e["shape"] = [2, e["shape"][0] // 2]
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * ((8 - len(text) % 8) % 8)
b = struct.pack("<Q", len(text)) + text + bytes(data)
open(path, "wb").write(b)
ipath = folder + "/index.json"
j = json.loads(open(ipath, encoding="utf-8").read())
j["files"]["model-00000.safetensors"] = {"crc32": zlib.crc32(b), "size": len(b)}
j.pop("index_crc32")
j["index_crc32"] = zlib.crc32(json.dumps(j, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode())
open(ipath, "w", encoding="utf-8").write(json.dumps(j, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
PY
}
mkdir -p "$WORK/bad"
cp -r "$WORK/ck/step_00000002" "$WORK/bad/nan" && alter_ck "$WORK/bad/nan" nan
cp -r "$WORK/ck/step_00000002" "$WORK/bad/shape" && alter_ck "$WORK/bad/shape" shape

# ---- checkpoint convert: never into the checkpoint it reads ----
C=(checkpoint convert --to-single)
for out in ck/step_00000002/model-00000.safetensors ck/step_00000002/index.json ck/latest ck/other.safetensors; do
  expect 2 "^meshtrain: the output $out lies inside the checkpoint ck, which this command reads" -- "$MT" "${C[@]}" ck "$out"
done
expect 2 "^meshtrain: the output ck/step_00000002/index.json lies inside the checkpoint ck/step_00000002" -- \
  "$MT" "${C[@]}" ck/step_00000002 ck/step_00000002/index.json
ln -sfn ck/step_00000002 "$WORK/steplink"
expect 2 "^meshtrain: the output ck/step_00000002/model.st lies inside the checkpoint steplink" -- \
  "$MT" "${C[@]}" steplink ck/step_00000002/model.st
expect 2 "^meshtrain: the output corpus.txt already exists and was not written by meshtrain.*--overwrite" -- \
  "$MT" "${C[@]}" ck corpus.txt
echo "my weights" > "$WORK/mine.safetensors"
expect 0 "wrote mine.safetensors" --may-write mine.safetensors -- "$MT" "${C[@]}" ck mine.safetensors --overwrite
expect 2 "^meshtrain: the output /dev/null is not a regular file" -- "$MT" "${C[@]}" ck /dev/null --overwrite
expect 2 "^meshtrain: the output /proc/x.safetensors: (the directory /proc is not writable|no file can be created in the directory /proc)" -- \
  "$MT" "${C[@]}" ck /proc/x.safetensors
expect 0 "wrote gpt2.safetensors: 52 tensors" --may-write gpt2.safetensors -- "$MT" "${C[@]}" ck gpt2.safetensors
expect 0 "wrote gpt2.safetensors" --may-write gpt2.safetensors -- "$MT" "${C[@]}" ck gpt2.safetensors  # its own file
# A write that fails: exit 1 naming the file and the cause; no temporary file left, the old file kept.
expect 1 "^meshtrain: error: cannot write the converted checkpoint gpt2.safetensors: cannot write gpt2.safetensors.tmp: File too large" -- \
  bash -c "trap '' XFSZ; ulimit -f 1; exec \"\$0\" checkpoint convert --to-single ck gpt2.safetensors" "$MT"
expect 2 "^meshtrain: checkpoint bad/nan: model-00000.safetensors holds non-finite values \(NaN or infinity\) in tensor ln_f.weight" -- \
  "$MT" "${C[@]}" bad/nan out.safetensors
expect 2 "^meshtrain: checkpoint bad/shape is corrupt: model-00000.safetensors holds tensor ln_f.weight as F32 \(2, 64\) but index.json records it as F32 \(128\);" -- \
  "$MT" "${C[@]}" bad/shape out.safetensors

# ---- generate: safe sampling, the same checkpoints as convert ----
G=(generate --tokens 8 --prompt "To ")
expect 0 "^To " -- "$MT" "${G[@]}" --checkpoint ck --temperature 1e-30
# A tiny temperature samples greedily: byte 0xFF (what the overflowed softmax gave) never comes out.
expect 0 "" -- bash -c "set -o pipefail; \"\$0\" generate --checkpoint ck --tokens 16 --temperature 1e-30 |
  od -An -tx1 | { ! grep -q ' ff'; }" "$MT"
for t in 0 -1 nan inf 1e-400; do
  expect 2 "^meshtrain: --temperature must be a finite number above 0" -- "$MT" "${G[@]}" --checkpoint ck --temperature "$t"
done
expect 2 "^meshtrain: checkpoint bad/nan: model-00000.safetensors holds non-finite values \(NaN or infinity\) in tensor ln_f.weight" -- \
  "$MT" "${G[@]}" --checkpoint bad/nan
expect 2 "^meshtrain: checkpoint bad/shape is corrupt: model-00000.safetensors holds tensor ln_f.weight as F32 \(2, 64\) but index.json records it as F32 \(128\);" -- \
  "$MT" "${G[@]}" --checkpoint bad/shape
# `latest` missing or unreadable: the newest valid step folder, with a note, as --resume and convert.
cp -r "$WORK/ck" "$WORK/nolatest" && rm "$WORK/nolatest/latest"
expect 0 "meshtrain: note: \`latest\` is missing in nolatest; resuming from the newest valid step folder, step_00000002" -- \
  "$MT" "${G[@]}" --checkpoint nolatest
expect 0 "meshtrain: note: \`latest\` is missing in nolatest" --may-write o2.safetensors -- "$MT" "${C[@]}" nolatest o2.safetensors
# A NUL in `latest` is quoted escaped, the message goes on past it.
printf 'step_0000\0002\n' > "$WORK/nolatest/latest"
expect 0 "\`latest\` in nolatest holds 'step_0000\\\\x002', not a step folder name; resuming from the newest valid one, step_00000002" -- \
  "$MT" "${G[@]}" --checkpoint nolatest
expect 0 "\`latest\` in nolatest holds 'step_0000\\\\x002', not a step folder name" --may-write nolatest -- \
  "$MT" train --data corpus.txt --steps 3 --quiet --checkpoint-dir nolatest --resume
rm -rf "$WORK/bad" "$WORK/nolatest" "$WORK/steplink" "$WORK"/*.safetensors
rm -rf "$WORK/ck"
