"""Edge experience records: the wire format and its checks, receipts, the outbox's receipts, the spool, the budget."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from device import RolloutBatch, pack_arrays
from edge import Experience, Outbox, OutboxConfig, PayloadError, PublishResult, PublishState
from edge._experience import Budget, ExperienceRecorder, ExperienceRequest, act_for_experience, fits_payload
from edge._spool import ExperienceSpool
from edge._topics import ExperienceSpec, Receipt
from tests.edge._policies import OBS_SPACE, cartpole_bundle, make_keys

SPEC = ExperienceSpec(observation_space=OBS_SPACE, action_space={"type": "Discrete", "n": 2}, max_steps=64)
TOPIC = "strata/f/nodes/n1/experience"


def record(*, t: int = 4, record_id: int = 7, node: str = "n1", done_at: int | None = 2, **arrays: np.ndarray) -> bytes:
    rng = np.random.default_rng(0)
    terminations = np.zeros((t, 1), bool)
    if done_at is not None:
        terminations[done_at, 0] = True
    final_obs = np.zeros((t, 1, 4), np.float32)
    if done_at is not None:
        final_obs[done_at, 0] = [9, 9, 9, 9]
    fields = {"obs": rng.normal(size=(t, 1, 4)).astype(np.float32), "actions": np.ones((t, 1), np.int64),
              "rewards": np.ones((t, 1), np.float32), "terminations": terminations,
              "truncations": np.zeros((t, 1), bool), "final_obs": final_obs,
              "next_obs": np.zeros((1, 4), np.float32), "policy_version": np.full((t, 1), 3, np.int64),
              "worker": np.zeros(1, np.int64), "seq": np.arange(t, dtype=np.int64)[:, None],
              "behaviour_logprobs": np.full((t, 1), -0.7, np.float32)}
    fields.update(arrays)
    batch = RolloutBatch(source="ignored", **fields)
    return Experience(record_id=record_id, node=node, batch=batch,
                      episode_return=np.arange(t, dtype=np.float32)[:, None],
                      episode_length=np.arange(t, dtype=np.int64)[:, None]).encode()


def test_a_record_round_trips_with_sparse_final_observations_and_ids_nobody_can_forge() -> None:
    got = Experience.decode(TOPIC, record(), spec=SPEC, node="n1")
    b = got.batch
    assert got.record_id == 7 and b.source == "edge:n1:7" and b.worker.tolist() == [0] and b.seq.ravel().tolist() == [
        0, 1, 2, 3]
    assert b.final_obs[2, 0].tolist() == [9, 9, 9, 9] and not b.final_obs[[0, 1, 3]].any()
    assert b.behaviour_logprobs is not None and float(b.behaviour_logprobs[0, 0]) == pytest.approx(-0.7)
    assert got.episode_return is not None and got.episode_return[3, 0] == 3.0


@pytest.mark.parametrize(("change", "problem"), [
    ({"node": "n2"}, "the record names node 'n2' but arrived on the topic of node 'n1'"),
    ({"obs": np.full((4, 1, 4), np.nan, np.float32)}, "obs holds NaN or infinite values"),
    ({"obs": np.zeros((4, 1, 3), np.float32)}, "obs must be float32 [4, 1, 4]"),
    ({"actions": np.full((4, 1), 2, np.int64)}, "actions must lie in 0..1"),
    ({"actions": np.zeros((4, 1), np.float32)}, "actions must be integers"),
    ({"rewards": np.full((4, 1), np.inf, np.float32)}, "rewards holds NaN or infinite values"),
    ({"policy_version": np.zeros((4, 1), np.int64)}, "policy_version must be >= 1"),
    ({"behaviour_logprobs": np.full((4, 1), 0.5, np.float32)}, "must be <= 0 (log of a probability)"),
    ({"t": 65}, "a record of 65 steps exceeds the learner's limit of 64"),
])
def test_records_that_do_not_fit_the_learner_are_refused_with_the_reason(change: dict[str, object],
                                                                         problem: str) -> None:
    kwargs: dict[str, object] = dict(change)
    t = int(kwargs.pop("t", 4))  # type: ignore[call-overload]
    node = str(kwargs.pop("node", "n1"))
    payload = record(t=t, node=node, done_at=None, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(PayloadError, match=re.escape(problem)):
        Experience.decode(TOPIC, payload, spec=SPEC, node="n1")


def test_malformed_record_messages_are_refused() -> None:
    bad = [b"", b"STRW junk", pack_arrays({"kind": "experience", "record_id": 1, "node": "n1"}, {}),
           pack_arrays({"kind": "experience", "record_id": 0, "node": "n1"}, {"rewards": np.zeros((1, 1))}),
           pack_arrays({"kind": "experience", "record_id": 1, "node": "n1", "x": 1}, {"unknown": np.zeros(1)})]
    for payload in bad:
        with pytest.raises(PayloadError):
            Experience.decode(TOPIC, payload, spec=SPEC, node="n1")


def test_receipts_round_trip_and_refuse_garbage() -> None:
    r = Receipt(node="n1", record_ids=(1, 2, 5), refused={"9": "stale"})
    assert Receipt.decode("t", r.encode()) == r
    for payload in (b'{"kind": "receipt", "node": "n1", "record_ids": [0]}',
                    b'{"kind": "receipt", "node": "n1", "record_ids": [1], "refused": {"x": "y"}}',
                    b'{"kind": "receipt", "node": "n1", "record_ids": [NaN]}'):
        with pytest.raises(PayloadError):
            Receipt.decode("t", payload)


class FakeLink:
    connected = True

    def __init__(self) -> None:
        self.sent: list[tuple[int, str]] = []
        self.mid = 0

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> PublishResult:
        self.mid += 1
        self.sent.append((self.mid, topic))
        return PublishResult(PublishState.SENT, self.mid)


def test_the_outbox_keeps_a_receipted_record_past_its_puback_resends_it_late_and_deletes_it_on_receipt(
        tmp_path: Path) -> None:
    now = [0.0]
    outbox = Outbox(tmp_path / "o.sqlite", OutboxConfig(receipt_timeout_s=10.0, receipt_max_s=15.0),
                    clock=lambda: now[0])
    link = FakeLink()
    rid = outbox.put("exp", lambda i: b"x", receipt=True)
    tel = outbox.put("tel", lambda i: b"y")
    assert rid is not None and tel is not None
    assert outbox.pump(link) == 2
    for mid, _ in link.sent:
        outbox.ack(mid)
    stats = outbox.stats()
    assert (stats.pending, stats.awaiting_receipt) == (1, 1)  # telemetry gone at its PUBACK, experience kept
    now[0] = 9.0
    assert outbox.pump(link) == 0  # not yet overdue
    now[0] = 10.5
    assert outbox.pump(link) == 1 and link.sent[-1][1] == "exp"  # sent again: its receipt is overdue
    outbox.ack(link.sent[-1][0])
    outbox.stats()  # the PUBACK is taken in at 10.5 s
    now[0] = 20.0
    assert outbox.pump(link) == 0  # the second wait is twice as long, capped at receipt_max_s (15 s)
    now[0] = 26.0
    assert outbox.pump(link) == 1
    outbox.confirm([rid])  # the receipt comes while the third send is in flight: deleted at its PUBACK
    outbox.ack(link.sent[-1][0])
    assert outbox.stats().pending == 0 and outbox.stats().resent == 2
    outbox.close()


def test_unreceipted_records_survive_a_restart_and_are_sent_again(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "o.sqlite")
    link = FakeLink()
    ids = [outbox.put("exp", lambda i: b"x", receipt=True) for _ in range(3)]
    outbox.pump(link)
    for mid, _ in link.sent:
        outbox.ack(mid)
    outbox.confirm([ids[0]])
    assert outbox.stats().pending == 2
    outbox.close()  # a crash: the next process sends what was not receipted
    again = Outbox(tmp_path / "o.sqlite")
    link2 = FakeLink()
    assert again.pump(link2) == 2
    again.confirm(ids[1:])
    for mid, _ in link2.sent:
        again.ack(mid)
    assert again.stats().pending == 0
    again.close()


def test_the_spool_stores_a_record_once_and_forgets_consumption_past_a_checkpoint(tmp_path: Path) -> None:
    spool = ExperienceSpool(tmp_path / "spool.sqlite")
    assert spool.store([("n1", 1, 3, b"a"), ("n1", 2, 5, b"b"), ("n2", 1, 4, b"c")]) == [True, True, True]
    assert spool.store([("n1", 1, 3, b"a")], refused=1) == [False]
    assert [(r.node, r.record_id) for r in spool.pending()] == [("n1", 2), ("n2", 1), ("n1", 1)]  # freshest first
    spool.mark_consumed([("n1", 2)], 10)
    spool.mark_consumed([("n2", 1)], 11)
    assert spool.reset_after(10) == 1  # the update of version 11 was lost with the learner
    assert spool.collect_garbage(10) == 1
    assert sorted((r.node, r.record_id) for r in spool.pending()) == [("n1", 1), ("n2", 1)]
    assert spool.stale(below_version=4) == [("n1", 1)]
    counters = spool.counters()
    assert (counters["received"], counters["stored"], counters["duplicates_wire"], counters["refused"]) == (5, 3, 1, 1)
    spool.close()


def test_the_learner_asks_through_the_signed_bundle_and_a_node_samples_with_exact_log_probs(tmp_path: Path) -> None:
    from edge import OnnxPolicy

    key, _ = make_keys(tmp_path)
    request = ExperienceRequest(actions="sample", steps=16, noise_std=0.2)
    bundle = cartpole_bundle(key, 1, producer=request.to_producer())
    assert ExperienceRequest.from_bundle(bundle) == request
    assert ExperienceRequest.from_bundle(cartpole_bundle(key, 2)) is None
    policy = OnnxPolicy(bundle)
    rng = np.random.default_rng(0)
    obs = np.array([0.0, 0.0, 0.05, 0.0], np.float32)
    draws = [act_for_experience(policy, obs, request, rng) for _ in range(2000)]
    logits = np.array([0.0, 0.05])  # obs @ W of the test policy
    probs = np.exp(logits) / np.exp(logits).sum()
    assert {a for a, _ in draws} == {0, 1}
    assert np.mean([a for a, _ in draws]) == pytest.approx(probs[1], abs=0.04)
    assert all(lp == pytest.approx(np.log(probs[a]), abs=1e-6) for a, lp in draws[:10])
    assert act_for_experience(policy, obs, ExperienceRequest(actions="greedy"), rng) == (1, None)


def test_a_record_holds_its_steps_and_episode_ends() -> None:
    rec = ExperienceRecorder("n1", 3)
    for t in range(3):
        rec.add(obs=np.full(4, t, np.float32), action=t % 2, reward=1.0, terminated=t == 1, truncated=False,
                final_obs=np.ones(4, np.float32) if t == 1 else None, version=2, logp=-0.5,
                episode=(7.0, 7) if t == 1 else None)
    assert rec.full
    got = Experience.decode(TOPIC, rec.record(np.zeros(4, np.float32))(5), spec=SPEC, node="n1")
    assert got.episode_length is not None and got.episode_length.ravel().tolist() == [0, 7, 0]
    assert got.batch.final_obs[1, 0].tolist() == [1, 1, 1, 1]
    assert fits_payload((4,), 4, (), 1024) and not fits_payload((96, 96, 3), 4, (), 32)


def test_the_budget_holds_a_node_to_its_bytes_and_steps_per_second() -> None:
    now = [0.0]
    budget = Budget(bytes_per_s=1000.0, steps_per_s=0.0, clock=lambda: now[0])
    assert budget.allow(record_bytes=600, steps=32)
    budget.spend(record_bytes=600, steps=32)
    assert not budget.allow(record_bytes=600, steps=32)  # 400 bytes left
    now[0] = 0.3
    assert budget.allow(record_bytes=600, steps=32)  # refilled at 1000 B/s
    assert Budget(clock=lambda: 0.0).allow(record_bytes=10**9, steps=10**9)  # 0: unlimited
