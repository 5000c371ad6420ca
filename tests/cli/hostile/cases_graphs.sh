# Model files (layer graphs, docs/models.md): every malformed graph exits 2 with a sentence
# naming the layer and the field, and writes nothing; `model show` refuses what train refuses.
# Sourced by tests/cli/hostile.sh ($MT: the program, $WORK: the scratch folder).
graph() {  # graph FILE LAYERS-JSON [INPUT-JSON]: a model file with these layers
  printf '{"name": "g", "input": %s, "layers": [%s]}\n' "${3:-{\"image\": [1, 28, 28], \"classes\": 10\}}" "$2" >"$WORK/$1"
}
FC='{"name": "fc", "op": "linear", "out_features": 10}'
graph g_noop.json '{"name": "a"}'
expect 2 "layer 0 'a' has no \"op\"" -- "$MT" train --model g_noop.json --data fashion-mnist --steps 1 --quiet
graph g_op.json '{"name": "a", "op": "conv3d"}'
expect 2 "layer 0 'a' has the unknown op 'conv3d'; the ops are conv2d, batchnorm2d" -- "$MT" model show g_op.json
graph g_field.json '{"name": "a", "op": "conv2d", "out_channels": 8, "kernel": 3}'
expect 2 "layer 0 'a' \\(conv2d\\) has the unknown field \"kernel\"; conv2d takes out_channels, kernel_size" -- \
  "$MT" train --model g_field.json --data fashion-mnist --steps 1 --quiet
graph g_from.json '{"name": "f", "op": "flatten"}, {"name": "fc", "op": "linear", "out_features": 10, "from": "nope"}'
expect 2 "layer 1 'fc' reads 'nope', which names no layer" -- "$MT" model show g_from.json
graph g_cycle.json '{"name": "a", "op": "relu", "from": "b"}, {"name": "b", "op": "flatten"}, '"$FC"
expect 2 "layer 0 'a' reads 'b', a later layer" -- "$MT" train --model g_cycle.json --data fashion-mnist --steps 1 --quiet
graph g_add.json '{"name": "a", "op": "conv2d", "out_channels": 32, "kernel_size": 1},
  {"name": "b", "op": "conv2d", "out_channels": 64, "kernel_size": 1, "from": "input"},
  {"name": "s", "op": "add", "from": ["a", "b"]}, {"name": "f", "op": "flatten"}, '"$FC"
expect 2 "layer 2 's' \\(add\\) adds 'a' \\(N, 32, 28, 28\\) and 'b' \\(N, 64, 28, 28\\)" -- "$MT" model show g_add.json
graph g_flat.json '{"name": "a", "op": "conv2d", "out_channels": 8, "kernel_size": 3}, '"$FC"
expect 2 "layer 1 'fc' \\(linear\\) takes features \\(N, F\\); its input 'a' is \\(N, 8, 26, 26\\): put a flatten" -- \
  "$MT" train --model g_flat.json --data fashion-mnist --steps 1 --quiet
graph g_shrink.json '{"name": "a", "op": "conv2d", "out_channels": 8, "kernel_size": 7}, {"name": "f", "op": "flatten"}, '"$FC" \
  '{"image": [1, 4, 4], "classes": 10}'
expect 2 "layer 0 'a' \\(conv2d\\) has a 7x7 convolution over a 4x4 map \\(padding 0\\): the map would shrink below 1" -- \
  "$MT" model show g_shrink.json
graph g_dup.json '{"name": "a", "op": "flatten"}, {"name": "a", "op": "linear", "out_features": 10}'
expect 2 "layer 1 'a' has the name of layer 0; names must be unique" -- "$MT" model show g_dup.json
graph g_range.json '{"name": "f", "op": "flatten"}, {"name": "fc", "op": "linear", "out_features": 99999999999}'
expect 2 "layer 1 'fc' \\(linear\\): \"out_features\" is 99999999999, more than 65536" -- "$MT" model show g_range.json
printf '[1, 2]\n' >"$WORK/g_array.json"
expect 2 "model config file g_array.json is array, but a model file must be a JSON object: a layer graph" -- "$MT" model show g_array.json
expect 2 "model config file missing.json does not exist" -- "$MT" model show missing.json
expect 2 "unknown model 'vgg-huge'" -- "$MT" model show vgg-huge
expect 2 "gpt-tiny is a transformer \\(a GPT config\\), not a layer graph" -- "$MT" model show gpt-tiny
# 100,000 layers: refused before any layer is built.
python3 -c 'import json; print(json.dumps({"name": "big", "input": {"image": [1, 28, 28], "classes": 10},
  "layers": [{"name": "r%d" % i, "op": "relu"} for i in range(100000)]}))' >"$WORK/g_big.json"
expect 2 "\"layers\" has 100000 layers, more than the 10000 a graph may have" -- "$MT" model show g_big.json
expect 2 "--tp 3 cannot split vgg-mini's convolutions" -- \
  "$MT" model show "$SOURCE_DIR/examples/models/vgg-mini.json" --tp 3
expect 2 "--tp, --spatial and --branch-parallel each split the layers" -- \
  "$MT" model show "$SOURCE_DIR/examples/models/vgg-mini.json" --tp 2 --spatial 2
rm -f "$WORK"/g_*.json
