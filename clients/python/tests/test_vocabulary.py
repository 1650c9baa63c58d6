"""One vocabulary: the states, park codes, decisions and problem names of
server/openapi.json against what each client and the web UI know, and the
problem names the server's sources answer against the document. A state or
error code added on one side and not the others fails here, naming it."""

import json
import re
from pathlib import Path
from typing import Dict, List, Set

import pytest

from idem_world import SOURCE_DIR

from idem_client import vocabulary

OPENAPI = json.loads((SOURCE_DIR / "server/openapi.json").read_text())
SCHEMAS = OPENAPI["components"]["schemas"]
PREFIX = "urn:idem:problem:"

#: What each list must equal: openapi's enum at this place.
ENUMS = {
    "SAGA_STATES": SCHEMAS["SagaState"]["enum"],
    "STEP_STATES": SCHEMAS["Step"]["properties"]["state"]["enum"],
    "SAGA_PARK_CODES": SCHEMAS["SagaSummary"]["properties"]["park_code"]["enum"],
    "STEP_PARK_CODES": SCHEMAS["Step"]["properties"]["park_code"]["enum"],
    "CALL_STATES": SCHEMAS["CallAnswer"]["properties"]["state"]["enum"],
    "RESOLVE_DECISIONS": SCHEMAS["Resolution"]["properties"]["decision"]["enum"],
}
PROBLEMS: Set[str] = {t[len(PREFIX):] for t in SCHEMAS["Problem"]["properties"]["type"]["enum"]}


def ts_lists(path: Path) -> Dict[str, List[str]]:
    """`export const NAME = [ "a", "b" ] as const;` lists and `export const NAME = "x";` strings of a TS file."""
    src = path.read_text()
    out = {m.group(1): re.findall(r'"([^"]*)"', m.group(2))
           for m in re.finditer(r"export const (\w+) = \[(.*?)\] as const;", src, re.S)}
    out.update({m.group(1): [m.group(2)] for m in re.finditer(r'export const (\w+) = "([^"]*)";', src)})
    return out


TS = ts_lists(SOURCE_DIR / "clients/typescript/src/vocabulary.ts")


def same(name: str, have, want) -> None:
    have, want = list(have), list(want)
    assert len(have) == len(set(have)), f"{name} has duplicates: {have}"
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    assert not missing and not extra, f"{name}: missing {missing} (in server/openapi.json), extra {extra}"


@pytest.mark.parametrize("name", sorted(ENUMS))
def test_python_lists_are_openapis(name):
    same(f"idem_client.vocabulary.{name}", getattr(vocabulary, name), ENUMS[name])


@pytest.mark.parametrize("name", sorted(ENUMS))
def test_typescript_lists_are_openapis(name):
    assert name in TS, f"clients/typescript/src/vocabulary.ts has no {name}"
    same(f"clients/typescript/src/vocabulary.ts {name}", TS[name], ENUMS[name])


def test_final_states_are_saga_states_in_both_clients():
    assert set(vocabulary.FINAL_SAGA_STATES) <= set(ENUMS["SAGA_STATES"])
    same("vocabulary.ts FINAL_SAGA_STATES", TS["FINAL_SAGA_STATES"], vocabulary.FINAL_SAGA_STATES)


def test_typescript_types_come_from_the_lists():
    types = (SOURCE_DIR / "clients/typescript/src/types.ts").read_text()
    for t, name in [("SagaState", "SAGA_STATES"), ("StepState", "STEP_STATES"), ("ParkCode", "SAGA_PARK_CODES"),
                    ("StepParkCode", "STEP_PARK_CODES"), ("CallState", "CALL_STATES"),
                    ("ResolveDecision", "RESOLVE_DECISIONS")]:
        assert f"export type {t} = (typeof {name})[number];" in types, f"types.ts: {t} is not derived from {name}"


def test_the_web_uis_states_are_openapis():
    app = (SOURCE_DIR / "server/ui/app.js").read_text()
    states = re.search(r"const STATES = \[(.*?)\];", app, re.S)
    settled = re.search(r"const SETTLED = new Set\(\[(.*?)\]\);", app, re.S)
    assert states and settled, "server/ui/app.js: no STATES or SETTLED list"
    same("server/ui/app.js STATES", re.findall(r"'([^']*)'", states.group(1)), ENUMS["SAGA_STATES"])
    unknown = set(re.findall(r"'([^']*)'", settled.group(1))) - set(ENUMS["SAGA_STATES"])
    assert not unknown, f"server/ui/app.js SETTLED: not saga states: {sorted(unknown)}"
    # Every state the page compares with (s.state === '...') is one of openapi's.
    compared = set(re.findall(r"\.state [!=]== '([a-z_]+)'", app))
    assert compared, "the scan found no state comparisons in app.js"
    unknown = compared - set(ENUMS["SAGA_STATES"]) - set(ENUMS["STEP_STATES"])
    assert not unknown, f"server/ui/app.js compares with states openapi does not have: {sorted(unknown)}"
    problems = set(re.findall(r"urn:idem:problem:([a-z0-9-]+)", app)) - PROBLEMS
    assert not problems, f"server/ui/app.js names problems openapi does not have: {sorted(problems)}"


def server_problem_names() -> Set[str]:
    """Every problem name the server's sources answer: the third argument of
    each Problem(res, status, TYPE, ...) call (string literals, kProblem
    constants, and the control verbs' "<verb>-not-possible")."""
    names: Set[str] = set()
    files = sorted((SOURCE_DIR / "server").glob("*.cc")) + sorted((SOURCE_DIR / "server").glob("*.h"))
    consts = {}
    for f in files:
        consts.update(re.findall(r'(kProblem\w+)\s*=\s*"urn:idem:problem:([a-z0-9-]+)"', f.read_text()))
    for f in files:
        src = f.read_text()
        verb_fn = re.search(r"VerbName\(Verb \w+\)\s*\{(.*?)\}", src, re.S)
        verbs = re.findall(r'"([a-z]+)"', verb_fn.group(1)) if verb_fn else []
        for m in re.finditer(r"\bProblem\(\s*\w+\s*,\s*[^,()]+\s*,", src):
            arg = _argument(src, m.end())
            found = re.findall(r'"([a-z0-9-]+)"', arg) + [consts[k] for k in re.findall(r"kProblem\w+", arg)]
            assert found, f"{f.name}: a Problem() whose type the scan cannot read: {arg.strip()[:80]}"
            for n in found:
                if n.startswith("-"):
                    assert verbs, f"{f.name}: {n} built from verbs the scan cannot find"
                    names.update(v + n for v in verbs)
                else:
                    names.add(n)
    return names


def _argument(src: str, i: int) -> str:
    """The text of one call argument from ``i`` to the next top-level comma."""
    depth, j = 0, i
    while j < len(src):
        c = src[j]
        if c == '"':
            j += 1
            while src[j] != '"':
                j += 2 if src[j] == "\\" else 1
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            break
        j += 1
    return src[i:j]


def test_openapi_lists_every_problem_the_server_answers_and_no_other():
    answered = server_problem_names()
    assert len(answered) > 30, f"the scan of server/ found too few problem names: {sorted(answered)}"
    undocumented, stale = sorted(answered - PROBLEMS), sorted(PROBLEMS - answered)
    assert not undocumented, f"server/ answers problems missing from openapi.json Problem.type: {undocumented}"
    assert not stale, f"openapi.json Problem.type lists problems no server source answers: {stale}"


def test_the_problem_names_clients_act_on_are_openapis():
    python = set(vocabulary.BUSY_PROBLEMS) | set(vocabulary.DECIDED_PROBLEMS) | {vocabulary.SAGA_NOT_OPEN,
                                                                                  vocabulary.CALL_ID_REUSED}
    ts = set(TS["BUSY_PROBLEMS"]) | set(TS["DECIDED_PROBLEMS"]) | set(TS["SAGA_NOT_OPEN"]) | set(TS["CALL_ID_REUSED"])
    assert python == ts, f"the clients act on different problems: python {sorted(python)}, typescript {sorted(ts)}"
    assert not python - PROBLEMS, f"not in openapi.json: {sorted(python - PROBLEMS)}"
    errors_ts = (SOURCE_DIR / "clients/typescript/src/errors.ts").read_text()
    named = set(re.findall(r"\$\{PROBLEM_PREFIX\}([a-z0-9-]*[a-z0-9])\b", errors_ts)) - {"network", "http"}
    assert named, "the scan found no problem names in errors.ts"
    assert not named - PROBLEMS, f"errors.ts names problems openapi.json does not have: {sorted(named - PROBLEMS)}"
