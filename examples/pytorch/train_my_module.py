#!/usr/bin/env python3
"""Your PyTorch module, trained by meshtrain at any layout, and back into PyTorch.

  /usr/bin/python3 examples/pytorch/train_my_module.py [--meshtrain build/meshtrain] [--dp 2 --pp 2 ...]

1. export the module as ONNX (training mode, no constant folding, so the weights keep their
   state-dict names and batch norm stays batch norm);
2. `meshtrain train --model net.onnx` from the module's own weights, at the layout given on the
   command line (every flag after the script's own goes to `meshtrain train`);
3. `meshtrain checkpoint convert --to-single` the last checkpoint into a .npz state dict;
4. load it with load_state_dict(strict=True) and evaluate the module in PyTorch.

Needs PyTorch and NumPy (Debian: python3-torch, python3-numpy) and Fashion-MNIST
(dataset-fashion-mnist; scripts/setup.sh installs both). See docs/from_pytorch.md.
"""
import argparse
import gzip
import os
import struct
import subprocess
import tempfile

import numpy as np
import torch
import torch.nn as nn

DATA = "/usr/share/datasets/fashion-mnist"


class MyNet(nn.Module):
    """Any network of meshtrain's vocabulary: here a small VGG-like one with a residual add."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.GELU(), nn.Linear(128, 10))

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = x + torch.relu(self.bn2(self.conv2(x)))
        return self.head(nn.functional.max_pool2d(x, 2))


def test_images():
    """Fashion-MNIST's test split, normalised as meshtrain does ((x/255 - 0.2860) / 0.3530)."""
    def read(name):
        raw = gzip.decompress(open(os.path.join(DATA, name + ".gz"), "rb").read())
        dims = struct.unpack(">" + "I" * raw[3], raw[4:4 + 4 * raw[3]])
        return np.frombuffer(raw, np.uint8, offset=4 + 4 * raw[3]).reshape(dims)
    x = (read("t10k-images-idx3-ubyte").astype(np.float32) / 255 - 0.2860) / 0.3530
    return torch.from_numpy(x[:, None]), torch.from_numpy(read("t10k-labels-idx1-ubyte").astype(np.int64))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--meshtrain", default="build/meshtrain")
    p.add_argument("--steps", default="200")
    args, layout = p.parse_known_args()
    work = tempfile.mkdtemp(prefix="my_module_")
    net = MyNet()

    # 1. Export: training mode and no constant folding keep the module's names and its batch norms.
    onnx_path = os.path.join(work, "net.onnx")
    torch.onnx.export(net, torch.zeros(64, 1, 28, 28), onnx_path,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)

    # 2. Train at the layout given (e.g. --dp 2, --pp 2, --tp 2), from the module's own weights.
    ck = os.path.join(work, "checkpoints")
    subprocess.run([args.meshtrain, "model", "show", onnx_path], check=True)
    subprocess.run([args.meshtrain, "train", "--model", onnx_path, "--data", "fashion-mnist", "--steps", args.steps,
                    "--checkpoint-dir", ck] + layout, check=True)

    # 3. The state dict, as PyTorch keeps it.
    state_path = os.path.join(work, "state.npz")
    subprocess.run([args.meshtrain, "checkpoint", "convert", "--to-single", ck, state_path], check=True)

    # 4. Back into the module, strictly, and its own evaluation.
    state = {k: torch.from_numpy(v) for k, v in np.load(state_path).items()}
    net.load_state_dict(state, strict=True)
    net.eval()
    x, y = test_images()
    with torch.no_grad():
        correct = sum(int((net(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum()) for i in range(0, len(y), 1000))
    print(f"the module, trained by meshtrain, in PyTorch: test accuracy {100.0 * correct / len(y):.2f}% "
          f"(files in {work})")


if __name__ == "__main__":
    main()
