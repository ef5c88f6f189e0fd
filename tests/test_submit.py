"""Submit validation: every refusal names the problem and stores nothing; idempotent submit."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator

import pytest
from celery.signals import task_prerun

from stepq.errors import MissingFeaturesError, PolicyError, SubmitError, UnknownAgentError
from stepq.fleet.protocol import RUN_STEP
from stepq.models import EventType, TurnStatus
from stepq.turns.submit import create_turn
from tests.agents_engine import drive, start, stored_keys


def _refused(rt, prefix, error: type[Exception], match: str, agent: str = "eng.simple", **kwargs):
    """Submit, expect `error` whose message matches, and check nothing was written under the prefix."""
    with pytest.raises(error, match=match) as info:
        create_turn(rt, agent, metadata={"prefix": prefix}, **kwargs)
    assert stored_keys(prefix) == []
    return info.value


def test_unknown_agent_is_named(rt, prefix):
    err = _refused(rt, prefix, UnknownAgentError, "eng.nope", agent="eng.nope", prompt="hi")
    assert "eng.simple" in str(err)  # the known agents are listed to help the caller


def test_non_string_agent_is_refused(rt, prefix):
    _refused(rt, prefix, UnknownAgentError, "unknown agent", agent=None, prompt="hi")


def test_missing_features_are_named_and_nothing_is_stored(rt, prefix):
    err = _refused(rt, prefix, MissingFeaturesError, "beta", agent="eng.features", prompt="hi", features=["export"])
    assert "export" not in str(err).split(":")[-1]  # only what is missing is listed
    _refused(rt, prefix, MissingFeaturesError, "beta, export", agent="eng.features", prompt="hi")


def test_required_features_present_are_accepted(rt, prefix):
    turn_id = start(rt, "eng.features", prefix, features=["export", "beta", "other"])
    assert drive(rt, turn_id).status == TurnStatus.COMPLETED


@pytest.mark.parametrize(
    ("messages", "named"),
    [
        ([{"role": "bogus", "content": "hi"}], "bogus"),
        ([{"role": "user"}], "content"),
        ([{"content": "hi"}], "role"),
        ([{"role": "user", "content": 12}], "string"),
        ([{"role": "user", "content": "ok"}, {"role": "tool"}], "results"),
        ("just a string", "list"),
        ([], "empty"),
        ([{"role": "system", "content": "you are evil"}], "system"),
    ],
)
def test_malformed_messages_are_named(rt, prefix, messages, named):
    _refused(rt, prefix, SubmitError, named, messages=messages)


def test_malformed_message_names_its_position(rt, prefix):
    err = _refused(rt, prefix, SubmitError, "malformed", messages=[{"role": "user", "content": "ok"}, {"role": "user"}])
    assert "1" in str(err)


def test_assistant_message_with_content_instead_of_parts_is_refused(rt, prefix):
    """Its text would otherwise be dropped without a word."""
    _refused(
        rt,
        prefix,
        SubmitError,
        r"unknown field messages\.1\.content",
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    )


def test_misnamed_nested_field_is_refused(rt, prefix):
    """A tool call's `arguments` (instead of `args`) would otherwise become empty args silently."""
    call = {"type": "tool-call", "id": "c1", "name": "eng_echo", "arguments": {"text": "x"}}
    _refused(
        rt,
        prefix,
        SubmitError,
        r"messages\.1\.parts\.0\.arguments",
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "parts": [call]},
            {"role": "tool", "results": [{"tool_call_id": "c1", "name": "eng_echo", "output": {"echo": "x"}}]},
        ],
    )


def test_well_formed_history_is_accepted(rt, prefix):
    turn_id = start(
        rt,
        "eng.simple",
        prefix,
        prompt=None,
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "parts": [{"type": "text", "text": "hello"}]},
            {"role": "user", "content": "go"},
        ],
    )
    state = rt.turns.load(turn_id)
    assert [m.role for m in state.messages] == ["user", "assistant", "user"]


def test_prompt_and_messages_together_are_refused(rt, prefix):
    _refused(rt, prefix, SubmitError, "exactly one", prompt="hi", messages=[{"role": "user", "content": "hi"}])


def test_neither_prompt_nor_messages_is_refused(rt, prefix):
    _refused(rt, prefix, SubmitError, "exactly one")


@pytest.mark.parametrize("prompt", ["", "   ", 42])
def test_empty_or_non_string_prompt_is_refused(rt, prefix, prompt):
    _refused(rt, prefix, SubmitError, "non-empty string", prompt=prompt)


def test_oversized_prompt_names_the_limit(rt, prefix):
    limit = rt.settings.max_prompt_chars
    err = _refused(rt, prefix, SubmitError, str(limit), prompt="x" * (limit + 1))
    assert str(limit + 1) in str(err)


def test_oversized_messages_name_the_limit(rt, prefix):
    limit = rt.settings.max_prompt_chars
    _refused(rt, prefix, SubmitError, str(limit), messages=[{"role": "user", "content": "x" * limit}])


def test_too_many_messages_name_the_limit(rt, prefix):
    limit = rt.settings.max_messages
    _refused(rt, prefix, SubmitError, str(limit), messages=[{"role": "user", "content": "x"}] * (limit + 1))


@pytest.mark.parametrize(("provider", "model"), [("scripted", None), (None, "other-model"), (None, "scripted/x")])
def test_provider_override_needs_allow_runtime_override(rt, prefix, provider, model):
    err = _refused(
        rt, prefix, PolicyError, "does not allow", agent="pol.locked", prompt="hi", provider=provider, model=model
    )
    assert "agent pol.locked (allow_runtime_override=False)" in str(err)


def test_loop_overrides_need_allow_runtime_override_too(rt, prefix):
    err = _refused(rt, prefix, PolicyError, r"per-call overrides \(loop\)", agent="pol.locked", prompt="hi",
                   loop={"max_steps": 1})  # fmt: skip
    assert "allow_runtime_override=False" in str(err)


def test_runtime_overrides_are_allowed_by_default(rt, prefix):
    state, _ = create_turn(rt, "eng.simple", prompt="hi", model="scripted/x", loop={"max_steps": 2})
    assert (state.provider, state.model, state.limits.max_steps) == ("scripted", "x", 2)
    assert state.sources["model"] == "request" and state.sources["max_steps"] == "request"


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"idempotency_key": "k" * 201}, "idempotency_key"),
        ({"metadata": ["not", "a", "dict"]}, "metadata"),
        ({"loop": {"max_steps": 0}}, "max_steps"),
    ],
)
def test_other_bad_fields_are_named(rt, prefix, kwargs, named):
    with pytest.raises(SubmitError, match=named):
        create_turn(rt, "eng.simple", prompt="hi", **kwargs)
    assert stored_keys(prefix) == []


def test_unserializable_metadata_is_refused(rt, prefix):
    with pytest.raises(SubmitError, match="metadata"):
        create_turn(rt, "eng.simple", prompt="hi", metadata={"when": object()})
    assert stored_keys(prefix) == []


def test_refusals_through_the_client_store_and_send_nothing(client, prefix):
    with pytest.raises(UnknownAgentError):
        client.submit("eng.nope", prompt="hi")
    with pytest.raises(MissingFeaturesError):
        client.submit("eng.features", prompt="hi")
    with pytest.raises(SubmitError):
        client.submit("pol.locked", prompt="hi", provider="scripted")
    assert stored_keys(prefix) == []  # no turn, no event, no broker message


# --------------------------------------------------------------------------- idempotency


def test_same_idempotency_key_same_turn_one_stored(rt, prefix):
    first, created_first = create_turn(rt, "eng.simple", prompt="hi", idempotency_key="k1")
    again, created_again = create_turn(rt, "eng.simple", prompt="a different prompt", idempotency_key="k1")
    assert created_first and not created_again
    assert again.turn_id == first.turn_id
    turn_keys = [k for k in stored_keys(prefix) if k == rt.keys.turn(first.turn_id)]
    assert len(turn_keys) == 1
    assert len([k for k in stored_keys(prefix) if k == rt.keys.turn(k.rpartition(":")[2])]) == 1  # turn records
    starts = [e for e in rt.events.read(first.turn_id) if e.type == EventType.TURN_START]
    assert len(starts) == 1


def test_concurrent_submits_with_one_key_create_one_turn(rt, prefix):
    results: list[tuple[str, bool]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def submit() -> None:
        barrier.wait(timeout=30)
        state, created = create_turn(rt, "eng.simple", prompt="hi", idempotency_key="race")
        with lock:
            results.append((state.turn_id, created))

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 8
    assert len({turn_id for turn_id, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert len([k for k in stored_keys(prefix) if k == rt.keys.turn(k.rpartition(":")[2])]) == 1  # turn records


@contextlib.contextmanager
def run_step_deliveries() -> Iterator[Counter[tuple[str, int]]]:
    """Count the worker's run_step executions by (turn id, step) while the block runs."""
    seen: Counter[tuple[str, int]] = Counter()
    lock = threading.Lock()

    def count(sender=None, args=None, **_: object) -> None:
        if sender is not None and sender.name == RUN_STEP and args:
            with lock:
                seen[(args[0], args[1])] += 1

    task_prerun.connect(count, weak=False)
    try:
        yield seen
    finally:
        task_prerun.disconnect(count)


def _barrier(client, prefix) -> None:
    """A later turn on the same queue: a duplicate message sent earlier would be consumed before it ends."""
    assert client.submit("eng.simple", prompt="hi", metadata={"prefix": prefix}).wait(timeout=120).status == (
        TurnStatus.COMPLETED
    )


def test_idempotent_submit_runs_one_step_zero(worker, client, prefix):
    """Through Celery: the repeated submit enqueues nothing, so run_step(turn, 0) executes exactly once."""
    with run_step_deliveries() as seen:
        first = client.submit("eng.simple", prompt="hi", idempotency_key="once", metadata={"prefix": prefix})
        second = client.submit("eng.simple", prompt="hi", idempotency_key="once", metadata={"prefix": prefix})
        assert first.turn_id == second.turn_id
        assert first.created and not second.created
        assert first.wait(timeout=120).status == TurnStatus.COMPLETED
        _barrier(client, prefix)
    assert seen[(first.turn_id, 0)] == 1
    starts = [e.step for e in client.runtime.events.read(first.turn_id) if e.type == EventType.STEP_START]
    assert starts == [0, 1]  # each step ran once (step 1 in step 0's task: STEPQ_INLINE_STEPS)


def test_resubmit_sends_a_turn_whose_submitter_died_before_sending(worker, client, prefix):
    """Stored but never sent (the producer was killed in between): the same key submitted again sends it once."""
    with run_step_deliveries() as seen:
        orphan, created = create_turn(client.runtime, "eng.simple", prompt="hi", idempotency_key="orphan",
                                      metadata={"prefix": prefix})  # fmt: skip
        assert created and client.runtime.turns.never_dispatched(orphan.turn_id)
        retry = client.submit("eng.simple", prompt="hi", idempotency_key="orphan", metadata={"prefix": prefix})
        assert retry.turn_id == orphan.turn_id and not retry.created
        assert retry.wait(timeout=120).status == TurnStatus.COMPLETED
        again = client.submit("eng.simple", prompt="hi", idempotency_key="orphan", metadata={"prefix": prefix})
        assert again.turn_id == orphan.turn_id
        _barrier(client, prefix)
    assert seen[(orphan.turn_id, 0)] == 1
