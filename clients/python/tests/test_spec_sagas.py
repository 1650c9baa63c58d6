"""The Python client against a real `idem serve` and the travel providers:
spec sagas under an Idempotency-Key, submit-and-wait, a person's approval,
typed errors from the real server, control requests, and a submit retried
with the same key across a SIGKILL of the server."""

import threading
import time

import pytest

from conftest import client_for
from idem_world import TRIP, TRIP_INPUT

from idem_client import (
    IdemClient,
    IdemConflictError,
    IdemError,
    IdemForbiddenError,
    IdemNotFoundError,
    IdemUnauthorizedError,
    IdemValidationError,
    NO_RETRY,
    RetryPolicy,
    model_decision,
)


def test_submit_replay_wait_and_approve_one_effect_per_step(shared_world):
    w = shared_world
    agent, maria = client_for(w, "agent"), client_for(w, "approver")
    decision = model_decision("scripted", [{"role": "user", "content": "Book Ana's trip"}])
    first = agent.submit({"spec": TRIP, "input": TRIP_INPUT, "decision": decision}, intent_key="ana-tokyo", wait=10)
    assert first.created and not first.replayed
    # Submit-and-wait: the answer came when the saga stopped for the person.
    assert first.preference_applied == "wait=10"
    assert first.saga["state"] == "awaiting_approval"
    again = agent.submit({"spec": TRIP, "input": TRIP_INPUT, "decision": decision}, intent_key="ana-tokyo")
    assert again.saga["saga_id"] == first.saga["saga_id"]
    assert again.replayed

    saga_id = first.saga["saga_id"]
    waiting = [a for a in maria.approvals() if a["saga_id"] == saga_id]
    assert [a["step"] for a in waiting] == ["charge_payment"]
    assert maria.approval_for(saga_id, "charge_payment")["token"] == waiting[0]["token"]
    # The agent is not the person: it may not approve its own saga's commit.
    with pytest.raises(IdemForbiddenError) as own:
        agent.approve(waiting[0]["token"], note="self")
    assert own.value.status == 403
    approved = maria.approve(waiting[0]["token"], note="within budget")
    assert approved["state"] == "succeeded"
    # Approving again answers the recorded outcome and calls nothing.
    assert maria.approve(waiting[0]["token"], note="twice")["state"] == "succeeded"

    assert any(s["saga_id"] == saga_id for s in agent.list_sagas(status="succeeded"))
    assert w.providers.effects(saga_id) == ["cars.rent", "flights.reserve", "hotels.book", "payments.charge"]
    assert w.providers.clean()


def test_same_intent_key_with_other_content_is_a_typed_error(shared_world):
    agent = client_for(shared_world, "agent")
    agent.submit({"spec": TRIP, "input": TRIP_INPUT}, intent_key="bob-1")
    with pytest.raises(IdemError) as e:
        agent.submit({"spec": TRIP, "input": {**TRIP_INPUT, "traveller": "Bob"}}, intent_key="bob-1")
    assert isinstance(e.value, (IdemConflictError, IdemValidationError)), type(e.value)
    assert e.value.status in (409, 422)
    assert e.value.type.startswith("urn:idem:problem:")
    assert e.value.problem_name == "idempotency-key-reused"


def test_real_refusals_are_typed_401_403_404_422(shared_world):
    w = shared_world
    agent, other = client_for(w, "agent"), client_for(w, "other")
    nobody = IdemClient(w.server.base_url, token="not-a-token", retry=NO_RETRY)
    with pytest.raises(IdemUnauthorizedError) as e401:
        nobody.list_sagas()
    assert e401.value.status == 401
    assert "not-a-token" not in str(e401.value) and "not-a-token" not in repr(nobody)
    with pytest.raises(IdemForbiddenError):
        agent.approvals()
    with pytest.raises(IdemNotFoundError) as e404:
        agent.get_saga("sg_doesnotexist")
    assert e404.value.type == "urn:idem:problem:not-found"
    with pytest.raises(IdemValidationError) as bad:
        agent.submit({"spec": {"name": "x", "steps": "no"}}, intent_key="bad-1")
    assert bad.value.detail
    mine = agent.submit({"spec": TRIP, "input": TRIP_INPUT}, intent_key="mine-1")
    with pytest.raises((IdemNotFoundError, IdemForbiddenError)):
        other.get_saga(mine.saga["saga_id"])
    with pytest.raises(IdemForbiddenError) as not_allowed:
        agent.begin("open-bad", ["flights.reserve"]).call("c1", "payments.refund", {})
    assert not_allowed.value.problem_name == "tool-not-allowed"


def test_pause_resume_cancel_are_durable_requests(shared_world):
    w = shared_world
    agent, ops = client_for(w, "agent"), client_for(w, "operator")
    s = agent.submit({"spec": TRIP, "input": {**TRIP_INPUT, "traveller": "Cid"}}, intent_key="cid-1", wait=10)
    saga_id = s.saga["saga_id"]
    assert s.saga["state"] == "awaiting_approval"
    with pytest.raises(IdemForbiddenError):
        agent.pause(saga_id, reason="agents may not")
    # A saga waiting for a person cannot be paused: a typed 409.
    with pytest.raises(IdemConflictError) as paused:
        ops.pause(saga_id, reason="checking")
    assert paused.value.problem_name == "pause-not-possible"
    assert ops.resume(saga_id)["control"]["recorded"] is False
    cancelled = agent.cancel(saga_id, reason="changed plans")
    assert isinstance(cancelled["control"]["recorded"], bool)
    done = agent.wait_for_saga(saga_id)
    assert done["state"] in ("compensated", "cancelled")
    assert w.providers.effects(saga_id) == [
        "cars.rent", "cars.return", "flights.cancel", "flights.reserve", "hotels.book", "hotels.cancel"]


def test_submit_while_the_server_is_down_is_retried_with_the_same_key(world):
    world.server.kill()
    retries = []
    client = IdemClient(world.server.base_url, token=world.tokens["agent"],
                        retry=RetryPolicy(attempts=30, base_delay=0.05, max_delay=0.3, on_retry=retries.append))
    out = {}

    def submit():
        out["first"] = client.submit({"spec": TRIP, "input": {**TRIP_INPUT, "traveller": "Dee"}}, intent_key="dee-1")

    t = threading.Thread(target=submit)
    t.start()
    time.sleep(0.4)
    world.server.start_and_wait()
    t.join(timeout=30)
    assert "first" in out
    assert retries, "the first attempts found no server"
    assert all(e.key == "dee-1" and e.error.kind == "network" for e in retries)
    again = client.submit({"spec": TRIP, "input": {**TRIP_INPUT, "traveller": "Dee"}}, intent_key="dee-1")
    assert again.saga["saga_id"] == out["first"].saga["saga_id"]
    assert len([s for s in client.list_sagas() if s["intent_key"] == "dee-1"]) == 1
