"""The numpy executor against onnxruntime: exported policies and single operators, batch 1 and 3."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from device import ModelError, NumpyExecutor, SigningKey, UnsupportedOperatorError
from tests.device._bundles import make_bundle
from tests.device._models import mlp_policy

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
helper = onnx.helper
TP = onnx.TensorProto


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def ort_run(model: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def assert_matches_ort(model: bytes, feeds: dict[str, np.ndarray], atol: float = 1e-5) -> dict[str, np.ndarray]:
    ours = NumpyExecutor(model).run(feeds)
    ref = ort_run(model, feeds)
    assert len(ours) == len(ref)
    for (name, got), want in zip(ours.items(), ref, strict=True):
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got, want, atol=atol, rtol=0, err_msg=name)
    return ours


POLICIES: dict[str, dict[str, Any]] = {
    "discrete-tanh": {},
    "discrete-relu-3x": {"hidden": (32, 32, 32), "activation": "relu", "n_actions": 5},
    "discrete-elu-no-norm": {"activation": "elu", "normalise": False},
    "box-silu": {"n_actions": None, "act_dim": 2, "activation": "silu", "obs_shape": (3,)},
    "box-image-view": {"n_actions": None, "act_dim": 1, "obs_shape": (2, 3), "flatten_with_view": True},
    "discrete-image-flatten": {"obs_shape": (2, 3), "hidden": (16,)},
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_exported_policies_match_onnxruntime(kind: str, seed: int) -> None:
    spec = POLICIES[kind]
    model = mlp_policy(seed=seed, **spec)
    rng = np.random.default_rng(seed)
    obs_shape = spec.get("obs_shape", (4,))
    for batch in (1, 3):
        obs = (rng.normal(size=(batch, *obs_shape)) * 3).astype(np.float32)
        out = assert_matches_ort(model, {"obs": obs})
        assert out["action"].shape[0] == batch


def test_act_takes_a_batch_or_one_observation() -> None:
    executor = NumpyExecutor(mlp_policy(seed=3))
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    batch = executor.act(obs)
    assert batch.dtype == np.int64 and batch.shape == (5,)
    assert executor.act(obs[2].tolist()) == batch[2]
    assert executor.input_names == ("obs",) and executor.output_names == ("action", "logits")
    with pytest.raises(ModelError, match=re.escape("observation has shape (5, 3), expected [batch, 4] or [4]")):
        executor.act(obs[:, :3])
    with pytest.raises(ModelError, match=re.escape("missing inputs ['obs']")):
        executor.run({"x": obs})


def test_from_bundle_runs_the_bundled_model() -> None:
    model = mlp_policy(seed=4)
    bundle = make_bundle(SigningKey.generate(), model=model)
    obs = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(NumpyExecutor.from_bundle(bundle).act(obs), NumpyExecutor(model).act(obs))


def test_the_plan_folds_constants_and_pretransposes_weights() -> None:
    executor = NumpyExecutor(mlp_policy(seed=0))
    # Sub, Div, Clip, Flatten, 3 x (dot + bias), 2 x Tanh, ArgMax: the Constant nodes are folded away.
    assert executor.num_steps == 12
    assert "Constant" not in executor.source and "transpose" not in executor.source


# --- single operators, built with onnx.helper -----------------------------------------------------------


def make_model(nodes: list[Any], inputs: list[tuple[str, int, list[Any]]], outputs: list[tuple[str, int, Any]],
               initializers: list[Any] = (), opset: int = 17) -> bytes:  # type: ignore[assignment]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs], initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def const(name: str, array: np.ndarray, *, raw: bool = True) -> Any:
    return onnx.numpy_helper.from_array(array, name) if raw else helper.make_tensor(
        name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape, array.ravel().tolist())


def unary_case(op: str, opset: int = 17, **attrs: Any) -> bytes:
    return make_model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", TP.FLOAT, ["b", 5])],
                      [("y", TP.FLOAT, None)], opset=opset)


X = (np.random.default_rng(7).normal(size=(3, 5)) * 2).astype(np.float32)

UNARY = ["Relu", "Tanh", "Sigmoid", "Neg", "Exp", "Abs", "Identity", "Softplus", "Floor", "Ceil", "Sign",
         "LeakyRelu", "Elu", "Selu", "HardSigmoid", "HardSwish", "Sin", "Cos"]


@pytest.mark.parametrize("op", UNARY)
def test_unary_operators(op: str) -> None:
    for batch in (1, 3):
        assert_matches_ort(unary_case(op), {"x": X[:batch]})


def test_sqrt_log_reciprocal_on_positive_input() -> None:
    for op in ("Sqrt", "Log", "Reciprocal"):
        assert_matches_ort(unary_case(op), {"x": np.abs(X) + 0.1})


@pytest.mark.parametrize("opset", [11, 13, 17])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [None, 0, -1])
def test_softmax_forms(op: str, opset: int, axis: int | None) -> None:
    attrs = {} if axis is None else {"axis": axis}
    assert_matches_ort(unary_case(op, opset, **attrs), {"x": X})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"])
@pytest.mark.parametrize("const_shape", [(5,), (1, 5), (), None])
def test_binary_operators_broadcast(op: str, const_shape: tuple[int, ...] | None) -> None:
    rng = np.random.default_rng(1)
    if const_shape is None:  # both operands at run time
        model = make_model([helper.make_node(op, ["x", "z"], ["y"])],
                           [("x", TP.FLOAT, ["b", 5]), ("z", TP.FLOAT, ["b", 5])], [("y", TP.FLOAT, None)])
        feeds = {"x": np.abs(X) + 0.5, "z": rng.normal(size=(3, 5)).astype(np.float32)}
    else:
        c = rng.normal(size=const_shape).astype(np.float32)
        model = make_model([helper.make_node(op, ["x", "c"], ["y"])], [("x", TP.FLOAT, ["b", 5])],
                           [("y", TP.FLOAT, None)], [const("c", c)])
        feeds = {"x": np.abs(X) + 0.5}
    assert_matches_ort(model, feeds, atol=1e-4 if op == "Pow" else 1e-5)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("weights", ["raw", "float_data", "runtime"])
def test_gemm_forms(trans_a: int, trans_b: int, weights: str) -> None:
    rng = np.random.default_rng(2)
    w = rng.normal(size=(5, 4) if not trans_b else (4, 5)).astype(np.float32)
    c = rng.normal(size=(4,)).astype(np.float32)
    a_shape = ["b", 5] if not trans_a else [5, "b"]
    node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], alpha=0.5, beta=2.0, transA=trans_a, transB=trans_b)
    if weights == "runtime":
        model = make_model([node], [("x", TP.FLOAT, a_shape), ("w", TP.FLOAT, list(w.shape))],
                           [("y", TP.FLOAT, None)], [const("c", c)])
        feeds = {"w": w}
    else:
        model = make_model([node], [("x", TP.FLOAT, a_shape)], [("y", TP.FLOAT, None)],
                           [const("w", w, raw=weights == "raw"), const("c", c, raw=weights == "raw")])
        feeds = {}
    for batch in (1, 3):
        x = X[:batch] if not trans_a else X[:batch].T.copy()
        assert_matches_ort(model, {"x": x, **feeds})


def test_matmul_with_constant_and_runtime_weights() -> None:
    w = np.random.default_rng(3).normal(size=(5, 2)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("MatMul", ["h", "z"], ["y"])],
                       [("x", TP.FLOAT, ["b", 5]), ("z", TP.FLOAT, [2, 3])], [("y", TP.FLOAT, None)], [const("w", w)])
    assert_matches_ort(model, {"x": X, "z": np.ones((2, 3), np.float32)})


@pytest.mark.parametrize("form", ["attributes-opset7", "inputs", "min-only", "max-only", "none", "runtime"])
def test_clip_forms(form: str) -> None:
    lo, hi = np.array(-1.0, np.float32), np.array(0.5, np.float32)
    inputs: list[tuple[str, int, list[Any]]] = [("x", TP.FLOAT, ["b", 5])]
    inits, opset = [const("lo", lo), const("hi", hi)], 17
    if form == "attributes-opset7":
        node, inits, opset = helper.make_node("Clip", ["x"], ["y"], min=-1.0, max=0.5), [], 7
    elif form == "inputs":
        node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"])
    elif form == "min-only":
        node = helper.make_node("Clip", ["x", "lo"], ["y"])
    elif form == "max-only":
        node = helper.make_node("Clip", ["x", "", "hi"], ["y"])
    elif form == "none":
        node = helper.make_node("Clip", ["x"], ["y"])
    else:
        node, inits = helper.make_node("Clip", ["x", "lo", "hi"], ["y"]), []
        inputs += [("lo", TP.FLOAT, []), ("hi", TP.FLOAT, [])]
    model = make_model([node], inputs, [("y", TP.FLOAT, None)], inits, opset=opset)
    feeds = {"x": X, **({"lo": lo, "hi": hi} if form == "runtime" else {})}
    assert_matches_ort(model, feeds)


@pytest.mark.parametrize("attrs", [{}, {"axis": 1, "keepdims": 0}, {"axis": -1, "select_last_index": 1},
                                   {"axis": 0, "keepdims": 1}])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_argmax_forms(op: str, attrs: dict[str, int]) -> None:
    ties = np.array([[1, 3, 3, 0, 3], [2, 2, 0, 0, 1], [0, 0, 0, 0, 0]], np.float32)
    model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", TP.FLOAT, ["b", 5])],
                       [("y", TP.INT64, None)])
    assert_matches_ort(model, {"x": ties})
    assert_matches_ort(model, {"x": X})


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "ReduceSum", "ReduceMean"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions(op: str, opset: int, keepdims: int) -> None:
    axes_as_input = opset >= 18 or op == "ReduceSum"
    if axes_as_input:
        node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
        inits = [const("axes", np.array([1], np.int64))]
    else:
        node, inits = helper.make_node(op, ["x"], ["y"], axes=[1], keepdims=keepdims), []
    model = make_model([node], [("x", TP.FLOAT, ["b", 5])], [("y", TP.FLOAT, None)], inits, opset=opset)
    assert_matches_ort(model, {"x": X})


def test_shape_arithmetic_reshape_concat_and_friends() -> None:
    # What torch emits for x.view(x.shape[0], -1), plus Squeeze/Cast/Transpose/Slice/Where/Expand/Concat.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axes0"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("Reshape", ["flat", "keep_batch"], ["flat2"]),
        helper.make_node("Unsqueeze", ["flat2", "axes2"], ["u"]),
        helper.make_node("Squeeze", ["u", "axes2"], ["sq"]),
        helper.make_node("Transpose", ["sq"], ["t"], perm=[1, 0]),
        helper.make_node("Transpose", ["t"], ["tt"], perm=[1, 0]),
        helper.make_node("Slice", ["tt", "starts", "ends", "axes1", "steps"], ["sl"]),
        helper.make_node("Greater", ["sl", "zerof"], ["mask"]),
        helper.make_node("Where", ["mask", "sl", "zerof"], ["w"]),
        helper.make_node("Cast", ["mask"], ["maskf"], to=TP.FLOAT),
        helper.make_node("Concat", ["w", "maskf", "sl"], ["cat"], axis=1),
        helper.make_node("Flatten", ["cat"], ["y"], axis=1),
        helper.make_node("Cast", ["b1"], ["n"], to=TP.INT32),
    ]
    inits = [const("zero", np.array(0, np.int64)), const("axes0", np.array([0], np.int64)),
             const("minus1", np.array([-1], np.int64)), const("keep_batch", np.array([0, -1], np.int64)),
             const("axes2", np.array([2], np.int64)), const("starts", np.array([1], np.int64)),
             const("ends", np.array([100], np.int64)), const("axes1", np.array([1], np.int64)),
             const("steps", np.array([2], np.int64)), const("zerof", np.array(0.0, np.float32))]
    model = make_model(nodes, [("x", TP.FLOAT, ["b", 2, 3])], [("y", TP.FLOAT, None), ("n", TP.INT32, None)], inits)
    for batch in (1, 3):
        assert_matches_ort(model, {"x": np.random.default_rng(batch).normal(size=(batch, 2, 3)).astype(np.float32)})


def test_old_opset_unsqueeze_squeeze_attributes() -> None:
    nodes = [helper.make_node("Unsqueeze", ["x"], ["u"], axes=[1]), helper.make_node("Squeeze", ["u"], ["y"], axes=[1])]
    model = make_model(nodes, [("x", TP.FLOAT, ["b", 5])], [("y", TP.FLOAT, None)], opset=11)
    assert_matches_ort(model, {"x": X})


def test_constant_forms_layer_norm_and_batch_norm() -> None:
    scale, bias = np.linspace(0.5, 1.5, 5).astype(np.float32), np.linspace(-1, 1, 5).astype(np.float32)
    nodes = [
        helper.make_node("Constant", [], ["cf"], value_float=2.0),
        helper.make_node("Constant", [], ["cfs"], value_floats=[1.0, 2.0, 3.0, 4.0, 5.0]),
        helper.make_node("Mul", ["x", "cf"], ["a"]),
        helper.make_node("Add", ["a", "cfs"], ["b"]),
        helper.make_node("LayerNormalization", ["b", "scale", "bias"], ["ln"], epsilon=1e-5),
        helper.make_node("Unsqueeze", ["ln", "axes"], ["ln3"]),
        helper.make_node("BatchNormalization", ["ln3", "scale", "bias", "bias", "scale"], ["bn3"]),
        helper.make_node("Squeeze", ["bn3", "axes"], ["y"]),
    ]
    model = make_model(nodes, [("x", TP.FLOAT, ["b", 5])], [("y", TP.FLOAT, None)],
                       [const("scale", scale), const("bias", bias), const("axes", np.array([2], np.int64))])
    assert_matches_ort(model, {"x": X})


def test_int64_initializer_and_integer_division() -> None:
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Div", ["s", "two"], ["h"]),
             helper.make_node("Sub", ["h", "seven"], ["y"])]
    model = make_model(nodes, [("x", TP.FLOAT, ["b", 5])], [("y", TP.INT64, None)],
                       [const("two", np.array([2], np.int64), raw=False), const("seven", np.array([7], np.int64))])
    assert_matches_ort(model, {"x": X})


# --- refusals ------------------------------------------------------------------------------------------


def test_unsupported_operator_is_refused_by_name_at_load() -> None:
    nodes = [helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Tanh", ["e"], ["t"]),
             helper.make_node("Det", ["t"], ["y"])]
    model = make_model(nodes, [("x", TP.FLOAT, [5, 5])], [("y", TP.FLOAT, None)])
    with pytest.raises(UnsupportedOperatorError, match=re.escape("unsupported ONNX operator(s) ['Det', 'Erf']")):
        NumpyExecutor(model)


def test_custom_domain_is_refused_by_name() -> None:
    graph = helper.make_graph([helper.make_node("FusedGemm", ["x"], ["y"], domain="com.microsoft")], "g",
                              [helper.make_tensor_value_info("x", TP.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(UnsupportedOperatorError, match=re.escape("['com.microsoft::FusedGemm']")):
        NumpyExecutor(model.SerializeToString())


def test_runtime_axes_are_refused_at_load() -> None:
    nodes = [helper.make_node("ReduceMax", ["x", "axes"], ["y"])]
    model = make_model(nodes, [("x", TP.FLOAT, ["b", 5]), ("axes", TP.INT64, [1])], [("y", TP.FLOAT, None)], opset=18)
    with pytest.raises(UnsupportedOperatorError, match=re.escape("computes its axes at run time")):
        NumpyExecutor(model)


def test_external_data_and_junk_are_model_errors() -> None:
    with pytest.raises(ModelError, match=re.escape("malformed ONNX model")):
        NumpyExecutor(b"\x08\x07\x12\x03abc\xff")
    with pytest.raises(ModelError, match=re.escape("no graph")):
        NumpyExecutor(b"\x08\x07")
    tensor = const("w", np.ones(3, np.float32))
    tensor.ClearField("raw_data")
    tensor.data_location = TP.EXTERNAL
    tensor.external_data.add(key="location", value="weights.bin")
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", TP.FLOAT, [3])],
                       [("y", TP.FLOAT, None)], [])
    proto = onnx.load_from_string(model)
    proto.graph.initializer.append(tensor)
    with pytest.raises(ModelError, match=re.escape("external")):
        NumpyExecutor(proto.SerializeToString())


def test_range_constant_of_shape_expand() -> None:
    fill = onnx.numpy_helper.from_array(np.array([2.5], np.float32))
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"]),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("ConstantOfShape", ["s"], ["c"], value=fill),
             helper.make_node("Expand", ["k", "s"], ["e"])]
    model = make_model(nodes, [("x", TP.FLOAT, ["b", 3])],
                       [("r", TP.INT64, None), ("c", TP.FLOAT, None), ("e", TP.FLOAT, None)],
                       [const("zero", np.array(0, np.int64)), const("one", np.array(1, np.int64)),
                        const("k", np.array([1.0, 2.0, 3.0], np.float32))])
    for batch in (1, 3):
        assert_matches_ort(model, {"x": np.ones((batch, 3), np.float32)})


def test_shapes_that_would_exhaust_memory_are_refused() -> None:
    nodes = [helper.make_node("ConstantOfShape", ["huge"], ["y"])]
    model = make_model(nodes, [("x", TP.FLOAT, [1])], [("y", TP.FLOAT, None)],
                       [const("huge", np.array([1 << 20, 1 << 20], np.int64))])
    with pytest.raises(ModelError, match=re.escape("exceeds 67108864 elements")):
        NumpyExecutor(model)
