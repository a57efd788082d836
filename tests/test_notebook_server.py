"""lab.tools.notebook_server (what `make lab` runs): a taken port or a missing folder is named before anything starts."""

import socket

import pytest

from lab.tools.notebook_server import JupyterLab, main


def test_a_taken_port_says_what_to_do(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf"port {port} is already in use .* LAB_PORT=NNNN"):
            JupyterLab(port=port)
        assert main(["--port", str(port), "--no-browser"]) == 1
    assert f"JupyterLab could not start: port {port} is already in use" in capsys.readouterr().err


def test_a_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder of notebooks"):
        JupyterLab(root=tmp_path / "nowhere")


def test_the_address_carries_the_token():
    lab = JupyterLab(port=None)
    lab.port = 8899
    assert lab.url("00_quickstart.ipynb") == f"http://127.0.0.1:8899/lab/tree/00_quickstart.ipynb?token={lab.token}"
    assert len(lab.token) == 32 and JupyterLab().token != lab.token, "a fresh token per start"
    assert lab.url("01_block_hashing.ipynb", workspace="nb02") == \
        f"http://127.0.0.1:8899/lab/workspaces/nb02/tree/01_block_hashing.ipynb?token={lab.token}&reset"
