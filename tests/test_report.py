"""The generated reports: docs/RESULTS.md's Results section and the README's headline and headline results. Their
numbers come from the results files, their tables are those numbers, and each is written only between its
markers. The tests read numbers and tables, not sentences: the wording lives in lab/tools/templates/*.md.j2 and
may change freely."""

import json
import re

import pandas as pd
import pytest

import lab.tools.readme_report
from lab.core.model import ensure_model
from lab.experiments import article
from lab.experiments.block_sizes import block_size_findings, recommend_block_size
from lab.experiments.capacity import CapacityColumns, capacity_frame, capacity_row
from lab.experiments.findings import save_findings
from lab.experiments.results import CANONICAL_DIR, environment, save_results
from lab.tools.findings_report import FINDINGS, findings_section
from lab.tools.readme_report import (
    HEADLINE,
    LESSON_TIMES,
    NOTEBOOKS,
    SUMMARY,
    headline_section,
    lesson_times_section,
    notebooks_section,
    results_context,
    results_section,
    summary_section,
    update_reports,
)
from lab.tools.report_contexts import in_words, lesson, lesson_number, notebook_rows
from lab.tools.runner import all_notebooks


def tables(text: str) -> list[pd.DataFrame]:
    """Every markdown table in `text`, as strings."""
    found = []
    for block in re.findall(r"(?:^\|.*\|\n?)+", text, flags=re.M):
        rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in block.strip().splitlines()]
        found.append(pd.DataFrame(rows[2:], columns=rows[0]))
    return found


def row(table: pd.DataFrame, first: str) -> list[str]:
    return table[table.iloc[:, 0] == first].iloc[0, 1:].tolist()


def test_the_block_size_is_the_largest_the_repeats_do_not_show_slower():
    sweep = pd.DataFrame({"workload": ["a"] * 6 + ["b"] * 6, "block_size": [32, 64, 128] * 4,
                          "mean_ttft_ms": [10.0, 10.4, 12.0, 10.6, 10.5, 12.5, 10.0, 11.0, 9.0, 10.5, 11.5, 9.2],
                          "vllm_hit_rate": 0.5})
    assert recommend_block_size(sweep).to_dict() == {"a": "32 or 64", "b": "128"}


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    env = environment(n_prompts=10, max_tokens=4, block_size=32, online_rate=8.0, online_prompts=5,
                      model=str(ensure_model("tiny")))
    table = pd.DataFrame({"metric": ["mean_ttft_ms", "requests_per_s", "hit_rate"],
                          "cache off": [200.0, 10.0, 0.0], "cache on": [100.0, 15.0, 0.5],
                          "change_%": [-50.0, 50.0, float("nan")]})
    save_results(table, "05_cache_on_vs_off-offline", env)
    save_results(table, "05_cache_on_vs_off-online", env)
    sweep = pd.DataFrame({"workload": ["a"] * 4, "block_size": [32, 64] * 2, "vllm_hit_rate": [0.49, 0.5] * 2,
                          "mean_ttft_ms": [10.0, 10.2, 10.3, 10.1]})
    save_findings(block_size_findings(sweep), "04_block_size_sweep", env)


def test_the_offline_table_shows_ours_beside_the_articles(results):
    offline = tables(results_section())[0]
    assert list(offline.columns) == ["metric", "cache off", "cache on", "change", "article off", "article on",
                                     "article change"]
    assert row(offline, "mean TTFT (ms)") == ["200", "100", "-50%", "2,350", "1,270", "-46%"]
    assert row(offline, "requests/s") == ["10", "15", "+50%", "12.5", "22.8", "+82%"]
    assert row(offline, "token hit rate") == ["0", "0.5", "", "", "", ""]


def test_the_numbers_the_prose_uses(results):
    context = results_context()
    assert context["gain"] == pytest.approx(1.5) and context["hit_rate"] == 0.5 and context["bound"] == pytest.approx(2.0)
    assert context["article_gain"] == pytest.approx(22.8 / 12.5, rel=1e-3)
    assert context["online"]["share_of_offline"] == pytest.approx(0.8), "8 of the 10 requests/s measured without cache"
    assert context["block_sizes"] == {"a": "64"}, "32 and 64 overlap in TTFT, and 64 caches more"
    assert "`tiny` preset" in context["model"] and context["capacity"] is None and context["routing"] is None
    text = results_section()
    for number in ("1.50", "2.00", "1.82", "a 64"):
        assert number in text


def between(text: str, markers: tuple[str, str]) -> str:
    return text.split(markers[0], 1)[1].split(markers[1], 1)[0].strip()


def test_the_headline_is_notebook_05s_ttft_change_beside_the_articles(results):
    text = headline_section()
    for piece in ("200 → 100 ms (-50%)", "2,350 → 1,270 ms (-46%)", "05_cache_on_vs_off-offline-", "0.500"):
        assert piece in text, piece
    summary = summary_section()
    for piece in ("10 → 15 requests/s, x1.50", "x2.00", "x1.82", "200 → 100 ms", "**64**"):
        assert piece in summary, piece
    counts = article.claims().verdict.value_counts()
    assert all(f"{counts.get(v, 0)} {v}" in summary for v in article.VERDICTS), "the ledger's verdicts, counted"


def report_files(tmp_path, monkeypatch) -> tuple:
    readme, results = tmp_path / "README.md", tmp_path / "RESULTS.md"
    cluster = lab.tools.readme_report.CLUSTER
    lessons = lab.tools.readme_report.LESSONS
    readme.write_text(f"intro\n{HEADLINE[0]}\nOLD-CONTENT\n{HEADLINE[1]}\nmiddle\n{SUMMARY[0]}\nOLD-CONTENT\n{SUMMARY[1]}\n"
                      f"{cluster[0]}\nOLD-CONTENT\n{cluster[1]}\n{lessons[0]}\nOLD-CONTENT\n{lessons[1]}\noutro\n")
    results.write_text(f"head\n{NOTEBOOKS[0]}\nSTALE\n{NOTEBOOKS[1]}\nmiddle\n{lab.tools.readme_report.START}\nSTALE\n"
                       f"{lab.tools.readme_report.END}\n{FINDINGS[0]}\nSTALE\n{FINDINGS[1]}\ntail\n")
    monkeypatch.setattr(lab.tools.readme_report, "README", readme)
    monkeypatch.setattr(lab.tools.readme_report, "RESULTS", results)
    for name, marker_pairs in (("TESTING", (lab.tools.readme_report.BENCHMARKS, lab.tools.readme_report.FRESH_RUNS)),
                               ("WORKSHOP", (LESSON_TIMES, lab.tools.readme_report.QUICK_TIMES))):
        copy = tmp_path / f"{name}.md"  # never the repository's own files
        copy.write_text("before\n" + "".join(f"{start}\nold\n{end}\n" for start, end in marker_pairs) + "after\n")
        monkeypatch.setattr(lab.tools.readme_report, name, copy)
    return readme, results


def test_both_files_are_rewritten_only_between_their_markers(results, tmp_path, monkeypatch):
    readme, results_md = report_files(tmp_path, monkeypatch)
    results_md.chmod(0o644)
    update_reports()
    text = readme.read_text()
    assert text.startswith("intro\n") and "\nmiddle\n" in text and text.endswith("outro\n") and "OLD-CONTENT" not in text
    assert between(text, HEADLINE) == headline_section() and between(text, SUMMARY) == summary_section()
    assert "| mean TTFT" not in text, "the tables live in docs/RESULTS.md"
    assert "`23_kv_tier`" in between(text, lab.tools.readme_report.LESSONS), "every lesson in the README's table"
    text = results_md.read_text()
    assert text.startswith("head\n") and text.endswith("tail\n") and "STALE" not in text and "| mean TTFT" in text
    assert between(text, NOTEBOOKS) == notebooks_section() and "\nmiddle\n" in text
    assert between(text, FINDINGS) == findings_section(), "every lesson's findings, from the canonical run"
    assert results_md.stat().st_mode & 0o777 == 0o644, "an atomic rewrite keeps the file's permissions"


@pytest.mark.parametrize("broken", ["README", "RESULTS"])
def test_a_missing_marker_leaves_both_files_as_they_were(results, tmp_path, monkeypatch, broken):
    files = dict(zip(["README", "RESULTS"], report_files(tmp_path, monkeypatch)))
    files[broken].write_text(files[broken].read_text().replace(":end -->", " -->"))
    before = {name: path.read_text() for name, path in files.items()}
    with pytest.raises(SystemExit, match="markers"):
        update_reports()
    assert {name: path.read_text() for name, path in files.items()} == before
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"], "no temporary file left"


@pytest.mark.repo
def test_the_figures_are_linked_from_docs(results):
    links = re.findall(r"\]\(([^)]+\.png)\)", results_section())
    assert links and all(link.startswith("../figures/") for link in links), links


@pytest.mark.repo
def test_the_committed_reports_are_what_the_canonical_results_render(monkeypatch):
    """README.md and docs/RESULTS.md hold what `LAB_RESULTS_DIR=data/reference/results python -m
    lab.tools.readme_report` writes: a hand edit between the markers, or a template or canonical result changed
    without regenerating, fails here."""
    ensure_model("tiny")
    monkeypatch.setenv("LAB_RESULTS_DIR", str(CANONICAL_DIR))
    root = lab.tools.readme_report.PROJECT_ROOT
    readme, results_md = (root / "README.md").read_text(), (root / "docs" / "RESULTS.md").read_text()
    context = results_context()
    assert between(readme, HEADLINE) == lab.tools.readme_report.render("headline.md.j2", context)
    assert between(readme, SUMMARY) == lab.tools.readme_report.render("summary.md.j2", context)
    markers = (lab.tools.readme_report.START, lab.tools.readme_report.END)
    assert between(results_md, markers) == lab.tools.readme_report.render("results.md.j2", context)
    assert between(results_md, NOTEBOOKS) == notebooks_section(), "the notebooks table is every notebook's title cell"


@pytest.mark.repo
def test_every_generated_part_of_the_four_reports_is_as_rendered(monkeypatch, tmp_path):
    """README.md, docs/RESULTS.md, docs/TESTING.md and WORKSHOP.md are what `readme_report` writes from the
    canonical results, the ledger, the lessons and the executed copies: rendering them again changes nothing (the
    lessons table, the times and the fresh-clone runs included)."""
    ensure_model("tiny")
    monkeypatch.setenv("LAB_RESULTS_DIR", str(CANONICAL_DIR))
    committed = {name: getattr(lab.tools.readme_report, name) for name in ("README", "RESULTS", "TESTING", "WORKSHOP")}
    for name, path in committed.items():
        (tmp_path / path.name).write_text(path.read_text())
        monkeypatch.setattr(lab.tools.readme_report, name, tmp_path / path.name)
    lab.tools.readme_report.update_reports()
    for path in committed.values():
        assert (tmp_path / path.name).read_text() == path.read_text(), f"{path.name}: run lab.tools.readme_report"


@pytest.mark.repo
def test_the_workshops_lesson_times_are_the_executed_copies_own(tmp_path):
    import json

    for name, seconds, stale in (("00_quickstart", 52.4, False), ("01_block_hashing", 19.6, True)):
        lab_meta = {"run": f"{name}-full-20261202T000000", "profile": "full", "ok": True} | ({"stale": {}} if stale else {})
        (tmp_path / f"{name}.ipynb").write_text(json.dumps(
            {"cells": [], "metadata": {"papermill": {"duration": seconds}, "lab": lab_meta}}))
    text = lesson_times_section(tmp_path)
    assert "72 s in all" in text and re.search(r"`00_quickstart`\s*\|\s*52\s*\|", text), text
    assert "`01_block_hashing-full-20261202T000000` (its lesson changed since)" in text
    assert "`00_quickstart-full-20261202T000000` " in text and "00_quickstart-full-20261202T000000` (its" not in text


def test_the_notebooks_table_is_every_notebook_and_its_title_cell():
    """docs/RESULTS.md's table of notebooks lists what the runner runs, in order, each with the title and the
    question of its own first cell: a notebook added, split or renamed changes the table."""
    table = tables(notebooks_section())[0]
    assert [re.search(r"`(\w+)`", cell)[1] for cell in table.notebook] == [p.stem for p in all_notebooks()]
    first = row(table, "[`00_quickstart`](lessons/00_quickstart.ipynb)")
    assert first[0].startswith("Quickstart") and first[1].endswith("?"), first


def test_a_notebooks_title_cell_is_read_and_a_pipe_kept_in_its_cell(tmp_path):
    import nbformat

    def notebook(name: str, first_cell: str):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(first_cell)])
        nbformat.write(nb, tmp_path / name)
        return tmp_path / name

    good = notebook("07_a_b.ipynb", "# 07 · A | B\n\n**The question.** Does it\nwrap?\n\n**Predict.** x")
    assert notebook_rows([good]).iloc[0].tolist() == ["`07_a_b`", "A \\| B", "Does it wrap?"]
    with pytest.raises(ValueError, match="The question"):
        notebook_rows([notebook("08_c.ipynb", "# 08 · C\n\nno question here")])


def test_a_lesson_is_named_from_its_results_file():
    assert lesson("16_gain_vs_hit_rate-implied_hit_rate-20261201T203216") == "16_gain_vs_hit_rate"
    assert lesson("18_model_size-20261202T014717") == "18_model_size" and lesson_number("12_fleet_simulator-sim") == "12"
    with pytest.raises(ValueError):
        lesson("bench_audit-100000-20261202T014914")
    assert (in_words(4), in_words(12)) == ("four", "12")


@pytest.mark.repo
def test_the_readme_is_a_front_door():
    """Short; names the test command and the main job; its course map lists every notebook on disk."""
    root = lab.tools.readme_report.PROJECT_ROOT
    readme = (root / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "`make test` is the test command" in readme and "`make run` the main job" in readme
    mapped = set(re.findall(r"^\| `(\d\d_\w+)` \|", readme, flags=re.M))
    assert {p.stem for p in (root / "notebooks").glob("[0-9][0-9]_*.ipynb")} <= mapped
    for doc in ("docs/RESULTS.md", "docs/TESTING.md", "WORKSHOP.md", "docs/ARCHITECTURE.md"):
        assert f"]({doc}" in readme and (root / doc).is_file(), doc
    executed = re.findall(r"\]\((docs/lessons/\d\d_\w+\.ipynb)\)", readme)
    assert set(executed) == {f"docs/lessons/{n}.ipynb" for n in mapped}, "every lesson links its executed copy"
    assert all((root / link).is_file() for link in executed), "and the copy is there"


def test_the_capacity_section_comes_from_the_capacity_results(results):
    env = environment(notebook="17_capacity", gain_prompts=8, prompt_tokens=512, block_size=32, rates=[4, 16],
                      seconds_per_rate=1.5, target_factor=3, zero_hit_pairs=2, zero_hit_prompts=8,
                      article_1000_hit_rate=0.845)
    save_results(pd.DataFrame({"shared_fraction": [0.0, 0.9], "hit_rate": [0.0, 0.8], "bound": [1.0, 5.0],
                               "throughput_gain": [1.0, 3.0], "ttft_change": [0.0, -0.6]}), "16_gain_vs_hit_rate-gain", env)
    save_results(pd.DataFrame({"model": ["measured here", "A100 projection"], "x": [0.6, 0.46], "y": [0.66, 0.47]}),
                 "16_gain_vs_hit_rate-implied_hit_rate", env)
    custom = capacity_row("custom", {"off": 4.0, "on": 16.0}, {"off": 100.0, "on": 50.0}, target_ms=300.0,
                          hit_rate=0.7)
    save_results(capacity_frame([custom]).reset_index(), "17_capacity-capacity", env)
    save_results(pd.DataFrame({"dataset": ["custom"] * 4, "caching": ["off", "off", "on", "on"],
                               "request_rate": [4, 16] * 2, "p99_ttft_ms": [200, 900, 100, 250]}), "17_capacity-sweep", env)
    save_results(pd.DataFrame({"pair": [0, 0, 1, 1], "caching": ["off", "on", "on", "off"],
                               "requests_per_s": [10.0, 10.3, 9.5, 10.0], "ratio": [0.99] * 4, "low": [0.95] * 4,
                               "high": [1.03] * 4}), "16_gain_vs_hit_rate-zero_hit", env)
    capacity = results_context()["capacity"]
    assert (capacity["implied_low"], capacity["implied_high"]) == (0.46, 0.66)
    assert (capacity["zero_ratio"], capacity["zero_low"], capacity["zero_high"]) == (0.99, 0.95, 1.03)
    curve, cap = tables(results_section())[2:4]
    assert row(curve, "0.9") == ["0.8", "5", "3", "-60%"]
    assert row(cap, "custom") == ["300", "4-16", ">= 16", "4.00x", "0.7", "3.33"], "met at 4, missed at 16; on never missed"
    assert "../figures/16_gain_vs_hit_rate-gain_vs_hit_rate.png" in results_section()
    assert "What the article's gain implies** (`16`)" in summary_section(), "the lesson of the implied hit rate's file"
    assert "the pairs' ratios 0.950-1.030 against no change 1.000: the pairs lie on both sides" in results_section(), \
        "the zero-hit verdict is the pairs' own: one above one, one below, so the run cannot tell"


def test_a_capacity_column_is_renamed_in_one_place(results, monkeypatch):
    """The notebook writes the capacity table with capacity_row, the report reads it by CapacityColumns: renaming a
    column there renames it everywhere, and the report's numbers stay."""
    monkeypatch.setattr(CapacityColumns, "OFF", "capacity without caching (req/s)")
    monkeypatch.setattr(CapacityColumns, "RATIO", "on / off")
    env = environment(notebook="17_capacity", gain_prompts=8, prompt_tokens=512, block_size=32, rates=[4, 16],
                      seconds_per_rate=1.5, target_factor=3, zero_hit_pairs=2, zero_hit_prompts=8,
                      article_1000_hit_rate=0.845)
    save_results(pd.DataFrame({"shared_fraction": [0.0], "hit_rate": [0.0], "bound": [1.0], "throughput_gain": [1.0],
                               "ttft_change": [0.0]}), "16_gain_vs_hit_rate-gain", env)
    save_results(pd.DataFrame({"model": ["measured here"], "x": [0.5]}), "16_gain_vs_hit_rate-implied_hit_rate", env)
    save_results(pd.DataFrame({"pair": [0, 0], "caching": ["off", "on"], "requests_per_s": [10.0, 10.0], "ratio": [1.0] * 2,
                               "low": [0.9] * 2, "high": [1.1] * 2}), "16_gain_vs_hit_rate-zero_hit", env)
    table = capacity_frame([capacity_row("custom", {"off": 4.0, "on": 16.0}, {"off": 100.0, "on": 50.0},
                                         target_ms=300.0, hit_rate=0.7)]).reset_index()
    assert "capacity without caching (req/s)" in table.columns and "capacity off (req/s)" not in table.columns
    save_results(table, "17_capacity-capacity", env)
    save_results(pd.DataFrame({"dataset": ["custom"] * 2, "caching": ["off", "on"], "request_rate": [4, 16],
                               "p99_ttft_ms": [200, 250]}), "17_capacity-sweep", env)
    cap = tables(results_section())[3]
    assert row(cap, "custom")[1:4] == [">= 4", ">= 16", "4.00x"]


def test_the_verdict_table_counts_the_ledger(results):
    verdicts = tables(results_section())[-1].set_index("verdict")
    counts = article.claims().verdict.value_counts()
    assert {v: int(verdicts.loc[v, "claims"]) for v in article.VERDICTS} == {v: counts.get(v, 0) for v in article.VERDICTS}
    assert sum(int(n) for n in verdicts.claims) == len(article.claims())


def test_the_online_rate_is_the_one_the_arrivals_delivered(results):
    env = environment(n_prompts=10, max_tokens=4, block_size=32, online_rate=8.0, online_prompts=5,
                      model=str(ensure_model("tiny")))
    online = pd.DataFrame({"metric": ["mean_ttft_ms", "offered_rate_per_s"], "cache off": [20.0, 7.0],
                           "cache on": [10.0, 7.0], "change_%": [-50.0, 0.0]})
    save_results(online, "05_cache_on_vs_off-online", env)
    context = results_context()["online"]
    assert context["offered"] and (context["rate"], context["planned"]) == (7.0, 8.0)
    assert context["share_of_offline"] == pytest.approx(0.7)
    assert row(tables(results_section())[1], "arrival rate offered (req/s)") == ["7", "7", "+0%"]


def test_the_routing_section_comes_from_the_routing_results(results):
    env = environment(replicas=2, num_tenants=4, context_tokens=2000, n_requests=24, concurrency=6, kv_blocks=160,
                      sim_requests=100, sweep_seconds=1.5, timed_requests=10000, sim_seeds=10, fault_requests=24,
                      fault_tenants=2, load_zipf=1.0, ttft_model_fixed_ms=33.0, ttft_model_ms_per_token=0.058)
    save_results(pd.DataFrame({"policy": ["round_robin", "cache_aware"], "fleet_hit_rate": [0.49, 0.82],
                               "p50_ttft_ms": [994.0, 526.0], "p99_ttft_ms": [2594.0, 1513.0],
                               "requests_per_replica": ["12/12", "13/11"], "imbalance": [1.0, 1.08]}),
                 "11_routing-policies", env)
    save_results(pd.DataFrame({"shape": ["tenants", "skewed"], "policy": ["round_robin", "round_robin"],
                               "real hit rate": [0.5, 0.6], "sim hit rate": [0.542, 0.58],
                               "hit rate difference": [0.042, -0.02], "real p50 TTFT ms": [900.0, 800.0],
                               "sim p50 TTFT ms": [220.0, 200.0]}), "11_routing-sim_vs_real", env)
    save_results(pd.DataFrame({"replicas": [2, 64, 64], "policy": ["cache_aware", "cache_aware", "round_robin"],
                               "fraction_of_ideal": [1.0, 0.95, 0.02]}), "12_fleet_simulator-sim_sweep", env)
    save_results(pd.DataFrame([{"kill_after_answered": 2, "sent": 24, "answered": 24, "resubmitted": 3, "failed": 0,
                                "router_retried_sends": 6, "extra_prefill_tokens": 2016,
                                "p50_ttft_ms_resubmitted": 1000.0, "p50_ttft_ms_rest": 200.0, "recovery_s": 0.3}]),
                 "13_replica_failure-fault", env)
    save_results(pd.DataFrame([{"share_of_requests": 0.4, "share_of_hits": 0.3}]), "13_replica_failure-rejoin", env)
    save_results(pd.DataFrame({"policy": ["(hashing the trace once)", "round_robin", "kv_cost"], "seconds": [1.0, 4.9, 8.8],
                               "requests": 10000, "replicas": 64}), "12_fleet_simulator-sim_timing", env)
    save_results(pd.DataFrame({"run": ["cold, 1 in flight", "cold, 6 in flight"], "kv_aware hit rate": [0.62, 0.43],
                               "cache_aware hit rate": [0.62, 0.74],
                               "decisions": [16, 16], "credited nothing": [4, 10], "tenants": [4, 4]}),
                 "11_routing-kv_aware", env)
    routing = results_context()["routing"]
    assert routing["timing"] == [{"requests": 10000, "replicas": 64, "router_s": pytest.approx(5.9),
                                  "all_s": pytest.approx(14.7), "policies": 2}], "kv_cost is not vllm-router's"
    assert routing["largest"] == 64 and routing["kept"] == [("cache_aware", 0.95), ("round_robin", 0.02)]
    assert routing["largest_difference"] == 0.042 and routing["faults"]["rejoin"] == [(0.4, 0.3)]
    assert routing["kv"][1] == {"run": "cold, 6 in flight", "nothing": 10, "decisions": 16, "tenants": 4,
                                "kv_rate": 0.43, "cache_rate": 0.74}
    text = results_section()
    policies, agreement, faults = tables(text)[2:5]
    assert row(policies, "cache_aware") == ["0.82", "526", "1,513", "13/11", "1.08"]
    assert row(agreement, "skewed") == ["round_robin", "0.6", "0.58", "-0.02", "800", "200"]
    assert row(faults, "2") == ["24", "24", "3", "6", "2,016", "1,000", "200", "0.3"]
    assert "../figures/11_routing-hit_rate.png" in text
    assert "**Routing** (`12`, simulated, 64 replicas, equally busy tenants" in summary_section(), \
        "the lesson of the simulated sweep's file"
    for number in ("33 ms", "58 ms", "1,000", "40.0%"):  # the TTFT model's two terms, the rejoin's share of requests
        assert number in text, number


def test_the_audit_section_comes_from_the_audit_results(results):
    assert results_context()["audit"] is None, "nothing before notebook 20 has run"
    env = environment(notebook="20_your_workload")
    save_results(pd.DataFrame([
        {"workload": "customer_service", "prompts": 300, "recommended_block_size": 32, "hit_rate": 0.675,
         "radix_hit_rate": 0.688, "projected_throughput_gain": 2.92, "measured_throughput_gain": 2.14,
         "sample_prompts": 24, "projected_sample_throughput_gain": 2.4, "measured_gain_low": 2.05,
         "measured_gain_high": 2.2, "measured_pairs": 3,
         "recommended_policy": "cache_aware --cache-threshold 0.5", "salted_hit_rate": 0.31},
        {"workload": "timestamped", "prompts": 120, "recommended_block_size": 128, "hit_rate": 0.0,
         "hit_rate_after_moving_fields": 0.86, "fields": "Current time: + Request id:"}]), "20_your_workload-audit", env)
    save_results(pd.DataFrame({"stage": ["read and tokenize", "hit rates"], "seconds": [100.0, 50.0]}),
                 "bench_audit-100000", environment(prompts=100000, mean_prompt_tokens=1017.0, seconds=151.0,
                                                   peak_memory_gib=1.29, peak_rss_gib=1.1, peak_total_pss_gib=1.29,
                                                   processes=3, workers=2, explained=5000))
    audit = results_context()["audit"]
    assert audit["bot"] | {"policy": None} == {"prompts": 300, "hit_rate": 0.675, "block_size": 32, "radix_hit_rate": 0.688,
                                               "projected": 2.92, "measured": 2.14, "policy": None, "salted": 0.31,
                                               "sample": 24, "projected_sample": 2.4}
    assert audit["stamped"] == {"fields": "Current time: + Request id:", "hit_rate": 0.0, "after": 0.86}
    assert [run["prompts"] for run in audit["scale"]] == [100000] and audit["scale"][0]["total"] == 151.0
    assert audit["confirmation"] == {"low": 2.05, "high": 2.2, "pairs": 3}
    assert audit["scale"][0]["peak_is"] == "pss", "the peak shown is the sampled PSS of all processes, not this one's"
    text = results_section()
    for number in ("67.5%", "68.8%", "x2.92", "x2.14", "x2.40", "24", "86.0%", "100,000", "151 s", "1.29 GiB", "1.39 GB",
                   "2 processes", "5,000", "three salted/reused pairs", "x2.05-x2.20", "all 3 processes", "1.10 GiB"):
        assert number in text, number


def test_the_why_section_comes_from_notebook_14s_results(results):
    assert results_context()["why"] is None, "nothing before notebook 14 has run"
    checks = pd.DataFrame({"check": ["requests whose cached tokens match"], "lab": [64], "engine": [63], "agree": ["no"]})
    save_results(checks, "14_why_it_missed-reconcile", environment(notebook="14_why_it_missed"))
    validation = pd.DataFrame({"workload": ["chat", "rag_long"], "prompts": [96, 48], "hit_rate": [0.5, 0.6],
                               "naive_bound": [2.0, 2.5], "projected_gain": [1.9, 2.2], "throughput_gain": [1.8, 2.1],
                               "gain_error": [0.056, 0.048], "projected_ttft_change": [-0.3, -0.4],
                               "ttft_change": [-0.31, -0.43], "ttft_error": [0.014, 0.053]})
    save_results(validation, "15_cost_model-projection", environment(cost_model="cost-model-x-cpu-1"))
    why = results_context()["why"]
    assert why["validation"]["worst_gain"] == 0.056 and why["validation"]["worst_ttft"] == 0.053
    text = results_section()
    for piece in ("5.6%", "5.3%", "cost-model-x-cpu-1", "| 64 ", "| no ", "on two workloads"):  # ... and how many
        assert piece in text, piece


def test_the_model_size_section_comes_from_notebook_18s_results(results):
    assert results_context()["size"] is None, "nothing before notebook 18 has run"
    table = pd.DataFrame({"model": ["tiny", "SmolLM2-135M-Instruct", "Llama-2-7B on an A100", "the article"],
                          "parameters": [4458752, 134515008, 6740000000, 6740000000],
                          "source": ["measured here", "measured here", "projected (lab's model)", "the article's figures"],
                          "hit_rate": [0.703, 0.703, 0.703, float("nan")], "bound": [3.37, 3.37, 3.37, float("nan")],
                          "throughput_gain": [3.2, 3.1, 3.07, 1.82], "share_of_bound": [0.95, 0.92, 0.91, float("nan")],
                          "ttft_change": [-0.6, -0.59, -0.67, -0.46], "mean_ttft_ms_off": [700.0, 8000.0, None, None]})
    save_results(table, "18_model_size", environment(notebook="18_model_size"))
    text = results_section()
    sizes = next(t for t in tables(text) if "share_of_bound" in t.columns)
    assert "mean_ttft_ms_off" not in sizes.columns
    assert row(sizes, "SmolLM2-135M-Instruct") == ["134,515,008", "measured here", "0.703", "3.37", "3.1", "0.92", "-0.59"]
    assert row(sizes, "the article") == ["6,740,000,000", "the article's figures", "", "", "1.82", "", "-0.46"]
    assert "18_model_size-" in text, "the run it cites"
    assert "../figures/18_model_size-gain.png" in text


def test_the_ray_benchmark_is_summarised_and_projected_from_its_own_file(tmp_path):
    from lab.tools.benchmark_report import benchmark_rows, cluster_lines, projected_seconds

    assert "Not measured yet" in cluster_lines(tmp_path)
    table = pd.DataFrame({"setup": ["one process, no Ray", "Ray, 1 worker(s)", "Ray, 2 worker(s)"],
                          "workers": [1, 1, 2], "seconds": [250.0, 400.0, 220.0],
                          "read and tokenize (s)": [200.0, 300.0, 160.0], "largest_child_gb": [0.0, 0.9, 0.8],
                          "driver_peak_gb": [1.0, 1.1, 1.2]})
    env = {"device": "a 2-core test machine", "prompts": 1_000_000, "reports_equal": True, "driver_read_s": 10.0,
           "log_bytes": 1e9, "targets": {"speed-up": 1.7, "worker_gb": 2.0}, "code": "abc"}
    table.to_csv(tmp_path / "bench_ray-1000000-20261204T000000.csv", index=False)
    (tmp_path / "bench_ray-1000000-20261204T000000.json").write_text(json.dumps(
        {"name": "bench_ray-1000000", "run_id": "bench_ray-1000000-20261204T000000", "environment": env}))
    (row,) = benchmark_rows(tmp_path).measured
    assert "1 worker 400 s, 2 workers 220 s (x1.82, at least x1.7: met; reading and tokenizing x1.88)" in row
    assert "(at most 2 GB: met; the driver's running peak" in row
    assert "one process without Ray, its tokenizer on every core: 250 s" in row
    # reading 300 s at one worker, at 94% efficiency over 16 workers, plus the other 60 s, both x10
    assert projected_seconds(10_000_000, 16, table, env) == pytest.approx(10 * (300 / (16 * 300 / 320) + 60))
    # with very many workers the driver's raw read (10 s a million) is the bound
    assert projected_seconds(1_000_000, 10_000, table, env) == pytest.approx(10 + 60)
    assert "1,000 MB/s" not in cluster_lines(tmp_path) and "100 MB/s" in cluster_lines(tmp_path)
