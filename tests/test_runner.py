import json
import subprocess
import sys

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


# The cell drops its own execute_reply: the kernel goes idle and the client waits for a reply that never comes,
# which is how a stall looks from the client's side (nbclient #312 loses one that did arrive).
DROP_OWN_REPLY = """
kernel = get_ipython().kernel
send = kernel.session.send

def send_all_but_this_reply(stream, msg_or_type, *args, **kwargs):
    if msg_or_type == "execute_reply":
        kernel.session.send = send
        return None
    return send(stream, msg_or_type, *args, **kwargs)

kernel.session.send = send_all_but_this_reply
print("done; the reply will not be sent")
"""


def execute_elsewhere(notebook, out_dir, **limits) -> runner.Outcome:
    """runner.execute in a process of its own: the stalled client's abandoned wait (nbclient's, on the shell
    channel) stays behind in the process, and in this one later broke CPython 3.11's ast.parse at pytest's exit."""
    code = (f"import dataclasses, json; from pathlib import Path; from lab.tools import runner; "
            f"o = runner.execute(Path({str(notebook)!r}), {{}}, Path({str(out_dir)!r}), **{limits!r}); "
            f"print(json.dumps(dataclasses.asdict(o)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=280, check=True)
    return runner.Outcome(**json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.engine
def test_a_stalled_cell_fails_as_stalled_within_its_limit(tmp_path):
    nb = make_notebook(tmp_path / "06_stalls.ipynb", DROP_OWN_REPLY)
    cell_timeout_s = 240
    outcome = execute_elsewhere(nb, tmp_path / "out", cell_timeout_s=cell_timeout_s, stall_s=3)
    assert not outcome.ok and outcome.error.startswith("stalled"), outcome.error
    assert "kernel = get_ipython().kernel" in outcome.error, "the error names the cell by its first line"
    # about 10 s here (kernel start, 3 s stall limit): half the cell timeout leaves a margin of 10x and of 2x
    assert outcome.seconds < cell_timeout_s / 2, "failed at the stall limit, not the cell timeout"
    executed = nbformat.read(tmp_path / "out" / "06_stalls.ipynb", as_version=4)
    assert executed.metadata["lab"]["ok"] is False


@pytest.mark.engine
def test_a_slow_busy_cell_is_not_a_stall(tmp_path):
    nb = make_notebook(tmp_path / "07_slow.ipynb", "import time\ntime.sleep(6)")
    outcome = runner.execute(nb, {}, tmp_path / "out", cell_timeout_s=300, stall_s=1)
    assert outcome.ok, outcome.error


@pytest.mark.engine
def test_the_runner_kernel_is_headless_and_builds_no_widget(tmp_path, monkeypatch):
    monkeypatch.delenv("LAB_HEADLESS", raising=False)
    nb = make_notebook(tmp_path / "08_headless.ipynb",
                       "from lab.front_end import has_front_end\nassert not has_front_end()")
    outcome = runner.execute(nb, {}, tmp_path / "out")
    assert outcome.ok, outcome.error


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
