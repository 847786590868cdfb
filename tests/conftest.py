"""Shared test setup. TRITON_INTERPRET must be set before any kernel module is imported."""
import os
import pathlib
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("EGG_DEVICE", "cpu")
os.environ.setdefault("LANGGRAPH_CLI_NO_ANALYTICS", "1")
os.environ.setdefault("LANGGRAPH_NO_VERSION_CHECK", "true")
os.environ.setdefault("LANGSMITH_TRACING", "false")

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

from harness.interpreter import install_shims  # noqa: E402

# in-process kernels run on the interpreter as the candidate process runs them (harness.interpreter)
install_shims()

EXAMPLES = ROOT / "examples"

#: modules whose tests share a module-scoped fixture that is expensive to build (a pool of
#: verifications started at once, a LangGraph server, a recorded run): under pytest-xdist each
#: stays on one worker (``--dist loadgroup``, pyproject.toml), so the fixture is built once
SHARED_FIXTURE_MODULES = {"test_verifier_suite", "test_sandbox", "test_studio", "test_llm_run",
                          "test_time_travel"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        mod = item.module.__name__.rsplit(".", 1)[-1] if getattr(item, "module", None) else ""
        if mod in SHARED_FIXTURE_MODULES:
            item.add_marker(pytest.mark.xdist_group(mod))


@pytest.fixture
def write_problem(tmp_path):
    """Write a KernelBench-format problem from source text; returns its path."""

    def _write(source: str, name: str = "problem") -> pathlib.Path:
        p = tmp_path / f"{name}.py"
        p.write_text(source)
        return p

    return _write
