"""Notebook 02's paper profile rehearsed on tiny stand-ins (issue 51): the dry-run configuration (only sizes cut), the
early format errors (parameter, file, field and fix named within seconds), the cache identity of MODEL_PATH /
NLI_PATH / MTEB_PATH, the paper path's bugs found by the issue (an empty regime table without its columns, a phase-(c)
run without ``steps``, no per-item scores, claims failing on a run without an initial stage, a circular row where no
screen ran), the per-item MTEB scores against a naive reference, bf16 placement, and one end-to-end dry run."""
from __future__ import annotations

import gzip
import json
import shutil
import time
from dataclasses import asdict, replace

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr
from sklearn.metrics import average_precision_score

from moelab import sba
from moelab.assets import MissingAsset
from moelab.inputs import InputFormatError
from moelab.sba import claims as sba_claims
from moelab.sba import config, experiment, items, standins

from helpers import ROOT

DRY = config.profile("paper", dry_run=True)
SMALL = replace(DRY, n_subjects=2, seeds=(0,), aggregations=("linear", "sba"), swaps=("sba",))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The stand-ins of scripts/make_paper_standins.py: {"MODEL_PATH": ..., "NLI_PATH": ..., "MTEB_PATH": ...}."""
    return standins.write(tmp_path_factory.mktemp("standins02"))["params"]


@pytest.fixture(autouse=True)
def _static_circular():
    """The per-profile ``circular`` of 02's claims is set by their evidence (sba.claims._screened): put every claim's
    back as defined after each test, so no other test sees a paper-profile value."""
    before = {c.id: c.circular for c in sba_claims.CLAIMS}
    yield
    for c in sba_claims.CLAIMS:
        c.circular = before[c.id]


def _copy(inputs, tmp_path) -> dict:
    """A private copy of the stand-ins (a test that changes a file must not change another test's)."""
    out = {}
    for k, v in inputs.items():
        out[k] = str(tmp_path / k)
        shutil.copytree(v, out[k])
    return out


def _setup(p, cfg=SMALL):
    return sba.setup(cfg, seed=0, model_path=p["MODEL_PATH"], nli_path=p["NLI_PATH"], mteb_path=p["MTEB_PATH"])


def _rewrite_jsonl_gz(f, change):
    rows = [json.loads(line) for line in gzip.open(f, "rt")]
    with gzip.open(f, "wt") as fh:
        fh.writelines(json.dumps(change(r)) + "\n" for r in rows)


# ---------------------------------------------------------------- the dry-run configuration
def test_dry_run_is_the_paper_profile_with_sizes_cut():
    paper = config.profile("paper")
    changed = {k for k, v in asdict(DRY).items() if v != asdict(paper)[k]}
    assert changed == {"phase_c", "n_subjects", "per_subject", "max_tokens", "n_triplets"}
    pc, dc = asdict(paper.phase_c), asdict(DRY.phase_c)
    assert {k for k in pc if pc[k] != dc[k]} <= {"max_steps", "batch_size", "eval_every", "grad_accum", "val_batches"}
    # every switch of the paper path is kept: the model (not the stand-in), every aggregation fine-tuned and swapped,
    # the seeds the claims need, the schedule, gradient accumulation, the device, the verb files of WordNet (> 26)
    assert not DRY.stand_in and DRY.aggregations == paper.aggregations and DRY.swaps == paper.swaps
    assert DRY.seeds == paper.seeds and len(DRY.seeds) >= 3 and DRY.device == "auto"
    assert (dc["lr"], dc["warmup_frac"], dc["window"]) == (pc["lr"], pc["warmup_frac"], pc["window"])
    assert DRY.phase_c.grad_accum > 1 and DRY.n_subjects > 26
    with pytest.raises(ValueError, match="PROFILE='paper'"):
        config.profile("default", dry_run=True)


def test_dry_run_table_names_the_cuts_and_the_users_paths():
    t = config.dry_run_table(dict(MODEL_PATH="/m", NLI_PATH="/n", MTEB_PATH="/t")).set_index("setting")
    assert t.loc["phase_c.max_steps", "paper"] == "1400" and t.loc["phase_c.max_steps", "cut"]
    assert not t.loc["aggregations", "cut"] and not t.loc["MODEL_PATH", "cut"] and t.loc["MTEB_PATH", "dry run"] == "/t"
    assert "note" not in t.index  # only sizes differ
    src = (ROOT / "notebooks" / "02_sba.py").read_text()
    first = src.index("display(sba.profile_table(PROFILE))")
    assert src.index("sba.dry_run_table(") > first
    assert src.index("sba.dry_run_table(") < src.index("display(", first + 1)  # the first table after it


# ---------------------------------------------------------------- early format errors
@pytest.mark.parametrize("case", ["no model", "no config.json", "dense nomic", "no safetensors", "nli field",
                                  "nli pairs only", "nli no dev", "mteb no task", "sts score", "clustering lists",
                                  "sprint labels"])
def test_every_input_is_checked_within_seconds(inputs, tmp_path, case):
    p = _copy(inputs, tmp_path)
    model, nli, mteb = (tmp_path / k for k in ("MODEL_PATH", "NLI_PATH", "MTEB_PATH"))
    want = {"no model": (MissingAsset, r"-p MODEL_PATH=<path>")}
    if case == "no model":
        p["MODEL_PATH"] = str(tmp_path / "nowhere")
    elif case == "no config.json":
        (model / "config.json").unlink()
        want[case] = (InputFormatError, r"MODEL_PATH=.*no config\.json.*Fix: ")
    elif case == "dense nomic":
        cfg = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps(dict(cfg, num_experts=0)))
        want[case] = (InputFormatError, r"MODEL_PATH=.*config\.json.*num_experts=0.*Fix: ")
    elif case == "no safetensors":
        (model / "model.safetensors").rename(model / "pytorch_model.bin")
        want[case] = (InputFormatError, r"MODEL_PATH=.*no model\.safetensors")
    elif case == "nli field":
        f = nli / "triplet" / "train-00000-of-00001.parquet"
        pd.read_parquet(f).rename(columns={"negative": "hard_negative"}).to_parquet(f)
        want[case] = (InputFormatError, r"NLI_PATH=.*train-00000-of-00001\.parquet.*no field 'negative'.*Fix: ")
    elif case == "nli pairs only":
        (nli / "triplet").rename(nli / "pair")
        want[case] = (InputFormatError, r"NLI_PATH=.*no 'triplet/' folder")
    elif case == "nli no dev":
        (nli / "triplet" / "dev-00000-of-00001.parquet").unlink()
        want[case] = (InputFormatError, r"NLI_PATH=.*no 'dev' split file.*Fix: ")
    elif case == "mteb no task":
        shutil.rmtree(mteb / "SprintDuplicateQuestions")
        want[case] = (InputFormatError, r"MTEB_PATH=.*no task folder SprintDuplicateQuestions/")
    elif case == "sts score":
        _rewrite_jsonl_gz(mteb / "STSBenchmark" / "test.jsonl.gz", lambda r: dict(r, score=7.5))
        want[case] = (InputFormatError, r"MTEB_PATH=.*STSBenchmark.*row 0: field 'score' is 7\.5")
    elif case == "clustering lists":
        _rewrite_jsonl_gz(mteb / "StackExchangeClustering" / "test.jsonl.gz", lambda r: dict(r, labels=r["labels"][1:]))
        want[case] = (InputFormatError, r"MTEB_PATH=.*StackExchangeClustering.*row 0: lists .* have lengths")
    elif case == "sprint labels":
        _rewrite_jsonl_gz(mteb / "SprintDuplicateQuestions" / "test.jsonl.gz",
                          lambda r: dict(r, labels=[2 * y for y in r["labels"]]))
        want[case] = (InputFormatError, r"MTEB_PATH=.*SprintDuplicateQuestions.*field 'labels' holds \[0, 2\]")
    err, pattern = want[case]
    t0 = time.time()
    with pytest.raises(err, match=pattern):
        _setup(p, DRY)
    assert time.time() - t0 < 30, "the inputs must be checked before any long work"


# ---------------------------------------------------------------- cache identity of the user's paths
def test_changed_mteb_row_rebuilds_the_measurement(inputs, tmp_path, tmp_cache):
    """Issue 51: pointed at a copy with reversed STS scores, 02 reported the first copy's score from the cache."""
    p = _copy(inputs, tmp_path)
    sts = lambda s: float(s[0]["after"]["eval"].set_index("benchmark").loc["STSBenchmark", "score"])  # noqa: E731
    first = sts(sba.phase_b_runs(_setup(p)))
    assert sts(sba.phase_b_runs(_setup(p))) == first  # unchanged inputs: the cached entry
    _rewrite_jsonl_gz(tmp_path / "MTEB_PATH" / "STSBenchmark" / "test.jsonl.gz", lambda r: dict(r, score=5 - r["score"]))
    assert sts(sba.phase_b_runs(_setup(p))) == pytest.approx(-first)  # Spearman against the reversed gold


def test_every_user_path_is_in_the_cache_key(inputs, tmp_path):
    p = _copy(inputs, tmp_path)
    before = _setup(p).conf
    f = tmp_path / "NLI_PATH" / "triplet" / "train-00000-of-00001.parquet"
    d = pd.read_parquet(f)
    d.loc[0, "anchor"] = d.loc[0, "anchor"] + " (edited)"
    d.to_parquet(f)
    from safetensors.torch import load_file, save_file
    w = tmp_path / "MODEL_PATH" / "model.safetensors"
    sd = load_file(str(w))
    sd["emb_ln.bias"] = sd["emb_ln.bias"] + 1e-3
    save_file(sd, str(w))
    after = _setup(p).conf
    assert after["nli"] != before["nli"] and after["model"] != before["model"] and after["mteb"] == before["mteb"]


# ---------------------------------------------------------------- the paper path's bugs (issue 51)
@pytest.fixture(scope="module")
def paper_runs(inputs, tmp_path_factory):
    """The paper path on the stand-ins at the small sizes: (setup, phase-(b) runs, phase-(c) runs)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("MOELAB_CACHE", str(tmp_path_factory.mktemp("cache02")))
    try:
        s = _setup(inputs)
        pbs = sba.phase_b_runs(s)
        yield s, pbs, sba.phase_c_runs(s, pbs)
    finally:
        mp.undo()


def test_regime_change_of_the_paper_profile_keeps_its_columns(paper_runs):
    """Was: ``change.drop(columns="reasons")`` -> KeyError (an empty frame without columns)."""
    _, pbs, _ = paper_runs
    change = sba.regime_change(pbs)
    assert change.empty and "reasons" in change.columns and "expert_similarity_change" in change.columns
    change.drop(columns="reasons").round(4)
    assert "no initialisation" in sba.regime_sentence(change)


def test_paper_phase_c_runs_fill_the_training_table_and_the_items(paper_runs):
    """Was: ``KeyError: 'steps'`` in phase_c_table, then "no per-item scores in the runs"."""
    _, _, runs = paper_runs
    tab = sba.phase_c_table(runs)
    assert len(tab) == 2 and (tab.steps == DRY.phase_c.max_steps).all() and not tab.stopped.any()
    assert (tab.val_mnrl_first == tab.val_mnrl_init).all() and np.isfinite(tab.val_mnrl_last).all()
    it = sba.items_long(runs)
    assert set(it.benchmark) == {"STSBenchmark", "StackExchangeClustering", "SprintDuplicateQuestions"}
    scores = sba.scores_long(runs)
    assert set(scores.benchmark) == set(it.benchmark) and "column" in scores
    assert all(r["val"].step.iloc[0] == 0 for r in runs.values())  # step 0: before fine-tuning


def _stub_tables(profile, tables):
    class T:
        def __init__(self):
            self.profile = profile

        def has(self, stem):
            return stem in tables

        def csv(self, stem):
            return tables[stem].copy()
    return T()


def _claim(cid):
    return next(c for c in sba_claims.CLAIMS if c.id == cid)


def test_fig2_is_circular_only_where_phase_b_was_screened():
    """Fig. 2's level is circular on the screened stand-in, not on nomic (paper profile, no screen)."""
    from moelab.claims.engine import evaluate

    subj = pd.DataFrame(dict(stage="end", domain=[f"s{i}" for i in range(8)] + ["pooled"],
                             **{sba_claims.ANGLE_COL: [0.8, 0.9, 0.85, 0.95, 0.9, 0.8, 0.88, 0.92, 0.87]}))
    empty_change = sba.regime_change({0: {}})
    paper = _stub_tables("paper", {sba_claims.REGIME_SUBJECTS: subj, sba_claims.REGIME_CHANGE: empty_change})
    rec = evaluate(_claim("fig2_angles_above_40"), paper)
    assert rec["verdict"] == "reproduced" and "circular" not in rec["reason"]
    c = _claim("fig2_angles_above_40")
    with pytest.raises(sba_claims.MissingTable):
        c.evidence(_stub_tables("default", {}))
    assert c.circular == sba_claims.SCREEN_CIRCULAR


def test_claims_of_a_run_without_an_initial_stage_say_not_in_profile():
    """Was: ValueError 'Level values contains non-finite values' (the change from an init nomic does not have)."""
    geo = pd.DataFrame(dict(seed=0, figure="fig2", quantity=sba_claims.ANGLE_COL, init=np.nan, end=0.6,
                            change=np.nan), index=[0])
    T = _stub_tables("paper", {sba_claims.GEO_CHANGE: geo})
    for cid in ("fig2_angle_change", "fig1_concentration_change", "fig5_collapse_change", "fig2_angles_at_init"):
        ev = _claim(cid).evidence(T)
        assert type(ev).__name__ == "NotInProfile", cid


# ---------------------------------------------------------------- per-item MTEB scores against a naive reference
def test_grouped_jackknife_against_a_naive_loop():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=50), rng.normal(size=50)
    stat = lambda a, b: float(np.corrcoef(a, b)[0, 1])  # noqa: E731
    np.testing.assert_allclose(items.grouped_pseudo_values(x, y, stat, max_items=50),
                               items.jackknife_pseudo_values(x, y, stat))
    got = items.grouped_pseudo_values(x, y, stat, max_items=10)
    naive = []
    for g in range(10):  # groups of 5 consecutive items
        keep = [i for i in range(50) if i // 5 != g]
        naive.append(10 * stat(x, y) - 9 * stat(x[keep], y[keep]))
    np.testing.assert_allclose(got, naive)


def test_mteb_scores_and_items_against_the_metrics(inputs):
    from moelab.sba.data import load_mteb_local, v_measure_mteb

    tasks = load_mteb_local(inputs["MTEB_PATH"])
    rng = np.random.default_rng(1)
    emb = {}
    enc = lambda t: np.stack([emb.setdefault(s, rng.normal(size=8)) for s in t])  # noqa: E731
    scores, it = items.evaluate_mteb_with_items(enc, tasks, seed=0)
    sc = scores.set_index("benchmark").score

    def cos(a, b):
        a, b = enc(a), enc(b)
        return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    sts = tasks["STSBenchmark"]
    assert sc["STSBenchmark"] == pytest.approx(spearmanr(cos(sts.sentence1, sts.sentence2), sts.score).statistic)
    sp = tasks["SprintDuplicateQuestions"].iloc[0]
    assert sc["SprintDuplicateQuestions"] == pytest.approx(average_precision_score(sp.labels, cos(sp.sentence1,
                                                                                                   sp.sentence2)))
    cl = [v_measure_mteb(enc(r.sentences), r.labels, 0) for r in tasks["StackExchangeClustering"].itertuples()]
    assert sc["StackExchangeClustering"] == pytest.approx(np.mean(cl))
    np.testing.assert_allclose(it[it.benchmark == "StackExchangeClustering"].score, cl)
    assert len(it[it.benchmark == "STSBenchmark"]) == len(sts)


# ---------------------------------------------------------------- the device
def test_nomic_is_measured_where_moelab_device_places_it(inputs, monkeypatch):
    """On CUDA moelab.device holds the weights in bf16; the measurement path must run in that dtype (here on the CPU)."""
    from moelab.device import Placement
    from moelab.sba.data import load_mteb_local

    seen = []
    monkeypatch.setattr(experiment, "inference_placement",
                        lambda device="auto": seen.append(device) or Placement("cpu", torch.bfloat16, 1, "cpu"))
    out = experiment.nomic_measure(inputs["MODEL_PATH"], aggregation="sba", subjects={"a": ["the cat sat"]},
                                   max_tokens=20, mteb_tasks=load_mteb_local(inputs["MTEB_PATH"]), device="auto")
    assert seen == ["auto"] and np.isfinite(out["eval"].score).all() and len(out["items"]) > 0
    assert (out["geo"].radius_ratio_sba - 1).abs().max() < sba_claims.SBA_IDENTITY_TOL  # Eq. 5 still holds


# ---------------------------------------------------------------- the dry run end to end
@pytest.mark.slow
def test_dry_run_of_notebook_02_end_to_end(inputs, tmp_path, monkeypatch):
    from moelab.claims.rebuild import evaluate_folder
    from moelab.claims.registry import claim_defs
    from moelab.runner import cli
    from moelab.runner.notebook_run import output_dir

    monkeypatch.setenv("MOELAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MOELAB_SCRATCH", str(tmp_path / "scratch"))
    src = next(s for s in cli.discover(["02"]))
    cli.run_one(src, "paper", progress=False, publish=False, params=dict(inputs, DRY_RUN=True), runs=tmp_path / "runs")
    out = output_dir("02_sba", "paper", False)
    assert out.is_relative_to(tmp_path / "scratch")
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["dry_run"] is True
    for stem in ("dryrun_cuts", "train_runs", "table1_per-item-scores", "swap_benchmarks", "regime_change"):
        assert (out / f"{stem}.csv").exists(), stem
    assert len(pd.read_csv(out / "train_runs.csv")) == len(DRY.aggregations) * len(DRY.seeds)
    _, recs = evaluate_folder(out, claim_defs)
    assert {r["verdict"] for r in recs} <= {"dry run", "extension"}
    fig2 = next(r for r in recs if r["id"] == "fig2_angles_above_40")
    assert "circular" not in fig2["reason"]
