"""`langgraph dev` serves the graph `egg` offline (what LangGraph Studio talks to): the drawn
graph, the input/output/context schemas, and runs through the REST API, review included."""
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from graph.build import ROLE_NODES, graph as live_graph
from state import EggState
from tests.conftest import EXAMPLES, ROOT
from tests.run_helpers import TINY

OFFLINE = {"LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGGRAPH_NO_VERSION_CHECK": "true",
           "LANGSMITH_TRACING": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Api:
    def __init__(self, base: str):
        self.base = base

    def __call__(self, method: str, path: str, body=None, timeout=300):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"null")


def _sockets_of(pid: int) -> set[str]:
    inodes = set()
    for fd in pathlib.Path(f"/proc/{pid}/fd").iterdir():
        try:
            t = os.readlink(fd)
        except OSError:
            continue
        if t.startswith("socket:["):
            inodes.add(t[8:-1])
    return inodes


def _family(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        for kids in pathlib.Path(f"/proc/{p}/task").glob("*/children"):
            todo += [int(k) for k in kids.read_text().split()]
    return pids


def _remote_addresses(pid: int) -> list[str]:
    """Remote ends of the TCP sockets of the process and its children, from /proc (Linux)."""
    inodes = set().union(*(_sockets_of(p) for p in _family(pid)))
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in pathlib.Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[9] in inodes:
                out.append(f[2])
    return out


def _is_local(addr: str) -> bool:
    host = addr.split(":")[0]
    if len(host) == 8:  # IPv4, little-endian hex
        return host in ("00000000", "0100007F")
    return host in ("0" * 32, "0" * 31 + "1", "0000000000000000FFFF00000100007F")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("studio") / "langgraph-dev.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EGG_") and k != "TRITON_INTERPRET"}
    env.update(OFFLINE, PYTHONPATH=str(ROOT))  # the run's device comes from the run's context
    with open(log, "w") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "langgraph_cli", "dev", "--no-browser", "--no-reload",
             "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT)
    api = Api(f"http://127.0.0.1:{port}")
    try:
        deadline = time.time() + 90
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                api("GET", "/ok", timeout=2)
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                assert time.time() < deadline, "langgraph dev did not start: " + log.read_text()[-3000:]
                time.sleep(0.2)
        yield api, proc, log
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def assistant(server):
    api, _, _ = server
    found = api("POST", "/assistants/search", {"graph_id": "egg"})
    assert len(found) == 1 and found[0]["graph_id"] == "egg"
    return found[0]["assistant_id"]


def test_graph_is_drawn_with_the_real_edges(server, assistant):
    api, _, _ = server
    g = api("GET", f"/assistants/{assistant}/graph")
    nodes = {n["id"] for n in g["nodes"]}
    assert set(ROLE_NODES) <= nodes and {"review", "reporter", "__start__", "__end__"} <= nodes
    edges = {(e["source"], e["target"]) for e in g["edges"]}
    want = {(e.source, e.target) for e in live_graph.get_graph().edges}
    assert edges == want
    assert {("verifier", "profiler"), ("verifier", "algorithm_designer"), ("profiler", "tiler"),
            ("tiler", "memory_optimizer"), ("planner", "review")} <= edges


def test_schemas_are_the_typed_input_output_and_settings(server, assistant):
    api, _, _ = server
    s = api("GET", f"/assistants/{assistant}/schemas")
    assert s["input_schema"]["title"] == "EggInput"
    assert set(s["input_schema"]["properties"]) == {"problem_path", "problem_source"}
    assert s["output_schema"]["title"] == "EggOutput"
    assert {"best_id", "report", "error"} <= set(s["output_schema"]["properties"])
    ctx = s["context_schema"]["properties"]
    assert {"device", "policy", "trials", "review", "max_attempts_algorithm"} <= set(ctx)
    assert ctx["device"]["enum"] == ["auto", "cpu", "cuda"] and ctx["trials"]["description"]


def test_run_through_the_rest_api(server, assistant):
    api, proc, log = server
    thread = api("POST", "/threads", {})["thread_id"]
    out = api("POST", f"/threads/{thread}/runs/wait", {
        "assistant_id": "egg",
        "input": {"problem_path": str((EXAMPLES / "bias_gelu_scale.py").resolve())},
        "context": {"device": "cpu", "trials": 1, "timing_rep_ms": 10}})
    assert out["report"]["status"] == "ok", out
    assert out["best_id"] == "c1" and out["report"]["kernels"] == ["_egg_k_g0"]
    assert out["report"]["device"] == "cpu" and out["report"]["timing"]["interpreter"] is True
    state = api("GET", f"/threads/{thread}/state")
    st = EggState.model_validate(state["values"])
    from harness.trials import plan

    v = st.verification("c1")
    assert v.passed and v.trials == len(v.trial_log) >= len(plan(1)) - 2
    hist = api("POST", f"/threads/{thread}/history", {"limit": 50})
    assert len(hist) >= 10
    text = log.read_text()
    assert "unregistered type" not in text and "Traceback" not in text
    # offline: the server's TCP sockets talk to this machine only
    remote = _remote_addresses(proc.pid)
    assert remote and all(_is_local(a) for a in remote), remote


def test_review_from_the_rest_api_with_the_problem_source(server, assistant):
    """What a Studio user does: paste the source, turn review on, answer the interrupt."""
    api, _, _ = server
    thread = api("POST", "/threads", {})["thread_id"]
    api("POST", f"/threads/{thread}/runs/wait", {
        "assistant_id": "egg", "input": {"problem_source": TINY},
        "context": {"device": "cpu", "review": True}})
    state = api("GET", f"/threads/{thread}/state")
    assert state["next"] == ["review"]
    req = state["tasks"][0]["interrupts"][0]["value"]
    assert req["kind"] == "plan_review" and [g["id"] for g in req["plan"]["groups"]] == ["g0"]
    out = api("POST", f"/threads/{thread}/runs/wait", {
        "assistant_id": "egg", "command": {"resume": {"action": "edit", "disable": ["g0"]}},
        "context": {"device": "cpu", "review": True}})
    assert out["report"]["status"] == "ok" and out["best_id"] == "c0" and out["report"]["fallback"]
    st = EggState.model_validate(api("GET", f"/threads/{thread}/state")["values"])
    assert st.plan.reviewed == "edited" and st.problem.name.startswith("problem")
