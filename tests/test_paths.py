"""lab.paths: one home for every output folder and the variable that moves it, read when asked."""

import pytest

from lab import PROJECT_ROOT
from lab.experiments.plots import figures_dir
from lab.experiments.results import results_dir
from lab.paths import FOLDERS, folder


def test_a_variable_set_after_import_moves_the_folder(tmp_path, monkeypatch):
    for name, (variable, default) in FOLDERS.items():
        monkeypatch.delenv(variable, raising=False)
        assert folder(name, create=False) == PROJECT_ROOT / default
        monkeypatch.setenv(variable, str(tmp_path / name))
        assert folder(name) == tmp_path / name and (tmp_path / name).is_dir()
    assert results_dir() == tmp_path / "results" and figures_dir() == tmp_path / "figures"


def test_an_unknown_folder_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match=r"'logs' is not one of the lab's: \['audit', 'figures'"):
        folder("logs")
