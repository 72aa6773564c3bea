"""The co-located pool's pickle-free info channel round-trips what envs put in infos and refuses the rest."""

from __future__ import annotations

import re

import numpy as np
import pytest

from cloud.rollout._infocodec import InfoEncodingError, decode_info, encode_info


def test_infos_round_trip_with_types() -> None:
    final = np.empty(2, dtype=object)
    final[0], final[1] = np.arange(4, dtype=np.float32), None
    value = [(3, {"t": 7, "r": np.float32(1.5), "ok": np.bool_(True), "nested": {"depth": np.array([1, 2])},
                  "name": "x", "none": None, "nan": float("nan")}, None),
             ("vec", 0, {"final_obs": final, "_final_obs": np.array([True, False]), 5: (1, 2)})]
    back = decode_info(encode_info(value))
    info = back[0][1]
    assert back[0][0] == 3 and back[0][2] is None and back[1][:2] == ("vec", 0)
    assert type(info["r"]) is np.float32 and info["r"] == 1.5 and type(info["ok"]) is np.bool_
    np.testing.assert_array_equal(info["nested"]["depth"], [1, 2])
    assert info["name"] == "x" and info["none"] is None and np.isnan(info["nan"])
    vec = back[1][2]
    assert vec["final_obs"].dtype == object and vec["final_obs"][1] is None
    np.testing.assert_array_equal(vec["final_obs"][0], np.arange(4, dtype=np.float32))
    assert vec[5] == (1, 2) and vec["_final_obs"].dtype == bool


def test_unsupported_values_are_refused_by_type() -> None:
    with pytest.raises(InfoEncodingError, match=re.escape("an env's info holds a set")):
        encode_info({"bad": {1, 2}})


def test_non_finite_floats_and_numpy_scalars_cross_as_names() -> None:
    value = {"nan": float("nan"), "inf": float("inf"), "ninf": -float("inf"), "f32": np.float32("nan"),
             "f64": np.float64("-inf")}
    back = decode_info(encode_info(value))
    assert np.isnan(back["nan"]) and back["inf"] == float("inf") and back["ninf"] == -float("inf")
    assert type(back["f32"]) is np.float32 and np.isnan(back["f32"])
    assert back["f64"] == -np.inf  # np.float64 is a float: it crosses as one (as a finite one always did)
