"""Test fixtures: a real `idem serve` and the travel example's providers on
loopback, started from the binaries CTest passes (IDEM_BIN,
TRAVEL_PROVIDERS_BIN, TRAVEL_LEDGER_BIN, IDEM_SOURCE_DIR; by hand they are
taken from ../../build), the providers' ledger, and an auth file with one
caller per role, so the agent and the person who approves are different
principals as in a real deployment.
"""

from pathlib import Path
from typing import Dict, List, Optional
import hashlib
import json
import os
import secrets
import socket
import subprocess
import time
import urllib.request

HERE = Path(__file__).resolve().parent
SOURCE_DIR = Path(os.environ.get("IDEM_SOURCE_DIR", HERE.parents[2]))
BUILD = SOURCE_DIR / "build"
IDEM_BIN = os.environ.get("IDEM_BIN", str(BUILD / "idem"))
PROVIDERS_BIN = os.environ.get("TRAVEL_PROVIDERS_BIN", str(BUILD / "examples/travel_booking/travel-providers"))
LEDGER_BIN = os.environ.get("TRAVEL_LEDGER_BIN", str(BUILD / "examples/travel_booking/travel-ledger"))

TRIP = json.loads((SOURCE_DIR / "examples/travel_booking/trip.json").read_text())
TRIP_INPUT = json.loads((SOURCE_DIR / "examples/travel_booking/input.json").read_text())

#: How an open saga undoes each travel booking (open sagas have no spec to say it).
OPEN_COMPENSATIONS = {
    "flights.reserve": {"tool": "flights.cancel", "args": {"reservation_id": "${result.reservation_id}"}},
    "hotels.book": {"tool": "hotels.cancel", "args": {"booking_id": "${result.booking_id}"}},
    "cars.rent": {"tool": "cars.return", "args": {"rental_id": "${result.rental_id}"}},
    "payments.charge": {
        "tool": "payments.refund",
        "args": {"charge_id": "${result.charge_id}", "amount_cents": "${result.amount_cents}"},
    },
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str, proc: subprocess.Popen, what: str, log: Path, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what}: no answer from {url} within {timeout} s: {log.read_text()[-4000:]}")


class Process:
    """A child process whose output goes to a log file in the test's folder."""

    def __init__(self, args: List[str], log: Path, what: str) -> None:
        self.args, self.log, self.what = args, log, what
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def kill(self, sig: str = "KILL") -> None:
        if self.proc and self.proc.poll() is None:
            if sig == "KILL":
                self.proc.kill()
            else:
                self.proc.terminate()
            self.proc.wait(timeout=30)


class Providers(Process):
    """The travel providers over HTTP, with their ledger in ``folder``."""

    def __init__(self, folder: Path, extra: List[str]) -> None:
        self.port = free_port()
        self.ledger = folder / "ledger.sqlite"
        super().__init__(
            [PROVIDERS_BIN, "--listen", f"127.0.0.1:{self.port}", "--ledger", str(self.ledger), *extra],
            folder / "providers.log",
            "travel-providers",
        )
        self.start()
        _healthy(f"http://127.0.0.1:{self.port}/healthz", self.proc, self.what, self.log)

    def effects(self, prefix: str = "") -> List[str]:
        """provider.operation of every effect in the ledger (of keys starting with prefix), sorted."""
        doc = json.loads(subprocess.run([LEDGER_BIN, str(self.ledger), "--json"], check=True,
                                        capture_output=True, text=True).stdout)
        return sorted(f"{e['provider']}.{e['operation']}" for e in doc["effects"]
                      if e["idempotency_key"].startswith(prefix))

    def ledger_json(self) -> Dict:
        return json.loads(subprocess.run([LEDGER_BIN, str(self.ledger), "--json"], check=True,
                                         capture_output=True, text=True).stdout)

    def clean(self) -> bool:
        """travel-ledger --check: no effect applied twice."""
        return subprocess.run([LEDGER_BIN, str(self.ledger), "--check"], capture_output=True).returncode == 0


def tools_file(folder: Path, providers_port: int) -> Path:
    """The travel tools file pointed at the providers: every booking names its
    undo (for open sagas), and payments.charge is previewed and waits for a
    person (two-phase, human approval)."""
    src = (SOURCE_DIR / "examples/travel_booking/tools.http.json").read_text()
    doc = json.loads(src.replace("http://127.0.0.1:8091", f"http://127.0.0.1:{providers_port}"))
    for t in doc["tools"]:
        if t["name"] in OPEN_COMPENSATIONS and "compensate" not in t:
            t["compensate"] = OPEN_COMPENSATIONS[t["name"]]
        if t["name"] == "payments.charge":
            t["two_phase"] = True
            t["approval"] = "human"
    path = folder / "tools.json"
    path.write_text(json.dumps(doc, indent=2))
    return path


def auth_file(folder: Path) -> Dict[str, str]:
    """An auth file with one caller per role; returns the tokens by role."""
    tokens = {role: secrets.token_hex(32) for role in ("agent", "other", "approver", "operator")}
    names = {"agent": ("agent-1", "agent"), "other": ("agent-2", "agent"),
             "approver": ("maria", "approver"), "operator": ("ops", "operator")}
    callers = [{"name": names[r][0], "token_sha256": hashlib.sha256(t.encode()).hexdigest(),
                "roles": [names[r][1]]} for r, t in tokens.items()]
    path = folder / "auth.json"
    path.write_text(json.dumps(callers))
    path.chmod(0o600)
    tokens["file"] = str(path)
    return tokens


class Server(Process):
    """`idem serve` on a free loopback port, journal in ``folder``; ``kill``
    (SIGKILL) and ``start_and_wait`` again on the same port and journal."""

    def __init__(self, folder: Path, tools: Path, auth: Optional[str], workers: int = 2) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        args = [IDEM_BIN, "--store", str(folder / "journal.db"), "serve", "--listen", f"127.0.0.1:{self.port}",
                "--workers", str(workers), "--tools", str(tools)]
        args += ["--auth", auth] if auth else ["--insecure-no-auth"]
        super().__init__(args, folder / "server.log", "idem serve")
        self.start_and_wait()

    def start_and_wait(self) -> None:
        self.start()
        _healthy(f"{self.base_url}/healthz", self.proc, self.what, self.log)


class World:
    """Providers, a server with an auth file, and their folder."""

    def __init__(self, folder: Path, provider_faults: Optional[List[str]] = None) -> None:
        self.folder = folder
        extra: List[str] = []
        for f in provider_faults or []:
            extra += ["--fault", f]
        self.providers = Providers(folder, extra)
        self.tokens = auth_file(folder)
        self.server = Server(folder, tools_file(folder, self.providers.port), self.tokens["file"])

    def close(self) -> None:
        self.server.kill("TERM")
        self.providers.kill("TERM")
