"""`stepq turns`, `stepq approvals`, `stepq threads` and `stepq export` as a user runs them (the real `stepq` in a
subprocess), a fork reusing stored results, and an exported case replayed offline (stepq.providers.replay)."""

from __future__ import annotations

import json

import pytest

from stepq.models import TurnStatus
from stepq.providers.function import FunctionRequest, FunctionResponse
from stepq.providers.replay import load_case, replay_case
from stepq.providers.scripted import ScriptToolCall
from tests.agents_listings import runs_key
from tests.conftest import eventually, settings_env
from tests.test_cli import stepq


@pytest.fixture
def env(settings) -> dict[str, str]:
    return settings_env(settings)


def _runs(rt, prefix: str) -> int:
    return int(rt.redis.get(runs_key(prefix)) or 0)


def test_turns_approvals_and_threads_at_the_command_line(worker, client, prefix, env):
    done = client.submit("rt.basic", prompt="hi", metadata={"prefix": prefix, "tenant": "acme"})
    done.wait(timeout=60)
    parked = client.submit("rt.approver", prompt="go", metadata={"prefix": prefix, "tenant": "acme"})
    eventually(lambda: parked.get().status == TurnStatus.AWAITING_APPROVAL, what="parking")
    thread = client.create_thread("rt.basic", tenant="acme", metadata={"title": "CLI thread"})

    table = stepq(env, "turns", "--tenant", "acme", check=0).stdout
    lines = table.splitlines()
    assert lines[0].split() == ["TURN", "AGENT", "STATUS", "STEP", "CREATED", "FINISH", "ORIGIN"]
    assert [line.split()[0] for line in lines[1:]] == [parked.turn_id, done.turn_id]
    page = json.loads(stepq(env, "turns", "--tenant", "acme", "--status", "completed", "--json", check=0).stdout)
    assert [t["turn_id"] for t in page["items"]] == [done.turn_id] and page["next_cursor"] is None
    first = stepq(env, "turns", "--tenant", "acme", "--limit", "1", check=0).stdout
    assert parked.turn_id in first and done.turn_id not in first and "more: --cursor " in first
    cursor = first.split("more: --cursor ")[1].strip()
    assert done.turn_id in stepq(env, "turns", "--tenant", "acme", "--cursor", cursor, check=0).stdout
    assert (
        stepq(env, "turns", "--tenant", "acme", "--since", "1h", "--agent", "rt.basic", check=0).stdout.count("turn_")
        == 1
    )
    assert "nothing listed" in stepq(env, "turns", "--tenant", "globex", check=0).stdout

    inbox = stepq(env, "approvals", "--tenant", "acme", "--pending", check=0).stdout
    assert "rt_side_effect" in inbox and parked.turn_id in inbox and '"label": "gated"' in inbox
    [pending] = json.loads(stepq(env, "approvals", "--tenant", "acme", "--json", check=0).stdout)["items"]
    assert "token" not in json.dumps(pending)
    assert "nothing listed" in stepq(env, "approvals", "--tenant", "acme", "--decided", check=0).stdout

    threads = stepq(env, "threads", "--tenant", "acme", check=0).stdout
    assert thread.thread_id in threads and "CLI thread" in threads


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["turns", "--status", "stuck"], "--status 'stuck' is not a turn status"),
        (["turns", "--since", "yesterday"], "--since 'yesterday'"),
        (["turns", "--limit", "0"], "--limit must be from 1 to 200"),
        (["status", "--limit", "0"], "--limit must be from 1 to 200"),  # 0 listed every turn (ZRANGE 0 -1)
        (["status", "--limit", "9" * 30], "--limit must be from 1 to 200"),  # was Redis's "out of range" error
        (["turns", "--cursor", "nonsense"], "invalid cursor"),
        (["threads", "--cursor", "x:"], "invalid cursor"),
        (["export", "turn_" + "0" * 32], "no turn"),
    ],
)
def test_bad_input_is_one_stderr_line_and_exit_2(env, args, words):
    proc = stepq(env, *args, check=2)
    assert proc.stderr.count("\n") == 1 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_fork_reuses_the_stored_tool_results_and_shows_its_origin(worker, client, prefix, rt, env):
    original = client.submit("ls.fork", prompt="Weather in Paris", metadata={"prefix": prefix, "tenant": "acme"})
    assert original.wait(timeout=60).text == "Weather in Paris: sunny (run 1)"
    assert _runs(rt, prefix) == 1
    # from step 1 (after the lookup): the stored result is reused, the tool does not run again
    forked = client.fork(original.turn_id, from_step=1, prompt="Weather in Paris tomorrow", tenant="acme")
    assert forked.wait(timeout=60).text == "Weather in Paris tomorrow: sunny (run 1)"
    assert _runs(rt, prefix) == 1
    # from step 0 the model is asked before any lookup: it calls the tool, which runs (the counter counts)
    again = client.fork(original.turn_id, from_step=0, overrides={"max_steps": 4})
    assert again.wait(timeout=60).text == "Weather in Paris: sunny (run 2)"
    assert _runs(rt, prefix) == 2
    assert again.get().limits.max_steps == 4 and again.get().metadata["origin"] == {
        "turn_id": original.turn_id,
        "step": 0,
    }
    shown = stepq(env, "show", forked.turn_id, check=0).stdout
    assert f"from {original.turn_id} at step 1" in shown
    assert json.loads(stepq(env, "show", forked.turn_id, "--json", check=0).stdout)["origin"] == {
        "turn_id": original.turn_id,
        "step": 1,
    }
    listed = client.list_turns(tenant="acme", agent="ls.fork").items
    assert [t.origin for t in listed] == [
        {"turn_id": original.turn_id, "step": 0},
        {"turn_id": original.turn_id, "step": 1},
        None,
    ]
    with pytest.raises(Exception, match="no turn"):
        client.fork(original.turn_id, from_step=0, tenant="globex")  # another tenant's turn is not found


def test_an_exported_case_replays_offline_without_running_a_tool(worker, client, prefix, rt, env, tmp_path):
    handle = client.submit("ls.fork", prompt="Weather in Oslo", metadata={"prefix": prefix, "tenant": "acme"})
    assert handle.wait(timeout=60).text == "Weather in Oslo: sunny (run 1)"
    path = tmp_path / "case.json"
    out = stepq(env, "export", handle.turn_id, "-o", str(path), check=0).stdout
    assert "wrote" in out and "2 steps" in out
    case = load_case(path)
    assert (case.agent, case.turn_id, case.result.text) == ("ls.fork", handle.turn_id, "Weather in Oslo: sunny (run 1)")
    assert [s.assistant.tool_calls[0].name for s in case.steps[:1]] == ["ls_lookup"]
    assert case.steps[0].tool_results[0].output["forecast"] == "sunny"
    assert json.loads(stepq(env, "export", handle.turn_id, check=0).stdout)["turn_id"] == handle.turn_id  # stdout
    refused = stepq(env, "export", handle.turn_id, "-o", str(tmp_path), check=2).stderr  # a folder: nothing written
    assert refused.strip() == f"stepq: error: -o {tmp_path} is a folder; give the file to write", refused
    assert sorted(p.name for p in tmp_path.iterdir()) == ["case.json"]  # no `<folder>.partial` beside it

    replay = replay_case(path)  # the recorded answers played back: the same text, twice (deterministic)
    assert replay.matches_recording and replay.steps == 2 and replay.unrecorded_calls == []
    assert replay_case(path).model_dump() == replay.model_dump()

    def changed(request: FunctionRequest) -> FunctionResponse:  # a changed model: same tool, other wording
        results = [r for m in request.messages if m.role == "tool" for r in m.results]
        if not results:
            return FunctionResponse(tool_calls=[ScriptToolCall(name="ls_lookup", args={"city": "Paris"})])
        return FunctionResponse(text=f"It will be {results[0].output['forecast']}.")

    other = replay_case(path, model=changed)
    assert other.text == "It will be sunny." and not other.matches_recording and other.unrecorded_calls == []

    def asks_elsewhere(request: FunctionRequest) -> FunctionResponse:  # a call nothing recorded: not run
        if request.step == 0:
            return FunctionResponse(tool_calls=[ScriptToolCall(name="ls_lookup", args={"city": "Rome"})])
        return FunctionResponse(text=str(request.messages[-1].results[0].output))

    unrecorded = replay_case(path, model=asks_elsewhere)
    assert unrecorded.unrecorded_calls == ['ls_lookup({"city": "Rome"})'] and "not recorded" in unrecorded.text
    assert _runs(rt, prefix) == 1  # no replay ran the tool
    with pytest.raises(ValueError, match="not a stepq case"):
        load_case({"hello": 1})
