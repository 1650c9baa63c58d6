"""A ReAct-style agent loop in Python on open sagas against a real `idem
serve`, the travel providers keeping their ledger: a scripted model picks the
tool calls (no network, no model), each one an idem call keyed by the
model's tool-call id with the model's decision; a write that waits for a
person is approved by another principal (maria, not the agent); the model
repeats itself; `idem serve` is SIGKILLed mid-call and restarted; the agent
restarts and replays its loop. The ledger shows one effect per intended call.
"""

import threading
import time
from typing import Any, Dict, List, Optional

import pytest

from conftest import client_for
from idem_world import World

from idem_client import CallAnswer, IdemClient, IdemSagaNotOpenError, OpenSagaSession, model_decision

TOOLS = ["flights.reserve", "hotels.book", "cars.rent", "payments.charge"]
FLIGHT = {"traveller": "Ana", "from": "LIS", "to": "NRT", "date": "2026-12-01", "return_date": "2026-12-08",
          "currency": "EUR"}
HOTEL = {"traveller": "Ana", "city": "Tokyo", "check_in": "2026-12-01", "check_out": "2026-12-08", "currency": "EUR"}
CAR = {"traveller": "Ana", "city": "Tokyo", "from": "2026-12-01", "until": "2026-12-08"}
CHARGE = {"traveller": "Ana", "amount_cents": 184000, "currency": "EUR", "description": "Tokyo trip"}


class ScriptedModel:
    """Answers each turn from a script: a list of tool calls {id, tool, args},
    or a final text. Keeps every prompt it was sent (what the model saw)."""

    def __init__(self, turns: List[Any]) -> None:
        self.turns = list(turns)
        self.prompts: List[List[Dict[str, Any]]] = []

    def answer(self, messages: List[Dict[str, Any]]) -> Any:
        self.prompts.append(list(messages))
        if not self.turns:
            raise AssertionError("the scripted model has no more turns")
        return self.turns.pop(0)


def run_loop(model: ScriptedModel, session: OpenSagaSession, approver: Optional[IdemClient] = None) -> List[Dict]:
    """The ReAct loop: ask the model, run its tool calls through idem, show it
    the answers, until it answers text. A call that waits for a person is
    decided by ``approver`` (a person's client), then asked again."""
    messages: List[Dict[str, Any]] = [{"role": "user", "content": "Book Ana's trip to Tokyo"}]
    while True:
        turn = model.answer(messages)
        if isinstance(turn, str):
            messages.append({"role": "assistant", "content": turn})
            return messages
        for call in turn:
            decision = model_decision("scripted-react", messages, message_id=f"resp_{len(model.prompts)}",
                                      call_id=call["id"])
            # No Prefer: wait on the call itself: it would hold a call that
            # waits for a person for the whole wait.
            answer = session.call(call["id"], call["tool"], call["args"], decision=decision)
            if answer.state in ("processing", "unknown"):
                answer = session.get_call(call["id"], wait=10)
            if answer.state == "awaiting_approval" and approver is not None:
                pending = approver.approval_for(session.saga_id, answer.step_id)
                assert pending is not None, f"no approval listed for {answer.step_id}"
                approver.approve(pending["token"], note="within budget")
                answer = session.get_call(call["id"], wait=10)
            messages.append({"role": "tool", "call_id": call["id"], "content": answer.raw})


def answers(messages: List[Dict]) -> Dict[str, CallAnswer]:
    """The answers the model was shown, by call id."""
    return {m["call_id"]: CallAnswer.from_json(m["content"]) for m in messages if m["role"] == "tool"}


def test_react_loop_books_repeats_waits_for_a_person_and_commits(world: World):
    agent, maria = client_for(world, "agent"), client_for(world, "approver")
    session = agent.begin("trip-ana-1", TOOLS, metadata={"traveller": "Ana"})
    assert session.info["state"] == "open"
    model = ScriptedModel([
        [{"id": "call_f1", "tool": "flights.reserve", "args": FLIGHT}],
        [{"id": "call_h1", "tool": "hotels.book", "args": HOTEL}],
        # The model repeats the booking under a new call id.
        [{"id": "call_h2", "tool": "hotels.book", "args": HOTEL}],
        [{"id": "call_c1", "tool": "cars.rent", "args": CAR}, {"id": "call_p1", "tool": "payments.charge",
                                                                "args": CHARGE}],
        "Ana's trip is booked.",
    ])
    seen = answers(run_loop(model, session, approver=maria))
    assert seen["call_f1"].state == "succeeded" and seen["call_f1"].result["reservation_id"]
    assert not seen["call_f1"].deduplicated
    assert seen["call_h2"].deduplicated and seen["call_h2"].duplicate_of == "call_h1"
    assert seen["call_h2"].reason == "same tool and arguments"
    assert seen["call_h2"].result == seen["call_h1"].result
    assert seen["call_p1"].state == "succeeded", seen["call_p1"]
    assert seen["call_p1"].result["charge_id"]

    # The agent asks for an answer again with the same call id: the journal answers.
    again = session.call("call_f1", "flights.reserve", FLIGHT)
    assert again.deduplicated and again.reason == "same call_id"
    assert again.result == seen["call_f1"].result

    assert session.commit(wait=10)["state"] == "succeeded"
    saga = session.get()
    assert saga["state"] == "succeeded"
    first = next(c for c in saga["calls"] if c["call_id"] == "call_f1")
    assert first["decision"]["model"] == "scripted-react"
    assert len(first["decision"]["prompt_sha256"]) == 64
    assert world.providers.effects() == ["cars.rent", "flights.reserve", "hotels.book", "payments.charge"]
    assert world.providers.clean()
    with pytest.raises(IdemSagaNotOpenError):
        session.call("call_late", "cars.rent", CAR)


def test_rollback_undoes_every_booking_in_reverse_order(world: World):
    agent = client_for(world, "agent")
    session = agent.begin("trip-undo-1", TOOLS)
    model = ScriptedModel([
        [{"id": "call_f1", "tool": "flights.reserve", "args": FLIGHT}],
        [{"id": "call_h1", "tool": "hotels.book", "args": HOTEL}],
        [{"id": "call_c1", "tool": "cars.rent", "args": CAR}],
        "Ana cancelled; undoing.",
    ])
    run_loop(model, session)
    assert session.rollback(reason="Ana cancelled the trip", wait=10)["state"] in ("compensated", "compensating")
    assert agent.wait_for_saga(session.saga_id)["state"] == "compensated"
    ledger = world.providers.ledger_json()
    undo = [e["provider"] for e in sorted(ledger["effects"], key=lambda e: e["id"])
            if e["operation"] in ("cancel", "return")]
    assert undo == ["cars", "hotels", "flights"]
    assert world.providers.clean()


def test_server_sigkilled_mid_call_then_the_agent_restarts_its_loop(tmp_path):
    # The first flight reservation takes 1.5 s at the provider: the kill
    # lands while idem waits for it.
    world = World(tmp_path, provider_faults=["flights.reserve=delay(1500)@1"])
    try:
        retries = []
        agent = client_for(world, "agent", on_retry=retries.append)
        session = agent.begin("trip-kill-1", TOOLS)
        script = [
            [{"id": "call_f1", "tool": "flights.reserve", "args": FLIGHT}],
            [{"id": "call_h1", "tool": "hotels.book", "args": HOTEL}],
        ]
        out: Dict[str, Any] = {}

        def first_run():
            try:
                out["messages"] = run_loop(ScriptedModel(script + ["stopping here"]), session)
            except BaseException as e:  # noqa: BLE001 - reported below
                out["error"] = e

        t = threading.Thread(target=first_run)
        t.start()
        deadline = time.monotonic() + 10
        while "call_f1" not in str(session.get().get("calls", [])) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        world.server.kill()  # SIGKILL while the flight call is at the provider
        time.sleep(0.3)
        world.server.start_and_wait()
        t.join(timeout=60)
        assert "error" not in out, out.get("error")
        seen = answers(out["messages"])
        assert seen["call_f1"].state == "succeeded", seen["call_f1"]
        assert seen["call_h1"].state == "succeeded", seen["call_h1"]
        call_retries = [e for e in retries if e.path.endswith("/calls")]
        assert call_retries, "the call was sent again after the kill"
        assert {e.key for e in call_retries} == {"call_f1"}

        # The agent process restarts: a new client, the same intent (the same
        # saga), and its loop replayed from the start with the same call ids,
        # then one more booking.
        restarted = client_for(world, "agent")
        again = restarted.begin("trip-kill-1", TOOLS)
        assert again.saga_id == session.saga_id
        replay = answers(run_loop(ScriptedModel(script + [
            [{"id": "call_c1", "tool": "cars.rent", "args": CAR}], "booked"]), again))
        assert replay["call_f1"].deduplicated and replay["call_f1"].reason == "same call_id"
        assert replay["call_h1"].deduplicated and replay["call_h1"].result == seen["call_h1"].result
        assert replay["call_c1"].state == "succeeded" and not replay["call_c1"].deduplicated
        assert again.commit(wait=10)["state"] == "succeeded"
        assert world.providers.effects() == ["cars.rent", "flights.reserve", "hotels.book"]
        assert world.providers.clean()
    finally:
        world.close()
