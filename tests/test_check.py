"""`python -m lab.tools.check`, the learner's check before a workshop: `ready` on a set-up machine, and each missing
piece named with its fix."""

import pytest

from lab.tools import check


def test_a_set_up_machine_is_ready_without_the_engine(capsys):
    assert check.main(["--quick"]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[-1] == "ready" and "models: ok" in printed


def test_what_is_missing_is_named_with_its_fix(monkeypatch, capsys):
    import lab.core.model

    monkeypatch.setattr(lab.core.model, "built_model", lambda preset, seed=0: None if preset == "smollm2" else "x")
    monkeypatch.setattr(check, "MEMORY_GB", 10**6)
    assert check.main(["--quick"]) == 1
    printed = capsys.readouterr().out
    assert "models not built: smollm2; run `make setup`" in printed
    assert "GB of memory, the course needs about" in printed and "not ready: 2 thing(s)" in printed


@pytest.mark.engine
def test_the_full_check_runs_one_request_on_the_engine(capsys):
    assert check.main([]) == 0 and "engine: ok" in capsys.readouterr().out
