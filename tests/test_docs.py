"""The documentation runs: docs/python_api.md's code, docs/graph.md's picture of the live graph."""
import re
import shutil

import pytest

from graph.drawing import graph_markdown, mermaid
from nodes.common import settings_of
from state import Settings
from tests.conftest import EXAMPLES, ROOT


def code_blocks(md: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", md, re.S)


def test_graph_md_is_the_live_graph():
    doc = (ROOT / "docs" / "graph.md").read_text()
    assert doc == graph_markdown(), "docs/graph.md is stale: egg graph --write docs/graph.md"
    (block,) = code_blocks(doc, "mermaid")
    assert block == mermaid().rstrip("\n") + "\n"
    for node in ("planner", "algorithm_designer", "tiler", "memory_optimizer", "verifier",
                 "profiler", "review", "reporter"):
        assert f"\t{node}({node})" in block
    assert "\tverifier -.-> profiler;" in block and "\tplanner -.-> review;" in block


def test_cli_graph_prints_the_same_mermaid(capsys):
    from typer.testing import CliRunner

    from graph import cli

    res = CliRunner().invoke(cli.app, ["graph"])
    assert res.exit_code == 0 and res.output == mermaid() + "\n"


def test_python_api_doc_runs(tmp_path, monkeypatch, capsys):
    """Exactly the lines of docs/python_api.md, in order, in a folder holding examples/."""
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EGG_TIMING_REP_MS", "10")  # interpreter timings mean nothing: keep them short
    blocks = code_blocks((ROOT / "docs" / "python_api.md").read_text(), "python")
    assert len(blocks) == 3
    ns: dict = {}
    exec(compile(blocks[0], "python_api.md#1", "exec"), ns)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "c1 ['_egg_k_g0'] True" and out[1].startswith("ok {'interpreter': True")
    assert (tmp_path / "runs" / "api-demo" / "best.py").exists()
    exec(compile(blocks[1], "python_api.md#2", "exec"), ns)
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(" g0") and int(out[0].split()[0]) >= 10 and out[1] == "c0"
    assert ns["graph"].get_state(ns["cfg"]).next == ()
    exec(compile(blocks[2], "python_api.md#3", "exec"), ns)
    out = capsys.readouterr().out.splitlines()
    assert out == ["['g0']", "edited"]


@pytest.mark.parametrize("how", ["context", "dict", "configurable"])
def test_settings_reach_the_nodes_however_they_are_passed(how):
    from langgraph.graph import END, START, StateGraph
    from langgraph.runtime import Runtime

    from state import EggState

    seen = []

    def node(state: EggState, runtime: Runtime[Settings]):
        seen.append(settings_of(runtime))
        return {}

    g = StateGraph(EggState, context_schema=Settings)
    g.add_node("n", node)
    g.add_edge(START, "n")
    g.add_edge("n", END)
    c = g.compile()
    if how == "context":
        c.invoke({}, context=Settings(trials=3, device="cpu"))
    elif how == "dict":
        c.invoke({}, context={"trials": 3, "device": "cpu"})
    else:
        c.invoke({}, {"configurable": {"trials": 3, "device": "cpu", "thread_id": "t"}})
    assert isinstance(seen[0], Settings) and (seen[0].trials, seen[0].device) == (3, "cpu")
