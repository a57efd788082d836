"""lab.audit.settings: one AuditSettings, built the same by the command line and by `audit()`; bad values refused
before any work, naming the setting; and no engine unless `--confirm N` asks for one."""

import dataclasses
import json
import random

import pytest

import lab.audit.core
import lab.audit.projection
import lab.serving.engine
from lab.audit import AuditSettings, audit
from lab.audit.__main__ import main, parser, settings_from
from lab.audit.settings import SettingsError
from lab.core.prefix_cache import kv_blocks
from lab.experiments.generators import text_of_tokens


class Captured(Exception):
    """Raised in place of reading the log, carrying the settings the audit was run with."""


@pytest.fixture
def captured(monkeypatch):
    def stop(path, tokenizer, *, settings, **read):
        raise Captured(settings)
    monkeypatch.setattr(lab.audit.core, "read_trace", stop)
    monkeypatch.setattr(lab.audit.core, "load_tokenizer", lambda model: None)


def settings_of(run) -> AuditSettings:
    with pytest.raises(Captured) as raised:
        run()
    return raised.value.args[0]


@pytest.mark.parametrize("argv, keywords", [
    ([], {}),
    (["--kv-tokens", "40000", "--replicas", "2", "--block-sizes", "32", "16", "--confirm", "8", "--skip-bad"],
     {"kv_tokens": 40_000, "replicas": 2, "block_sizes": [32, 16], "confirm": 8, "skip_bad": True}),
    (["--explained", "300", "--field-sample", "100", "--output-tokens", "4", "--workers", "2", "--model", "m"],
     {"explained": 300, "field_sample": 100, "output_tokens": 4, "workers": 2, "model": "m"}),
])
def test_the_command_line_and_audit_build_the_same_settings(captured, argv, keywords):
    from_cli = settings_of(lambda: main(["log.jsonl", *argv]))
    assert from_cli == settings_of(lambda: audit("log.jsonl", **keywords))
    assert from_cli == settings_of(lambda: audit("log.jsonl", AuditSettings(**keywords)))
    assert from_cli == AuditSettings(**keywords)


def test_the_command_lines_defaults_are_the_settings_defaults():
    args = parser().parse_args(["log.jsonl"])
    assert settings_from(args) == AuditSettings()
    flags = {f.name for f in dataclasses.fields(AuditSettings)} - {"progress", "workers"}
    assert {name: getattr(args, name) for name in flags} == {name: getattr(AuditSettings(), name) for name in flags}
    assert args.workers is None, "--workers unset: one reader, or every core with --ray"
    assert AuditSettings().confirm == 0, "no engine unless asked"


def test_the_old_flag_for_the_sample_still_works_and_says_it_is_deprecated(captured, capsys):
    assert settings_of(lambda: main(["log.jsonl", "--explain", "300"])).explained == 300
    assert "--explain is deprecated, use --explained" in capsys.readouterr().err


def test_overrides_replace_fields_of_given_settings(captured):
    base = AuditSettings(kv_tokens=40_000, replicas=2)
    assert settings_of(lambda: audit("log.jsonl", base, replicas=3)) == AuditSettings(kv_tokens=40_000, replicas=3)


@pytest.mark.parametrize("keywords, message", [
    ({"replicas": 0}, r"replicas=0 must be a positive whole number, e.g. 4"),
    ({"kv_tokens": 1.5}, r"kv_tokens=1.5 must be a positive whole number"),
    ({"explained": -1}, r"explained=-1 must be"),
    ({"confirm": -2}, r"confirm=-2 must be a whole number of prompts .*0: no engine"),
    ({"workers": True}, r"workers=True must be"),
    ({"block_sizes": 32}, r"block_sizes=32 must be a list of block sizes, e.g. \[16, 32\]"),
    ({"block_sizes": []}, r"block_sizes=\[\] names no size"),
    ({"block_sizes": [32, 0]}, r"block_sizes=\[32, 0\] holds 0: each must be a positive whole number"),
    ({"skip_bad": "yes"}, r"skip_bad='yes' must be True or False"),
    ({"model": 3}, r"model=3 must be a local model directory"),
])
def test_a_bad_setting_is_refused_naming_it_and_what_would_work(keywords, message):
    with pytest.raises(SettingsError, match=message) as raised:
        AuditSettings(**keywords)
    assert raised.value.name == next(iter(keywords))
    with pytest.raises(SettingsError, match=message):
        audit("never-read.jsonl", **keywords)


def test_an_unknown_setting_names_the_settings_there_are():
    with pytest.raises(TypeError, match=r"unknown audit setting fleet_sample; fleet_sample is now explained; "
                                        r"the settings are block_sizes, confirm, explained"):
        audit("never-read.jsonl", fleet_sample=100)
    with pytest.raises(TypeError, match=r"settings=\{'replicas': 2\} must be an AuditSettings"):
        audit("never-read.jsonl", {"replicas": 2})


def test_the_command_line_names_the_flag_of_a_bad_value(capsys):
    assert main(["log.jsonl", "--replicas", "0"]) == 2
    assert "error: --replicas: replicas=0 must be a positive whole number" in capsys.readouterr().err
    assert main(["log.jsonl", "--block-sizes", "0"]) == 2
    assert "error: --block-sizes: block_sizes=[0] holds 0" in capsys.readouterr().err


def test_block_sizes_are_kept_once_each_in_the_order_given():
    assert AuditSettings(block_sizes=[32, 16, 32]).block_sizes == (32, 16)
    assert AuditSettings(block_sizes=(32, 16)) == AuditSettings(block_sizes=[32, 16])


def test_a_kv_capacity_below_one_block_still_holds_one():
    assert [kv_blocks(t, 16) for t in (0, 15, 16, 100)] == [1, 1, 1, 6]


def test_a_plain_command_line_audit_starts_no_engine(tmp_path, monkeypatch, capsys):
    def no_engine(*args, **kwargs):
        raise AssertionError("an engine was started without --confirm")
    monkeypatch.setattr(lab.serving.engine, "start_llm", no_engine)
    monkeypatch.setattr(lab.audit.projection, "confirm_on_engine", no_engine)
    rng = random.Random(0)
    shared = text_of_tokens(rng, 200, "policy")
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"prompt": f"{shared}\nQuestion {i}: {text_of_tokens(rng, 20, 'all')}"}) + "\n"
                           for i in range(12)))
    assert main([str(log), "--replicas", "2", "--block-sizes", "32", "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    assert "measured on the engine" not in out and "wrote " in out
    saved = json.loads(next((tmp_path / "report").glob("*.json")).read_text())
    assert saved["confirmation"] is None and saved["explained"] == 12
