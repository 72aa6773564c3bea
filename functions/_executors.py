"""The executor an env host runs a policy bundle with: numpy (`device.NumpyExecutor`) when it can, onnxruntime else.

Functions and env services run the numpy-only device executor, so their packages stay small. A graph it refuses
(a convolutional policy for image observations: Conv is not a device-tier operator) runs in onnxruntime when the
host has it installed (``pip install 'strata[images]'``; about 50 MB unzipped in a Lambda package), behind the
same interface: ``run(feeds)``, ``act(obs)`` and ``output_names``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

import numpy as np

from device import MissingDependencyError, NumpyExecutor, UnsupportedOperatorError, require


class OnnxRuntimeExecutor:
    """`device.NumpyExecutor`'s interface over one onnxruntime session (one intra-op thread)."""

    def __init__(self, model: bytes) -> None:
        ort = require("onnxruntime", extra="images", purpose="running convolutional policies")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self.input_names: tuple[str, ...] = tuple(i.name for i in self.session.get_inputs())
        self.output_names: tuple[str, ...] = tuple(o.name for o in self.session.get_outputs())

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """All outputs for `feeds` (float32 observations)."""
        inputs = {name: np.asarray(feeds[name], dtype=np.float32) for name in self.input_names}
        return dict(zip(self.output_names, self.session.run(list(self.output_names), inputs), strict=True))

    def act(self, obs: Any) -> np.ndarray:
        """The ``action`` output for a batch of observations."""
        out = self.run({self.input_names[0]: obs})
        return np.asarray(out["action"] if "action" in out else out[self.output_names[0]])


def policy_executor(bundle: Any) -> NumpyExecutor | OnnxRuntimeExecutor:
    """The numpy executor for `bundle`, or onnxruntime for a graph it refuses (see the module docstring).

    Raises:
        device.UnsupportedOperatorError: numpy refuses the graph and onnxruntime is not installed (the message
            says what to install).
    """
    try:
        return NumpyExecutor.from_bundle(bundle)
    except UnsupportedOperatorError as refused:
        if importlib.util.find_spec("onnxruntime") is None:
            raise UnsupportedOperatorError(f"{refused}. This host has no onnxruntime to run it instead: "
                                           "pip install 'strata[images]'") from None
        try:
            return OnnxRuntimeExecutor(bundle.model)
        except MissingDependencyError:
            raise
        except Exception as exc:  # onnxruntime raises its own types for a graph it cannot load
            raise UnsupportedOperatorError(f"{refused}; onnxruntime cannot load it either: {exc}") from exc
