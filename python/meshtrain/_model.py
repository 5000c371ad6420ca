"""Models: a model file, an ONNX export, a named model, or a graph built here (docs/models.md)."""

import copy
import json
import os
import tempfile

from . import _cli


class Model:
    """A model meshtrain trains: what `meshtrain train --model` takes.

    Make one with Model.from_file(path), Model.from_onnx(path), Model.named(name),
    Model.from_dict(graph) or Builder(...).build(). A model is a description only: nothing is
    read or checked until it is shown, planned or trained (then the program's checks apply).
    """

    def __init__(self, *, path=None, name=None, graph=None):
        self._path = path
        self._name = name
        self._graph = graph

    # ---- the ways to make one ----

    @classmethod
    def from_file(cls, path):
        """A model file (a JSON layer graph, docs/models.md)."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"model file {path} does not exist")
        return cls(path=path)

    @classmethod
    def from_onnx(cls, path):
        """An ONNX graph exported from PyTorch (torch.onnx.export), as `train --model net.onnx` reads it."""
        path = os.fspath(path)
        if not path.endswith(".onnx"):
            raise ValueError(f"{path} is not an ONNX file (its name must end in .onnx); use Model.from_file for a "
                             "model file")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"ONNX file {path} does not exist")
        return cls(path=path)

    @classmethod
    def named(cls, name):
        """A model built into meshtrain: gpt-tiny, gpt-small, gpt2-124m, cnn-small, resnet-small, inception-small."""
        if not isinstance(name, str) or not name:
            raise ValueError("Model.named takes a model's name, such as 'gpt-tiny' or 'cnn-small'")
        return cls(name=name)

    @classmethod
    def from_dict(cls, graph):
        """A layer graph as a dict, the content of a model file (docs/models.md)."""
        if not isinstance(graph, dict):
            raise TypeError("Model.from_dict takes a dict: a model file's content (name, input, layers)")
        return cls(graph=copy.deepcopy(graph))

    # ---- what it is ----

    @property
    def name(self):
        """The model's name: a named model's, a graph's "name", or the file's path."""
        if self._graph is not None:
            return self._graph.get("name", "model")
        return self._name if self._name is not None else self._path

    def to_dict(self):
        """The layer graph as a dict (a named model or an ONNX file has none here: ValueError)."""
        if self._graph is not None:
            return copy.deepcopy(self._graph)
        if self._path is not None and not self._path.endswith(".onnx"):
            with open(self._path, encoding="utf-8") as f:
                return json.load(f)
        raise ValueError(f"{self.name} is not a graph held here; `meshtrain model show` describes it")

    def show(self, **options):
        """The text `meshtrain model show MODEL` prints: the layer table; options are its flags
        (tp=2, pp=2, spatial=2, branch_parallel=2, batch=64)."""
        with self.argument() as arg:
            args = ["model", "show", arg] + _cli.flags("model show", options, "Model.show")
            return _cli.native().show(args)

    def __repr__(self):
        if self._graph is not None:
            return f"Model.from_dict({{'name': {self.name!r}, ... {len(self._graph.get('layers', []))} layers}})"
        if self._name is not None:
            return f"Model.named({self._name!r})"
        return f"Model.from_file({self._path!r})"

    # ---- as the program's --model ----

    def argument(self):
        """A context manager giving the value of --model: a name, a path, or a graph written to a
        temporary file for the call."""
        return _ModelArgument(self)


class _ModelArgument:
    def __init__(self, model):
        self._model = model
        self._tmp = None

    def __enter__(self):
        m = self._model
        if m._graph is None:
            return m._name if m._name is not None else m._path
        self._tmp = tempfile.TemporaryDirectory(prefix="meshtrain-model-")
        name = str(m._graph.get("name", "model")).replace("/", "_") or "model"
        path = os.path.join(self._tmp.name, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(m._graph, f, indent=1)
        return path

    def __exit__(self, *exc):
        if self._tmp is not None:
            self._tmp.cleanup()
        return False


def as_model(model):
    """A Model from a Model, a dict (a graph), or a string (a named model or a file's path)."""
    if isinstance(model, Model):
        return model
    if isinstance(model, dict):
        return Model.from_dict(model)
    if isinstance(model, (str, os.PathLike)):
        text = os.fspath(model)
        if text.endswith(".onnx"):
            return Model.from_onnx(text)
        if os.path.sep in text or text.endswith(".json"):
            return Model.from_file(text)
        return Model.named(text)
    raise TypeError("model must be a meshtrain.Model, a dict (a layer graph), a model's name or a file's path, "
                    f"not {type(model).__name__}")


class Builder:
    """A layer graph built in code, mirroring the C++ builder (model/builder.h): each call adds a
    layer reading the previous one, or the layers `from_` names ("input": the images).

        net = (meshtrain.Builder("my-net", image=(1, 28, 28), classes=10)
               .conv2d("conv", out_channels=8, kernel_size=3, padding=1)
               .batchnorm2d("bn").relu("relu").maxpool2d("pool", kernel_size=2)
               .flatten("flat").linear("fc", out_features=10)
               .build())
    """

    def __init__(self, name, image, classes, batch=64):
        self._j = {"name": name,
                   "input": {"image": [int(d) for d in image], "classes": int(classes)},
                   "batch": int(batch),
                   "layers": []}
        self._unit = ""

    def _layer(self, layer, from_):
        if from_:
            layer["from"] = from_
        if self._unit:
            layer["unit"] = self._unit
        self._j["layers"].append(layer)
        return self

    def conv2d(self, name, out_channels, kernel_size=1, stride=1, padding=0, bias=True, from_=None):
        return self._layer({"name": name, "op": "conv2d", "out_channels": out_channels, "kernel_size": kernel_size,
                            "stride": stride, "padding": padding, "bias": bias}, from_)

    def batchnorm2d(self, name, eps=1e-5, momentum=0.1, from_=None):
        return self._layer({"name": name, "op": "batchnorm2d", "eps": eps, "momentum": momentum}, from_)

    def relu(self, name, from_=None):
        return self._layer({"name": name, "op": "relu"}, from_)

    def maxpool2d(self, name, kernel_size, stride=0, padding=0, from_=None):
        """stride 0: kernel_size (PyTorch's default)."""
        return self._layer({"name": name, "op": "maxpool2d", "kernel_size": kernel_size,
                            "stride": stride if stride > 0 else kernel_size, "padding": padding}, from_)

    def avgpool2d(self, name, kernel_size, stride=0, padding=0, from_=None):
        """stride 0: kernel_size (PyTorch's default)."""
        return self._layer({"name": name, "op": "avgpool2d", "kernel_size": kernel_size,
                            "stride": stride if stride > 0 else kernel_size, "padding": padding}, from_)

    def gelu(self, name, approximate="none", from_=None):
        """approximate: "none" (the exact erf form, PyTorch's default) or "tanh"."""
        return self._layer({"name": name, "op": "gelu", "approximate": approximate}, from_)

    def layernorm(self, name, eps=1e-5, from_=None):
        """Over features (after a flatten)."""
        return self._layer({"name": name, "op": "layernorm", "eps": eps}, from_)

    def dropout(self, name, p=0.5, from_=None):
        return self._layer({"name": name, "op": "dropout", "p": p}, from_)

    def global_avgpool2d(self, name, from_=None):
        return self._layer({"name": name, "op": "global_avgpool2d"}, from_)

    def flatten(self, name, from_=None):
        return self._layer({"name": name, "op": "flatten"}, from_)

    def linear(self, name, out_features, bias=True, from_=None):
        return self._layer({"name": name, "op": "linear", "out_features": out_features, "bias": bias}, from_)

    def add(self, name, from_):
        """The sum of two or more layers of one shape."""
        return self._layer({"name": name, "op": "add", "from": list(from_)}, None)

    def concat(self, name, from_):
        """Feature maps of one height and width joined along channels."""
        return self._layer({"name": name, "op": "concat", "from": list(from_)}, None)

    def unit(self, unit):
        """The layers added from now on form pipeline unit `unit` ("": each its own)."""
        self._unit = unit
        return self

    def to_dict(self):
        """The model file these calls describe."""
        return copy.deepcopy(self._j)

    def build(self):
        """The Model (checked, as a model file is, when it is shown, planned or trained)."""
        return Model.from_dict(self._j)
