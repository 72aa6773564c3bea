"""The env-state codec of gymnasium's MuJoCo envs: the simulator's integration state plus its last kinematics.

``mujoco`` is imported only when a MuJoCo env is captured or restored (it is not a dependency of strata).

What travels, as float64 arrays of the model's own sizes (uint8 for ``eq_active``):

    integration state   time, qpos, qvel, act, qacc_warmstart (the solver's warm start), ctrl, qfrc_applied,
                        xfrc_applied, eq_active, mocap_pos, mocap_quat, userdata, plugin_state: everything
                        ``mj_step`` reads (MuJoCo's ``mjSTATE_INTEGRATION``)
    last kinematics     xpos, xquat, xmat, xipos, ximat, subtree_com, cinert, cvel, cacc, cfrc_int, cfrc_ext,
                        site_xpos, site_xmat, geom_xpos, geom_xmat, sensordata, qfrc_actuator, actuator_force:
                        ``mj_step`` computes them from the state *before* its last sub-step, and several envs
                        read them before the next step (Ant's and Humanoid's x/y before, Reacher's fingertip),
                        so a recomputation from the current state would differ; they are carried verbatim

Restoring writes the integration state, runs ``mj_forward`` (every other derived quantity, contacts
included, is consistent again), writes the state again (``qacc_warmstart`` is the solver's) and then
the carried kinematics. The next ``mj_step`` recomputes everything it uses from the state, so the
episode goes on bit for bit.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from device import WireError

#: Registry key of gymnasium's MuJoCo base class (the codec applies to every subclass).
MUJOCO_ENV = "gymnasium.envs.mujoco.mujoco_env.MujocoEnv"

INTEGRATION = ("qpos", "qvel", "act", "qacc_warmstart", "ctrl", "qfrc_applied", "xfrc_applied", "eq_active",
               "mocap_pos", "mocap_quat", "userdata", "plugin_state")
KINEMATICS = ("xpos", "xquat", "xmat", "xipos", "ximat", "subtree_com", "cinert", "cvel", "cacc", "cfrc_int",
              "cfrc_ext", "site_xpos", "site_xmat", "geom_xpos", "geom_xmat", "sensordata", "qfrc_actuator",
              "actuator_force")


def _fields(data: Any) -> dict[str, np.ndarray]:
    out = {}
    for name in INTEGRATION + KINEMATICS:
        value = getattr(data, name, None)
        if isinstance(value, np.ndarray):
            out[name] = value
    return out


class MujocoCodec:
    """`functions._envstate.EnvStateCodec` of ``gymnasium.envs.mujoco.MujocoEnv`` (module docstring)."""

    def capture(self, layer: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Copy the integration state and the last kinematics out of ``layer.data``."""
        data = layer.data
        arrays = {name: np.array(value) for name, value in _fields(data).items()}
        arrays["time"] = np.array(data.time, dtype=np.float64)
        return {"frame_skip": int(layer.frame_skip), "nq": int(layer.model.nq), "nv": int(layer.model.nv)}, arrays

    def check(self, layer: Any, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Every array must have the shape and dtype this model's ``MjData`` has."""
        name = type(layer).__name__
        for key, want in (("frame_skip", int(layer.frame_skip)), ("nq", int(layer.model.nq)),
                          ("nv", int(layer.model.nv))):
            if meta.get(key) != want:
                raise WireError(f"env state of {name}: {key} is {meta.get(key)!r} in the state, {want} in this env; "
                                "continue it in an env made from the same model and settings")
        expected = {k: (v.shape, v.dtype) for k, v in _fields(layer.data).items()}
        expected["time"] = ((), np.dtype(np.float64))
        if set(arrays) != set(expected):
            raise WireError(f"env state of {name}: arrays {sorted(arrays)} differ from this model's "
                            f"{sorted(expected)}")
        for key, (shape, dtype) in expected.items():
            a = arrays[key]
            if tuple(a.shape) != tuple(shape) or a.dtype != dtype:
                raise WireError(f"env state of {name}: {key} is {a.dtype.name}{list(a.shape)}, this model needs "
                                f"{dtype.name}{list(shape)}")

    def restore(self, layer: Any, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Write the state, recompute the derived quantities, then put the carried kinematics back."""
        # The env exists, so mujoco is importable; imported by name so strata declares no dependency on it.
        mujoco = importlib.import_module("mujoco")
        data = layer.data
        fields = _fields(data)

        def write(names: tuple[str, ...]) -> None:
            for key in names:
                if key in fields:
                    fields[key][...] = arrays[key]
            data.time = float(arrays["time"])

        write(INTEGRATION)
        mujoco.mj_forward(layer.model, data)
        write(INTEGRATION)
        write(KINEMATICS)
