# The output policy and the strict reading of input across subcommands: no output, whatever its
# flags (--overwrite included), lands among a checkpoint's files; images are never resized to
# fit a model; one layout check for train and plan; the parser's refusals in sentences;
# refusals before any work. Sourced by tests/cli/hostile.sh ($MT: the program, $WORK: the
# scratch folder with corpus.txt; $here: tests/cli).
CLUSTER="$here/../../examples/clusters/this-machine.json"

# ---- a checkpoint on disk is never another command's output ----
expect 0 "" --may-write ck -- "$MT" train --data corpus.txt --steps 2 --quiet --checkpoint-dir ck --checkpoint-every 1
for out in ck/latest ck/step_00000002/index.json ck/step_00000002/model-00000.safetensors ck/step_00000003 \
           ck/latest.tmp; do
  expect 2 "^meshtrain: --svg $out lies among the files of the checkpoint /.*/ck(/step_00000002)? \\(.*\\): choose a path outside it for --svg$" -- \
    "$MT" plan --model gpt-tiny --cluster "$CLUSTER" --global-batch 8 --top 1 --svg "$out" --overwrite
  expect 2 "^meshtrain: --out $out lies among the files of the checkpoint .*ck" -- "$MT" calibrate --quick --out "$out" --overwrite
  expect 2 "^meshtrain: --svg $out lies among the files of the checkpoint .*ck" -- "$MT" schedule --svg "$out" --overwrite
done
expect 2 "^meshtrain: -o ck/latest lies among the files of the checkpoint .*ck" -- \
  "$MT" trace render corpus.txt -o ck/latest --overwrite
# Another run's outputs, and another checkpoint's folders, are the same.
cp -r "$WORK/ck" "$WORK/ck2"
expect 2 "--metrics ck2/latest lies among the files of the checkpoint .*ck2" -- \
  "$MT" train --data corpus.txt --steps 2 --quiet --metrics ck2/latest --overwrite
expect 2 "--trace ck2/step_00000002/t.json lies among the files of the checkpoint .*ck2/step_00000002" -- \
  "$MT" train --data corpus.txt --steps 2 --quiet --trace ck2/step_00000002/t.json --overwrite
expect 2 "--checkpoint-dir ck2/step_00000002 lies among the files of the checkpoint .*ck2" -- \
  "$MT" train --data corpus.txt --steps 2 --quiet --checkpoint-dir ck2/step_00000002
expect 2 "the output ck2/latest lies among the files of the checkpoint .*ck2" -- \
  "$MT" checkpoint convert --to-single ck ck2/latest --overwrite
# A file named `latest` outside any checkpoint is an ordinary output.
expect 0 "swimlane: latest" --may-write latest -- "$MT" schedule --svg latest
rm -rf "$WORK/ck2" "$WORK/latest"

# ---- empty paths are refused at once (calibrate measured for seconds before failing) ----
expect 2 "^meshtrain: --out: the path is empty; give a file name \(or leave the flag out\)$" -- "$MT" calibrate --out ""
expect 2 "--svg: the path is empty" -- "$MT" schedule --svg ""
expect 2 "--svg: the path is empty" -- "$MT" plan --model gpt-tiny --cluster "$CLUSTER" --global-batch 8 --svg ""
expect 2 "--cluster: the path is empty" -- "$MT" plan --model gpt-tiny --cluster "" --global-batch 8
expect 2 "--output: the path is empty" -- "$MT" trace render corpus.txt -o ""
expect 2 "--checkpoint: the path is empty" -- "$MT" eval --checkpoint ""
expect 2 "--checkpoint: the path is empty" -- "$MT" generate --checkpoint ""
expect 2 "from: the path is empty" -- "$MT" checkpoint convert --to-single "" out.safetensors

# ---- the parser's refusals, in sentences ----
expect 2 "^meshtrain: --steps is given 2 times; give it once$" -- "$MT" train --steps 1 --steps 2 --data corpus.txt
expect 2 "^meshtrain: launch reads its own options, then the job after \`--\`: give \`meshtrain launch \[options\] -- train ARGS...\` \(--data, --steps are not options of launch\)$" -- \
  "$MT" launch train --steps 2 --data corpus.txt
expect 2 "^meshtrain: --bogus is not an option of \`meshtrain train\`; see \`meshtrain train --help\` for the ones it takes$" -- \
  "$MT" train --bogus
expect 2 "^meshtrain: --lr: 'abc' is not a number; see \`meshtrain train --help\`$" -- "$MT" train --lr abc
expect 2 "^meshtrain: --lr needs a value; give one or leave the flag out" -- "$MT" train --lr
expect 2 "^meshtrain: \`meshtrain eval\` needs --checkpoint; see \`meshtrain eval --help\`$" -- "$MT" eval
expect 2 "^meshtrain: \`meshtrain\` needs a subcommand: one of train, generate, .*bench; see \`meshtrain --help\`$" -- "$MT"
expect 2 "^meshtrain: \`meshtrain bench\` needs a subcommand: one of comm" -- "$MT" bench
expect 2 "^meshtrain: \`meshtrain checkpoint convert\` needs from; see" -- "$MT" checkpoint convert --to-single

# ---- refusals before work: no machine measured for a run that is refused ----
mkdir -p "$WORK/home"
expect 2 "--data is required" -- env HOME="$WORK/home" "$MT" train --steps 2
expect 2 "--tp 3 .*attention heads|heads do not divide over --tp 3" -- env HOME="$WORK/home" "$MT" train --data corpus.txt --tp 3
expect 0 "" -- bash -c "[ -z \"\$(ls -A home)\" ]"  # nothing measured, nothing cached
rm -rf "$WORK/home"

# ---- a schedule the run cannot complete is stated ----
expect 0 "100 warm-up steps \(NOTE: more than the run's 3 steps, so the rate ends at 3e-05 and never reaches 0.001" -- \
  "$MT" train --data corpus.txt --steps 3 --lr 1e-3 --log-every 1
expect 0 "lr 0.001, 3 warm-up steps, then" -- "$MT" train --data corpus.txt --steps 3 --lr 1e-3 --warmup 3 --log-every 1

# ---- one layout check: plan refuses what train refuses ----
expect 2 "--tp 3 cannot split resnet-small's convolutions: .* do not divide by 3" -- \
  "$MT" plan --model resnet-small --cluster "$CLUSTER" --global-batch 32 --layout tp=3
expect 2 "heads do not divide over --tp 3|larger than the model's" -- \
  "$MT" plan --model gpt-tiny --cluster "$CLUSTER" --global-batch 12 --layout tp=3
expect 0 "dp=1 tp=2 pp=1" -- "$MT" plan --model resnet-small --cluster "$CLUSTER" --global-batch 32 --layout tp=2

# ---- images are never resized to fit: their size must be the model's (a scale is asked for) ----
# make_idx DIR SIZE: the four IDX files of 20 training and 10 test images of SIZE x SIZE.
make_idx() {
  python3 - "$1" "$2" <<'PY'
import os, struct, sys
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
for split, count in (("train", 20), ("t10k", 10)):
    with open(f"{d}/{split}-images-idx3-ubyte", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, count, n, n) + bytes((i * 7) % 256 for i in range(count * n * n)))
    with open(f"{d}/{split}-labels-idx1-ubyte", "wb") as f:
        f.write(struct.pack(">II", 0x801, count) + bytes(i % 10 for i in range(count)))
PY
}
make_idx "$WORK/img4" 4
make_idx "$WORK/img1" 1
make_idx "$WORK/img28" 28
expect 2 "the images of --data img4 are \(1, 4, 4\), but cnn-small takes \(1, 28, 28\); give a data set of that size; to train on them upsampled, give a config with \"scale\": 7" -- \
  "$MT" train --model cnn-small --data img4 --steps 1 --batch 4 --quiet
expect 2 "the images of --data img1 are \(1, 1, 1\), but resnet-small takes \(1, 28, 28\)" -- \
  "$MT" train --model resnet-small --data img1 --steps 1 --batch 4 --quiet
printf '{"family": "cnn", "name": "resnet-small", "scale": 2}' > "$WORK/r2.json"
expect 2 "the images of --data img4 are \(1, 4, 4\) \(\(1, 8, 8\) at the config's \"scale\": 2\), but resnet-small takes \(1, 56, 56\)" -- \
  "$MT" train --config r2.json --data img4 --steps 1 --batch 4 --quiet
expect 0 "" --may-write ck28 -- \
  "$MT" train --model cnn-small --data img28 --steps 1 --batch 4 --quiet --checkpoint-dir ck28 --eval-batches 1
expect 2 "^meshtrain: the images of --data img4 are \(1, 4, 4\), but cnn-small takes \(1, 28, 28\)" -- \
  "$MT" eval --checkpoint ck28 --data img4
expect 2 "^meshtrain: --batch 99999999999 is more than the 10 test images of img28; give at most 10$" -- \
  "$MT" eval --checkpoint ck28 --data img28 --batch 99999999999
expect 0 "accuracy" -- "$MT" eval --checkpoint ck28 --data img28 --batch 10
# eval of an empty directory: no note of train's ("starting from step 0").
mkdir -p "$WORK/empty_ck"
expect 2 "^meshtrain: checkpoint directory empty_ck holds no step folder; nothing to evaluate$" -- \
  "$MT" eval --checkpoint empty_ck --data img28
rm -rf "$WORK/img4" "$WORK/img1" "$WORK/img28" "$WORK/ck28" "$WORK/r2.json" "$WORK/empty_ck" "$WORK/ck"
