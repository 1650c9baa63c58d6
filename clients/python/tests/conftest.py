"""pytest fixtures: a world (travel providers + `idem serve`) per test or per
module, and clients of it for each role (tests/idem_world.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from idem_world import World  # noqa: E402

from idem_client import IdemClient, RetryPolicy  # noqa: E402

FAST = dict(attempts=40, base_delay=0.05, max_delay=0.4)


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    yield w
    w.close()


@pytest.fixture(scope="module")
def shared_world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("world"))
    yield w
    w.close()


def client_for(world: World, role: str, **retry) -> IdemClient:
    """A client with the token of ``role`` (agent, other, approver, operator)."""
    return IdemClient(world.server.base_url, token=world.tokens[role], retry=RetryPolicy(**{**FAST, **retry}))
