"""Notebook 05's paper profile rehearsed (issue 51): the dry-run configuration is the paper's with sizes cut and every
code-path switch kept; ``MODEL_PATH`` is checked before anything loads (missing path, file, folder without
config.json, another architecture, no weights) and names the parameter, the file, the field and the fix; every cached
step is keyed by the model folder's content; the scorecard (which tasks the model is usable on) is measured on the
run's own model with the committed scorecard's rule, so the claims decide a user's model with the CPU profiles' rules
instead of calling it "outside the regime" by design; and the dry run itself runs end to end on the stand-in."""
import json
import time

import nbformat
import pandas as pd
import pytest

from moelab import cache, inputs
from moelab.claims import Tables
from moelab import free_moe as fm
from moelab.assets import MissingAsset
from moelab.free_moe import claims as nb05
from moelab.free_moe import standins
from moelab.free_moe.config import DRY_RUN_SIZES
from moelab.free_moe.experiment import subdomain_norms
from moelab.profiles import dry_run_table
from moelab.suite import scorecard

from helpers.claims import tables_folder
from helpers.free_moe import TEXTS, tiny_llama

# the settings that are sizes (items, steps, grids, budgets); everything else in FreeMoeConfig is a switch
SIZES = {"max_general", "K", "n_ref_cluster", "pool_per_task", "n_test", "code_test", "n_he", "he_tokens", "n_train",
         "code_train", "bands", "calib_tokens", "n_probe", "n_sweep", "n_hook", "ablate_patch", "ablate_K",
         "ablate_bands", "min_ref", "max_code_chars", "card_items", "n_candidates", "budget"}


@pytest.fixture(autouse=True)
def _threads():
    """moelab.device's CPU placement sets torch's threads to every core: give the next tests their one thread back."""
    import torch
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _model_folder(path, tok, seed=0):
    """A Hugging Face folder (save_pretrained layout) of the tests' tiny Llama and tokenizer."""
    tiny_llama(seed).save_pretrained(path)
    tok.save_pretrained(path)
    return path


# ---------------------------------------------------------------- the dry-run configuration
def test_dry_run_is_the_paper_configuration_with_sizes_cut():
    paper, dry = fm.config_for("paper"), fm.config_for("paper", dry_run=True)
    cuts = dry_run_table(paper, dry)
    assert set(DRY_RUN_SIZES) <= SIZES and set(cuts.setting) == set(DRY_RUN_SIZES)    # sizes only, each one cut
    for switch in ("device", "patch", "ablate_sublayers", "readings", "gemma", "he_n", "profile"):
        assert getattr(dry, switch) == getattr(paper, switch), switch
    # every code path of the paper profile still runs: each ablation table, pass@10 (he_n >= 10 samples), the
    # test-selected sweep, a choice of general tasks, k-means with K > 1, the run's own scorecard, a selectable grid
    assert dry.ablate_patch and dry.ablate_K and dry.readings and dry.n_sweep > 0 and dry.card_items > 0
    assert dry.he_n >= 10 and dry.n_candidates > dry.max_general and max(dry.K.values()) > 1
    assert set(dry.K) == set(paper.K) and set(dry.bands) <= set(paper.bands) and len(dry.bands) >= 2
    assert set(dry.ablate_patch) <= set(paper.ablate_patch) and set(dry.ablate_bands) <= set(paper.ablate_bands)
    assert dry.min_ref <= dry.n_ref_cluster and dry.max_general >= 1
    assert fm.config_for("paper", dry_run=True, n_test=2).n_test == 2
    with pytest.raises(ValueError, match="profile='default'.*--profile paper --dry-run"):
        fm.config_for("default", dry_run=True)


def test_cpu_profiles_read_the_committed_scorecard_and_keep_their_keys():
    """The CPU profiles are unchanged: no scorecard measured, every candidate, the cache key of before."""
    for p in ("smoke", "default", "full"):
        c = fm.config_for(p)
        assert c.card_items == 0 and fm.GENERAL_CANDIDATES[:c.n_candidates] == fm.GENERAL_CANDIDATES
        assert fm.cache_config(p, "SmolLM2-135M-Instruct", 0, c) == dict(
            model="SmolLM2-135M-Instruct", profile=p, seed=0, n_ref=c.n_ref_cluster, K=c.K)
    assert fm.config_for("paper").card_items >= max(scorecard.LIMITS.values())   # the committed item counts
    with pytest.raises(ValueError, match="n_candidates=1 < max_general=2"):
        fm.config_for("default", n_candidates=1)


# ---------------------------------------------------------------- MODEL_PATH checked first
def test_model_path_errors_name_parameter_file_field_and_fix_within_seconds(tmp_path, tok):
    t0 = time.time()
    with pytest.raises(MissingAsset, match=r"MODEL_PATH.*--only 05 -p MODEL_PATH="):
        fm.load_model("paper", None, "auto")
    with pytest.raises(MissingAsset, match="no file or folder at .*nope.*MODEL_PATH"):
        fm.load_model("paper", tmp_path / "nope", "auto")
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(inputs.InputFormatError, match=r"MODEL_PATH=.*weights.bin.*is a file, not a model folder"):
        fm.load_model("paper", f, "auto")
    d = tmp_path / "m"
    d.mkdir()
    with pytest.raises(inputs.InputFormatError, match=r"MODEL_PATH=.*has no config.json.*Fix: pass the folder"):
        fm.load_model("paper", d, "auto")
    (d / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(inputs.InputFormatError, match=r"config.json.*field 'model_type' is 'bert', expected one of "
                                                      r"\['llama', 'gemma', 'gemma2'\].*Fix: pass a local Hugging"):
        fm.load_model("paper", d, "auto")
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(inputs.InputFormatError, match=r"MODEL_PATH=.*holds no weights"):
        fm.load_model("paper", d, "auto")
    assert time.time() - t0 < 10


def test_a_valid_folder_loads_on_the_placement(tmp_path, tok):
    d = _model_folder(tmp_path / "llama", tok)
    assert fm.experiment.check_model_path(d)["model_type"] == "llama"
    model, _, name, card_name = fm.load_model("paper", d, "auto")
    assert name == card_name == str(d) and next(model.parameters()).dtype.is_floating_point


# ---------------------------------------------------------------- the cache knows which model it was
def _entries(root, kind):
    return sorted(p.name for p in (root / "artifacts" / kind).iterdir() if p.is_dir()) if (
        root / "artifacts" / kind).exists() else []


def test_cached_steps_are_keyed_by_the_model_folders_content(tmp_path, tok, tmp_cache):
    """Same name, same path, other weights (or another tokenizer file): a new key, and the cached step is rebuilt."""
    cfg = fm.config_for("paper", dry_run=True)
    d = _model_folder(tmp_path / "llama", tok, seed=0)

    def norms_with(folder):
        model, tk, name, _ = fm.load_model("paper", folder, "auto")
        cc = fm.cache_config("paper", name, 0, cfg, folder)
        subdomain_norms(model, tk, TEXTS, max_tokens=64, cache_config=dict(cc, subdomain="x"))
        return cc

    first = norms_with(d)
    assert first["model_id"] == cache.path_identity(d) and len(_entries(tmp_cache, "free_moe_norms")) == 1
    assert norms_with(d) == first and len(_entries(tmp_cache, "free_moe_norms")) == 1      # unchanged: reused
    _model_folder(d, tok, seed=1)                                                        # other weights, same path
    second = norms_with(d)
    assert cache.key(second) != cache.key(first) and len(_entries(tmp_cache, "free_moe_norms")) == 2
    (d / "tokenizer_config.json").write_text((d / "tokenizer_config.json").read_text().replace("}", ' }', 1))
    assert cache.key(fm.cache_config("paper", str(d), 0, cfg, d)) != cache.key(second)


# ---------------------------------------------------------------- the scorecard of the run's own model
@pytest.fixture
def asset_cache(tmp_path, monkeypatch):
    """A cache without notebook 05's entries that still reads the installed assets (BIG-bench, HumanEval, models)
    and the suite's built data: every folder of the current cache root linked in, except the ``free_moe_*`` kinds."""
    root = cache.cache_root()
    new = tmp_path / "cache"
    (new / "artifacts").mkdir(parents=True)
    for p in root.iterdir():
        if p.name != "artifacts":
            (new / p.name).symlink_to(p)
    for p in (root / "artifacts").iterdir() if (root / "artifacts").is_dir() else ():
        if not p.name.startswith("free_moe_"):
            (new / "artifacts" / p.name).symlink_to(p)
    monkeypatch.setenv("MOELAB_CACHE", str(new))
    return new


def test_model_scorecard_is_the_committed_rule_on_the_runs_model_and_resumes_by_task(tmp_path, asset_cache,
                                                                                    monkeypatch):
    d = standins.write(tmp_path)["params"]["MODEL_PATH"]          # 512 positions and SmolLM2's tokenizer
    model, tk, name, _ = fm.load_model("paper", d, "auto")
    tasks = ("moelab_bb_causal_judgment", "moelab_nll_code")
    ref = scorecard.summarize(scorecard.per_item_scores(model, tk, list(tasks), max_items=3), name)   # naive path
    cc = fm.cache_config("paper", name, 0, fm.config_for("paper", dry_run=True), d)
    card = fm.model_scorecard(model, tk, name, 3, tasks, cache_config=cc)
    pd.testing.assert_frame_equal(card, ref)
    assert set(card.task) == set(tasks) and (card.n == 3).all() and set(card.status) <= set(scorecard.STATUSES)
    assert len(_entries(asset_cache, "free_moe_scorecard")) == 3            # one entry per task, one of the rule
    monkeypatch.setattr(scorecard, "per_item_scores", lambda *a, **k: pytest.fail("rescored a cached task"))
    monkeypatch.setattr(scorecard, "summarize", lambda *a, **k: pytest.fail("recomputed the cached rule"))
    pd.testing.assert_frame_equal(fm.model_scorecard(model, tk, name, 3, tasks, cache_config=cc), ref)
    with pytest.raises(ValueError, match="not moelab lm tasks"):
        fm.model_scorecard(model, tk, name, 3, ("mmlu",))
    assert fm.data.scorecard_tasks(2) == (*fm.GENERAL_CANDIDATES[:2], *fm.data.SCORECARD_TASKS)


def _card(usable):
    rows = [dict(model="/models/llama-2-7b-chat", task=t, metric="acc", n=300, acc=0.6, ci_low=0.55, ci_high=0.65,
                 chance=0.25, status="usable" if t in usable else "not usable", usable=t in usable,
                 reason="beats chance, best position and question-blind baselines" if t in usable else
                 "does not beat chance")
            for t in ("moelab_math_mc", "moelab_bb_navigate", "moelab_bb_hyperbaton", "moelab_gsm")]
    return pd.DataFrame(rows)


def test_choice_of_tasks_and_regime_table_read_the_runs_scorecard():
    card = _card({"moelab_bb_hyperbaton", "moelab_math_mc"})
    chosen, note = fm.choose_general_tasks("/models/llama-2-7b-chat", fm.GENERAL_CANDIDATES, 2, card)
    assert chosen == ["moelab_bb_hyperbaton"] and "1 of 6" in note
    status = fm.data.task_usability("/models/llama-2-7b-chat", ["moelab_math_mc", "moelab_bb_navigate", "x"], card)
    assert status == {"moelab_math_mc": "usable", "moelab_bb_navigate": "not usable", "x": "not in the scorecard"}
    scores = pd.DataFrame(dict(task=["moelab_math_mc", "moelab_bb_navigate"], metric="acc"))
    t = fm.regime_table("/models/llama-2-7b-chat", scores, card)
    assert t.accuracy_claims.tolist() == ["inside the regime", "outside the regime"]


def _folder(path, card=None):
    items = pd.DataFrame([dict(model="/models/llama-2-7b-chat", method=m, domain="maths", task="moelab_math_mc",
                               id=f"q{i}", metric="acc", score=float(i % 2)) for i in range(10)
                          for m in ("BASELINE", "DOWP")])
    base = pd.DataFrame([dict(task="moelab_math_mc", scorer="BASELINE", kind="model", acc=60.0),
                         dict(task="moelab_math_mc", scorer="chance", kind="chance", acc=20.0),
                         dict(task="moelab_math_mc", scorer="position 0", kind="position", acc=30.0)])
    path.mkdir()
    tables = {nb05.ITEMS: items, nb05.BASELINES: base}
    if card is not None:
        tables[nb05.CARD] = card
    return tables_folder(path, tables)


def test_claims_decide_a_users_model_with_its_own_scorecard(tmp_path):
    """Issue 51: a paper-profile model is in no committed scorecard, so every accuracy row was outside the regime by
    design; with the run's scorecard the same rule decides it, both ways."""
    r = nb05.usable(_folder(tmp_path / "none"), nb05.MATH_MC, "acc")
    assert not r.passed and "docs/scorecard.md: math_mc not usable for /models/llama-2-7b-chat" in r.value
    r = nb05.usable(_folder(tmp_path / "ok", _card({"moelab_math_mc"})), nb05.MATH_MC, "acc")
    assert r.passed and "scorecard_model.csv (this run's model" in r.value and "usable (beats chance" in r.value
    r = nb05.usable(_folder(tmp_path / "no", _card(set())), nb05.MATH_MC, "acc")
    assert not r.passed and "not usable (does not beat chance)" in r.value
    ok, why = nb05.paper_metric_floor(_folder(tmp_path / "gsm", _card({"moelab_gsm"})), nb05.NLL_MATHS)
    assert ok and "scorecard_model.csv (this run's model) gsm acc 0.600" in why
    with pytest.raises(nb05.MissingTable, match="no row for moelab_humaneval"):
        nb05.paper_metric_floor(_folder(tmp_path / "he", _card(set())), nb05.NLL_CODE)


def test_gemma_rows_of_a_paper_run_say_where_they_are_scored(tmp_path):
    _folder(tmp_path / "p")
    (tmp_path / "p" / "provenance.json").write_text('{"notebook": "05_free_moe", "profile": "paper"}')
    f = Tables(tmp_path / "p")
    for cid in ("gemma_dowp_gain_gsm8k", "gemma_dowp_gain_gsm8k_gated"):
        ev = next(c for c in nb05.CLAIMS if c.id == cid).evidence(f)
        assert isinstance(ev, nb05.NotInProfile) and "one model at MODEL_PATH" in ev.reason, cid


# ---------------------------------------------------------------- the dry run end to end
def test_standins_are_the_model_folder_only(tmp_path):
    made = standins.write(tmp_path)
    assert set(made["params"]) == set(made["formats"]) == {"MODEL_PATH"}
    assert fm.experiment.check_model_path(made["params"]["MODEL_PATH"])["model_type"] == "llama"


@pytest.mark.slow
def test_dry_run_reaches_finish_through_every_cell(tmp_path, monkeypatch, tmp_figures):
    """``run --profile paper --dry-run --only 05`` on the stand-in: every code cell runs (none skips its experiment),
    the first table after the profile's is what the dry run cuts, and every non-extension claim says ``dry run``."""
    from moelab.runner import cli
    from moelab.standins import params_text

    monkeypatch.setattr(cli, "RUNS", tmp_path / "runs")
    monkeypatch.setenv("MOELAB_SCRATCH", str(tmp_path / "scratch"))
    params = standins.write(tmp_path / "standins")["params"]
    assert cli.main(["run", "--profile", "paper", "--dry-run", "--only", "05", "--no-progress", "--params",
                     params_text(params)]) == 0
    out = tmp_path / "scratch" / "paper" / "05_free_moe"
    assert json.loads((out / "provenance.json").read_text())["dry_run"] is True
    cuts = pd.read_csv(out / "config_dry-run-cuts.csv")
    assert {"n_test", "bands", "card_items"} <= set(cuts[cuts.cut].setting) and not cuts[~cuts.cut].empty
    card = pd.read_csv(out / "scorecard_model.csv")
    assert set(card.task) == set(fm.data.scorecard_tasks(fm.config_for("paper", dry_run=True).n_candidates))
    for t in ("table1_main-items", "table1_algorithm1-items", "table2_ratio-items", "table3_sublayers-items",
              "table4_patch-items", "table5_kmeans-items", "readings_band-readings-items", "table1_selection",
              "keep_off-domain-items", "baselines_accuracy"):
        assert (out / f"{t}.csv").exists(), t
    verdicts = {r["verdict"] for r in json.loads((out / "claims.json").read_text())["claims"]}
    assert verdicts == {"dry run", "extension"}
    nb = nbformat.read(tmp_path / "runs" / "paper" / "05_free_moe.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code)
    assert not any(o.get("output_type") == "error" for c in code for o in c.outputs)
