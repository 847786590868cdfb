"""scripts/mutants.py: every named mutant still applies to the code (a refactor that removes a
snippet fails here, loudly, instead of the mutant vanishing), and the harness applies a mutant
in a copy of the repository, never in the working tree, telling killed from survived."""
import pathlib

from tests.helpers import load_script

M = load_script("scripts/mutants.py")
ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_mutant_applies_exactly_once():
    gone = {m.name: why for m in M.MUTANTS if (why := M.applies(m, ROOT))}
    assert gone == {}, f"re-target these snippets in scripts/mutants.py: {gone}"


def test_the_table_is_well_formed():
    names = [m.name for m in M.MUTANTS]
    assert len(names) == len(set(names))
    for m in M.MUTANTS:
        assert m.tests and m.why and m.original != m.replacement, m.name
        for t in m.tests:
            assert (ROOT / t.split("::")[0]).is_file(), f"{m.name}: {t}"


def test_a_mutant_is_applied_in_a_copy_killed_or_survived(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text("def double(x):\n    return 2 * x\n")
    (repo / "tests" / "test_strong.py").write_text(
        "from calc import double\n\ndef test_double():\n    assert double(3) == 6\n")
    (repo / "tests" / "test_weak.py").write_text(
        "from calc import double\n\ndef test_runs():\n    double(3)\n")
    before = (repo / "calc.py").read_text()
    files = M.repo_files(repo)
    assert files == ["calc.py", "tests/test_strong.py", "tests/test_weak.py"]

    def mutant(tests, original="return 2 * x"):
        return M.Mutant("m", "calc.py", original, "return 3 * x", tests, "wrong")

    killed = M.run_mutant(mutant(("tests/test_strong.py",)), repo, files, 120)
    assert killed["status"] == "killed" and "test_double" in killed["detail"], killed
    survived = M.run_mutant(mutant(("tests/test_weak.py",)), repo, files, 120)
    assert survived["status"] == "survived", survived
    gone = M.run_mutant(mutant(("tests/test_strong.py",), "return x + x"), repo, files, 120)
    assert gone["status"] == "no longer applies"
    assert (repo / "calc.py").read_text() == before  # the working tree is never touched
