# Image models beside token models: each refuses the other's data and what it cannot take.
# Sourced by tests/cli/hostile.sh ($MT: the program, $WORK: the scratch folder with corpus.txt).
expect 2 "cnn-small is an image model: --data corpus.txt is a file" -- \
  "$MT" train --model cnn-small --data corpus.txt --steps 1 --quiet
mkdir -p "$WORK/images"
expect 2 "gpt-tiny is a token model: --data images is a directory" -- \
  "$MT" train --model gpt-tiny --data images --steps 1 --quiet
expect 2 "gpt-tiny is a token model: --data fashion-mnist names images" -- \
  "$MT" train --model gpt-tiny --data fashion-mnist --steps 1 --quiet
expect 2 "--exact-sums slices the parameter gradients of convolutional networks' layers; gpt-tiny is a transformer" -- \
  "$MT" train --model gpt-tiny --data corpus.txt --exact-sums 2 --steps 1 --quiet
expect 2 "lacks train-images-idx3-ubyte|images" -- "$MT" train --model cnn-small --data images --steps 1 --quiet
rmdir "$WORK/images"
if [ -d /usr/share/datasets/fashion-mnist ]; then
  expect 2 "cnn-small has 3 units to cut between pipeline stages, fewer than the 4" -- \
    "$MT" train --model cnn-small --data fashion-mnist --pp 4 --microbatches 4 --steps 1 --quiet
  expect 2 "--tp 3 cannot split cnn-small's convolutions: conv1 \\(32 output channels\\) do not divide by 3; --tp 2, 4, 8, 16, 32" -- \
    "$MT" train --model cnn-small --data fashion-mnist --tp 3 --steps 1 --quiet
  expect 2 "--tp, --spatial and --branch-parallel each split the layers over the same intra-layer ranks" -- \
    "$MT" train --model cnn-small --data fashion-mnist --tp 2 --spatial 2 --steps 1 --quiet
  expect 2 "--exact-sums 3 slices do not split over --dp 2 ranks; use a multiple of 2" -- \
    "$MT" train --model cnn-small --data fashion-mnist --dp 2 --exact-sums 3 --steps 1 --quiet
  expect 2 "--sequence-parallel splits a transformer's sequence" -- \
    "$MT" train --model cnn-small --data fashion-mnist --tp 2 --sequence-parallel --steps 1 --quiet
  expect 2 "--spatial 8 cannot cut cnn-small's feature maps into 8 bands of rows" -- \
    "$MT" train --model cnn-small --data fashion-mnist --spatial 8 --steps 1 --quiet
  expect 2 "a split asked of a model with no Inception blocks \\(resnet-small\\)" -- \
    "$MT" train --model resnet-small --data fashion-mnist --branch-parallel 2 --steps 1 --quiet
  expect 2 "--branch-balance 0,0,0,0 leaves rank 1 of --branch-parallel 2 without a branch" -- \
    "$MT" train --model inception-small --data fashion-mnist --branch-parallel 2 --branch-balance 0,0,0,0 --steps 1 --quiet
  expect 2 "--branch-parallel 5 asks for more ranks than an Inception block's 4 branches" -- \
    "$MT" train --model inception-small --data fashion-mnist --branch-parallel 5 --steps 1 --quiet
  expect 2 "--seq is the sequence length of token models" -- \
    "$MT" train --model resnet-small --data fashion-mnist --seq 16 --steps 1 --quiet
  expect 2 "--pp-balance 3,0: '0' is not a positive number of blocks" -- \
    "$MT" train --model cnn-small --data fashion-mnist --pp 2 --pp-balance 3,0 --steps 1 --quiet
  expect 2 "cnn-small is an image model: --augment crops and flips by meshtrain's own draws" -- \
    "$MT" train --model cnn-small --data fashion-mnist --data-order sequential --augment --steps 1 --quiet
fi
expect 2 "--spatial splits a convolutional network \\(its feature maps by row bands\\); a transformer splits its layers with --tp" -- \
  "$MT" train --model gpt-tiny --data corpus.txt --spatial 2 --steps 1 --quiet
expect 2 "--branch-balance places Inception branches on ranks; it needs --branch-parallel 2 or more" -- \
  "$MT" train --model inception-small --data fashion-mnist --branch-balance 0,1,1,0 --steps 1 --quiet
expect 2 "--augment applies to image models" -- "$MT" train --model gpt-tiny --data corpus.txt --augment --steps 1 --quiet
expect 2 "--batch-norm must be sync or local" -- \
  "$MT" train --model cnn-small --data fashion-mnist --batch-norm global --steps 1 --quiet
printf '{"family": "rnn", "name": "lstm"}' > "$WORK/rnn.json"
expect 2 "\"family\" must be \"gpt\" or \"cnn\"" -- "$MT" train --config rnn.json --data corpus.txt --steps 1 --quiet
printf '{"family": "cnn", "name": "alexnet"}' > "$WORK/alex.json"
expect 2 "unknown CNN 'alexnet'" -- "$MT" train --config alex.json --data fashion-mnist --steps 1 --quiet
rm -f "$WORK/rnn.json" "$WORK/alex.json"
expect 2 "unknown model 'vgg-16'; the named models are gpt-tiny" -- "$MT" train --model vgg-16 --data corpus.txt --steps 1 --quiet
