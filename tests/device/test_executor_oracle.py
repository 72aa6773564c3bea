"""The numpy executor against onnxruntime on generated graphs for every operator it claims, and ONNX's node tests.

Each case (`tests.device._opcases`) must match onnxruntime, or be refused at load with `UnsupportedOperatorError`
for a reason on the list below: never a crash, never a silently different answer. The op-fuzz benchmark
(`benchmarks/device_op_fuzz.py`) runs the same generator with many more cases and counts the outcomes.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from device import ModelError, NumpyExecutor, UnsupportedOperatorError, supported_operators

opcases = pytest.importorskip("tests.device._opcases")
onnx = pytest.importorskip("onnx")
helper, TP = onnx.helper, onnx.TensorProto

# The refusals the generator can provoke, and why each is a refusal rather than a computation.
EXPECTED_REFUSALS = (
    "training mode",  # BatchNormalization in training mode updates running statistics
    "training_mode=True (a random mask)",  # Dropout in training draws a random mask
    "blocked quantisation",  # DequantizeLinear block_size (opset 21)
    "is older than 7",
)


def test_every_claimed_operator_has_a_generator() -> None:
    assert sorted(opcases.GENERATORS) == list(supported_operators())


@pytest.mark.parametrize("op", supported_operators())
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_generated_graphs_match_onnxruntime(op: str, data: st.DataObject) -> None:
    case = opcases.make_case(op, opcases.HypothesisDraw(data))
    outcome = opcases.check(case)
    if outcome.startswith("refused: "):
        assert any(reason in outcome for reason in EXPECTED_REFUSALS), f"{case.desc}: unexpected {outcome}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_small_generated_graphs_match_onnxruntime(data: st.DataObject) -> None:
    """Chains of 2-6 operators, intermediate values as outputs too: no refusal is expected of these."""
    case = opcases.make_chain_case(opcases.HypothesisDraw(data))
    assert opcases.check(case) in ("match", "invalid"), case.desc


NODE_TESTS = opcases.onnx_node_tests(supported_operators())


@pytest.mark.parametrize("test", NODE_TESTS, ids=[t.name for t in NODE_TESTS])
def test_onnx_node_tests(test: opcases.NodeTest) -> None:
    """ONNX's own node tests for the claimed operators (with expected outputs): match, or a reasoned refusal."""
    outcome = opcases.check_node_test(test)
    assert outcome == "match" or outcome.startswith("refused: "), outcome


def test_onnx_node_tests_mostly_run() -> None:
    """The node tests are not passed by refusing them: the gemm and batchnorm ones from issue 21 all run."""
    outcomes = {t.name: opcases.check_node_test(t) for t in NODE_TESTS}
    assert sum(o == "match" for o in outcomes.values()) >= 800
    for name in ("test_gemm_all_attributes", "test_gemm_beta", "test_gemm_alpha", "test_batchnorm_example/const",
                 "test_batchnorm_epsilon/const", "test_argmax_default_axis_example", "test_clip_default_inbounds"):
        assert outcomes[name] == "match", name


# --- regressions and refusals named in issue 21 ---------------------------------------------------------


def _model(nodes: list[object], inputs: list[tuple[str, int, list[object]]], inits: list[object] = (),  # type: ignore[assignment]
           opset: int = 17) -> bytes:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_empty_tensor_value_info("y")], initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return bytes(model.SerializeToString())


def test_gemm_and_batchnorm_as_the_last_node() -> None:
    """The closure names of the plan come from its statements, not from a regex over its text (issue 21: `k1`)."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    gemm = _model([helper.make_node("Gemm", ["x", "w", "c"], ["y"], alpha=2.0, beta=0.5)],
                  [("x", TP.FLOAT, [2, 3]), ("c", TP.FLOAT, [2, 4])], [onnx.numpy_helper.from_array(w, "w")])
    x, c = np.ones((2, 3), np.float32), np.full((2, 4), 2.0, np.float32)
    np.testing.assert_allclose(NumpyExecutor(gemm).run({"x": x, "c": c})["y"], 2 * x @ w + 0.5 * c)
    bn_params = [onnx.numpy_helper.from_array(np.array(v, np.float32), n)
                 for n, v in (("s", [2.0]), ("b", [1.0]), ("m", [0.5]), ("v", [4.0]))]
    bn = _model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=0.0)],
                [("x", TP.FLOAT, ["n", 1])], bn_params)
    np.testing.assert_allclose(NumpyExecutor(bn).run({"x": np.array([[2.5]], np.float32)})["y"], [[3.0]])


@pytest.mark.parametrize(("elem_type", "name"), [(TP.BFLOAT16, "BFLOAT16"), (TP.FLOAT8E4M3FN, "FLOAT8E4M3FN"),
                                                 (TP.INT4, "INT4"), (TP.STRING, "STRING")])
def test_unknown_element_types_are_refused_at_load(elem_type: int, name: str) -> None:
    model = _model([helper.make_node("Identity", ["x"], ["y"])], [("x", elem_type, [2])])
    with pytest.raises(UnsupportedOperatorError, match=re.escape(f"graph input 'x' has element type {name}")):
        NumpyExecutor(model)


def test_float8_dequantize_is_refused_at_load() -> None:
    q = helper.make_tensor("q", TP.FLOAT8E4M3FN, [2], [1.0, 2.0])
    nodes = [helper.make_node("DequantizeLinear", ["q", "s"], ["d"]), helper.make_node("Add", ["x", "d"], ["y"])]
    model = _model(nodes, [("x", TP.FLOAT, [2])], [q, onnx.numpy_helper.from_array(np.array(0.5, np.float32), "s")],
                   opset=21)
    with pytest.raises(UnsupportedOperatorError, match=re.escape("tensor 'q' has element type FLOAT8E4M3FN")):
        NumpyExecutor(model)


def test_blocked_dequantize_is_refused_at_load() -> None:
    q = onnx.numpy_helper.from_array(np.arange(4, dtype=np.int8).reshape(1, 4), "q")
    s = onnx.numpy_helper.from_array(np.ones((1, 2), np.float32), "s")
    model = _model([helper.make_node("DequantizeLinear", ["q", "s"], ["d"], axis=1, block_size=2),
                    helper.make_node("Add", ["x", "d"], ["y"])], [("x", TP.FLOAT, [1, 4])], [q, s], opset=21)
    with pytest.raises(UnsupportedOperatorError, match=re.escape("DequantizeLinear node '': blocked quantisation")):
        NumpyExecutor(model)


@pytest.mark.parametrize("training", ["constant", "runtime"])
def test_dropout_in_training_mode_is_refused_at_load(training: str) -> None:
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y"])
    ratio = onnx.numpy_helper.from_array(np.array(0.5, np.float32), "r")
    if training == "constant":
        model = _model([node], [("x", TP.FLOAT, [3])], [ratio, onnx.numpy_helper.from_array(np.array(True), "t")])
    else:
        model = _model([node], [("x", TP.FLOAT, [3]), ("t", TP.BOOL, [])], [ratio])
    with pytest.raises(UnsupportedOperatorError, match=re.escape("Dropout node '': training_mode")):
        NumpyExecutor(model)


def test_nan_semantics() -> None:
    """onnxruntime's where it is defined (Clip, Relu, Max keep NaN; Clip maps inf to the float range); NaN
    propagating through ArgMax/ReduceMax, where onnxruntime's answer depends on its SIMD lanes."""
    nan, inf = np.nan, np.inf
    x = np.array([[1, nan, 3, 2], [-inf, 0, inf, 1]], np.float32)
    for op, attrs, want in [
        ("Relu", {}, [[1, nan, 3, 2], [0, 0, inf, 1]]),
        ("Clip", {}, [[1, nan, 3, 2], [np.finfo(np.float32).min, 0, np.finfo(np.float32).max, 1]]),
        ("ArgMax", {"axis": 1, "keepdims": 0}, [1, 2]),
        ("ReduceMax", {"axes": [1], "keepdims": 0}, [nan, inf]),
    ]:
        model = _model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", TP.FLOAT, [2, 4])], opset=13)
        np.testing.assert_array_equal(NumpyExecutor(model).run({"x": x})["y"], np.array(want, np.float32), op)


def test_a_graph_without_runtime_inputs_is_refused() -> None:
    graph = helper.make_graph([helper.make_node("Constant", [], ["y"], value_float=1.0)], "g", [],
                              [helper.make_empty_tensor_value_info("y")])
    with pytest.raises(ModelError, match=re.escape("the graph has no runtime inputs")):
        NumpyExecutor(helper.make_model(graph).SerializeToString())
