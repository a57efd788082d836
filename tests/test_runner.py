import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from lab.tools import runner


def make_notebook(path, body):
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    params = new_code_cell("answer = 1")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, new_code_cell(body)]
    nbformat.write(nb, path)
    return path


@pytest.mark.engine
def test_execute_injects_parameters_and_reports_success(tmp_path):
    nb = make_notebook(tmp_path / "01_ok.ipynb", "assert answer == 42")
    outcome = runner.execute(nb, {"answer": 42}, tmp_path / "out")
    assert outcome.ok, outcome.error
    assert (tmp_path / "out" / "01_ok.ipynb").is_file()


@pytest.mark.engine
def test_each_run_is_named_and_the_executed_notebook_records_it(tmp_path, monkeypatch):
    """The kernel sees the run's name (its results and figures record it); the executed copy says which run it
    was and whether every cell ran, which is what `make promote` reads."""
    monkeypatch.setenv("LAB_PROFILE", "full")
    good = make_notebook(tmp_path / "03_named.ipynb", "import os\nprint(os.environ['LAB_RUN_ID'])")
    bad = make_notebook(tmp_path / "04_fails.ipynb", "raise ValueError('no')")
    assert runner.execute(good, {}, tmp_path / "out").ok and not runner.execute(bad, {}, tmp_path / "out").ok
    executed = nbformat.read(tmp_path / "out" / "03_named.ipynb", as_version=4)
    run = executed.metadata["lab"]["run"]
    assert run.startswith("03_named-full-") and executed.metadata["lab"]["ok"] is True
    assert run in executed.cells[-1].outputs[0]["text"], "the kernel saw the same name"
    assert nbformat.read(tmp_path / "out" / "04_fails.ipynb", as_version=4).metadata["lab"]["ok"] is False
    assert "LAB_RUN_ID" not in __import__("os").environ, "the name belongs to that run only"


@pytest.mark.engine
def test_execute_reports_a_failing_cell(tmp_path):
    nb = make_notebook(tmp_path / "02_bad.ipynb", "assert answer == 42, 'wrong answer'")
    outcome = runner.execute(nb, {}, tmp_path / "out")
    assert not outcome.ok and "wrong answer" in outcome.error
    table = runner.summary([outcome])
    assert "FAILED" in table and "0 ok, 1 failed" in table


@pytest.mark.engine
def test_a_cell_that_outlives_its_timeout_fails_the_notebook(tmp_path):
    nb = make_notebook(tmp_path / "05_hangs.ipynb", "import time\ntime.sleep(60)")
    outcome = runner.execute(nb, {}, tmp_path / "out", cell_timeout_s=2)
    assert not outcome.ok and outcome.seconds < 50
    assert "timed out" in outcome.error.lower() or "timeout" in outcome.error.lower(), outcome.error


def test_unknown_notebook_names_the_known_ones():
    with pytest.raises(SystemExit, match=r"'99_nope' not found.*00_quickstart"):
        runner.resolve_notebooks(["99_nope"])


def test_unknown_profile_exits_nonzero(capsys):
    with pytest.raises(SystemExit) as exit_info:
        runner.main(["--profile", "nope"])
    assert exit_info.value.code == 2
    assert "choose one of" in capsys.readouterr().err


def test_parameter_overrides_are_parsed_as_yaml():
    parser = runner.argparse.ArgumentParser()
    assert runner.parse_overrides(["block_size=64", "model=/m/llama", "quick=true"], parser) == {
        "block_size": 64, "model": "/m/llama", "quick": True}
    with pytest.raises(SystemExit):
        runner.parse_overrides(["no-equals-sign"], parser)
