"""Notebook 04's paper profile (issue 51): dry-run config, early input errors, cache identity of user paths."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time

import pandas as pd
import pytest

from moelab.assets import MissingAsset
from moelab.cache import path_identity
from moelab.inputs import InputFormatError
from moelab.mass import claims as nb04
from moelab.mass import config as mc
from moelab.mass import data as md
from moelab.mass import experiment as mx
from moelab.mass import standins
from moelab.mass.experiment import task_digest
from moelab.mass.standins import write_glue
from moelab.standins import params_text, tiny_bert

from helpers import ROOT
from helpers.claims import tables_folder


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    return write_glue(tmp_path_factory.mktemp("glue"), n_train=12, n_dev=6)


def test_dry_run_cuts_sizes_only():
    paper, dry = mc.PROFILES["paper"], mc.dry_run_profile()
    for k in ("d_model", "attn_layers", "n_heads", "max_experts", "d_ff", "lr", "device"):
        assert getattr(dry.synth, k) == getattr(paper.synth, k), k
    for k in ("source", "tasks", "methods", "layer", "init_experts", "max_experts", "lr", "lr_new", "cosine_experts"):
        assert getattr(dry.glue, k) == getattr(paper.glue, k), k
    assert dry.synth.steps < paper.synth.steps and len(dry.glue.seeds) < len(paper.glue.seeds)
    assert "dense" in dry.glue.methods
    t = mc.dry_run_table()
    assert set(t.loc[t.cut, "setting"]) >= {"synth.steps", "glue.seeds", "glue.max_train"}
    with pytest.raises(ValueError, match="paper"):
        mc.profile("smoke", dry_run=True)


def test_missing_model_path_raises_naming_parameter(tmp_path, glue_dir):
    with pytest.raises(MissingAsset, match="MODEL_PATH"):
        md.check_paper_inputs(tmp_path / "nope", glue_dir, ("cola",))
    (tmp_path / "m").mkdir()
    with pytest.raises(InputFormatError, match="config.json"):
        md.check_paper_inputs(tmp_path / "m", glue_dir, ("cola",))


def test_glue_dir_without_task_names_folder_and_fix(tmp_path, glue_dir):
    g = tmp_path / "glue"
    shutil.copytree(glue_dir, g)
    shutil.rmtree(g / "RTE")
    with pytest.raises((MissingAsset, InputFormatError), match="RTE") as e:
        md.check_glue_dir(g, ("cola", "rte"))
    assert "GLUE_DIR" in str(e.value)
    md.check_glue_dir(g, ("cola",))            # the tasks present still pass


def test_changed_glue_row_changes_the_cache_key(tmp_path, glue_dir):
    g = tmp_path / "glue"
    shutil.copytree(glue_dir, g)
    before = md.glue_task(g, "cola", 1000, None, None)
    f = md.glue_file(g, "cola", "train")
    lines = f.read_text().splitlines(keepends=True)
    lines[0] = lines[0].replace("\t1\t", "\t0\t", 1) if "\t1\t" in lines[0] else lines[0].replace("\t0\t", "\t1\t", 1)
    f.write_text("".join(lines))
    after = md.glue_task(g, "cola", 1000, None, None)
    assert task_digest(before) != task_digest(after)
    assert path_identity(g)["digest"] != path_identity(glue_dir)["digest"]


# ---------------------------------------------------------------- issue 51's bugs in 04 and the paper GLUE arm
@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("bert"), num_hidden_layers=3)


def test_paper_profile_reads_model_path_and_glue_dir_first(tmp_path, glue_dir, bert_dir, monkeypatch):
    """Issue 51: 04's paper profile never read MODEL_PATH or GLUE_DIR and started hours of training. Now the first
    cell's check and the GLUE part itself refuse nonexistent paths before any run starts."""
    P = mc.profile("paper")
    t0 = time.perf_counter()
    with pytest.raises(MissingAsset, match="MODEL_PATH"):
        P.check_inputs(tmp_path / "no-bert", tmp_path / "no-glue")
    with pytest.raises(MissingAsset, match="GLUE_DIR"):
        md.check_paper_inputs(bert_dir, tmp_path / "no-glue", ("cola",))
    assert time.perf_counter() - t0 < 10
    assert mc.profile("default").check_inputs(None, None) is None          # CPU profiles read no user path
    monkeypatch.setattr(mx, "run_glue_standin_cached", lambda *a, **k: pytest.fail("trained before checking"))
    with pytest.raises(MissingAsset, match="MODEL_PATH"):
        mx.glue_part(P.glue, model_path=tmp_path / "no-bert", glue_dir=glue_dir)
    with pytest.raises(InputFormatError, match="num_hidden_layers"):         # the public MoE layer 10 needs > 10
        mx.glue_part(P.glue, model_path=bert_dir, glue_dir=glue_dir)


def test_glue_files_read_by_column_name_bom_and_bad_label(tmp_path, glue_dir):
    g = tmp_path / "glue"
    shutil.copytree(glue_dir, g)
    mrpc = md.glue_file(g, "mrpc", "train")
    mrpc.write_text("\ufeff" + mrpc.read_text(encoding="utf-8"), encoding="utf-8")   # msr_paraphrase's BOM
    assert set(md.load_glue_task(g, "mrpc").label) <= {"0", "1"}
    dev = md.load_glue_task(g, "mnli", "dev")                          # dev_matched.tsv: 16 columns, gold_label last
    assert set(dev.label) <= set(md.GLUE_LABELS["mnli"]) and (dev.text_b != "").all()
    rte = md.glue_file(g, "rte", "dev")
    lines = rte.read_text().splitlines()
    lines[2] = lines[2].rsplit("\t", 1)[0] + "\tmaybe"
    rte.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputFormatError, match=r"line 3: field 'label' is 'maybe'") as e:
        md.check_glue_dir(g, ("rte",))
    assert "GLUE_DIR" in str(e.value) and "dev.tsv" in str(e.value)
    hdr = md.glue_file(g, "qnli", "train")
    hdr.write_text(hdr.read_text().replace("question", "query", 1))
    with pytest.raises(InputFormatError, match="no column 'question'"):
        md.check_glue_dir(g, ("qnli",))


def test_glue_task_holds_out_validation_from_train_and_reports_dev(glue_dir):
    t = md.glue_task(glue_dir, "rte", val_items=1000)
    train = md.load_glue_task(glue_dir, "rte")
    assert len(t["validation"]) == len(train) // 10 and len(t["train"]) + len(t["validation"]) == len(train)
    assert len(t["test"]) == len(md.load_glue_task(glue_dir, "rte", "dev"))
    assert isinstance(t["train"][0][0], tuple) and t["labels"] == ["entailment", "not_entailment"]
    cut = md.glue_task(glue_dir, "cola", max_train=4, max_eval=3)
    assert len(cut["train"]) == 4 and len(cut["test"]) == 3 and isinstance(cut["train"][0][0], str)


def test_glue_trainer_places_through_the_config_device(monkeypatch, glue_dir):
    """Issue 51: the GLUE trainer was fixed to device="cpu". It now trains on GlueStandinConfig.device ("auto": CUDA
    with bf16 when present) and the cache key holds the resolved device."""
    seen = {}

    class Stop(Exception):
        pass

    def fake_train(model, loader, cfg, **kw):
        seen["device"] = cfg.device
        raise Stop

    monkeypatch.setattr(mx.mtrain, "train", fake_train)
    cfg = mx.GlueStandinConfig(steps=1, eval_every=1, batch_size=4, max_length=16)
    with pytest.raises(Stop):
        mx.glue_standin(md.glue_task(glue_dir, "cola", max_train=4, max_eval=2), "dense", 0, cfg)
    assert seen["device"] == "auto"
    assert cfg.key()["device"] == mx.resolve_device("auto") and "auto" not in cfg.key().values()


def test_dense_and_mass_on_a_local_bert_with_sentence_pairs(bert_dir, glue_dir):
    """The paper arm end to end on a 3-layer BERT folder: sentence pairs, the pooler head, the dense parent (pool 1,
    one FFN per token) beside MASS (top-p over 4 of 6 slots)."""
    task = md.glue_task(glue_dir, "mnli", max_train=8, max_eval=4)
    cfg = mx.GlueStandinConfig(steps=2, eval_every=2, batch_size=4, max_length=32, layer=2, init_experts=4,
                               max_experts=6, lr=2e-5, lr_new=2e-5)
    runs, items = mx.run_glue_standin({"mnli": task}, ["dense", "mass"], [0], cfg, model_path=bert_dir)
    d, m = runs.set_index("method").loc["dense"], runs.set_index("method").loc["mass"]
    assert d.final_pool == 1 and d.mean_active == 1.0 and d.expansions == 0
    assert 1 <= m.mean_active <= m.final_pool <= 6 and len(items) == 2 * len(task["test"])
    assert set(items.correct) <= {0.0, 1.0}


def test_glue_cache_key_holds_the_model_identity(bert_dir, tmp_path, glue_dir):
    """Another checkpoint of the same shape at the same path is another key (moelab.cache.path_identity)."""
    keys = []

    def cache(kind, key, compute):
        keys.append(repr(sorted(key.items())))
        return pd.DataFrame([dict(task="cola")]), pd.DataFrame([dict(item=0)])

    b = tmp_path / "bert"
    shutil.copytree(bert_dir, b)
    task = {"cola": md.glue_task(glue_dir, "cola", max_train=4, max_eval=2)}
    cfg = mx.GlueStandinConfig(steps=1, eval_every=1)
    mx.run_glue_standin_cached(task, ["dense"], [0], cfg, cache=cache, model_path=b)
    w = next(b.glob("*.safetensors"))
    w.write_bytes(w.read_bytes()[:-1] + bytes([w.read_bytes()[-1] ^ 1]))      # one weight byte changed
    mx.run_glue_standin_cached(task, ["dense"], [0], cfg, cache=cache, model_path=b)
    assert len(keys) == 2 and keys[0] != keys[1] and "'model'" in keys[0]


def test_glue_claims_read_the_paper_tables_with_the_dense_arm(tmp_path):
    """The paper profile saves fig4_glue_runs with a dense arm: the regime's dense-parent check can now pass."""


    rows = [dict(task="rte", method=meth, seed=s, acc=acc, chance=0.5, final_pool=pool, mean_active=2.0,
                 expansions=int(meth == "mass"), n_test=100)
            for s in range(3) for meth, acc, pool in (("mass", .8, 10), ("dynmoe", .78, 9), ("cosine", .77, 8),
                                                       ("dense", .76, 1))]
    T = tables_folder(tmp_path, {"fig4_glue_runs": pd.DataFrame(rows)})
    reg = nb04.glue_regime(T)
    assert reg.passed and "dense parent 0.760" in reg.value
    assert nb04.glue_evidence("acc", "dynmoe")(T).a.tolist() == pytest.approx([0.8] * 3)


@pytest.mark.slow
def test_dry_run_of_notebook_04_end_to_end(tmp_path):
    """The runner's dry run of 04 on the generated stand-ins reaches run.finish(): every paper-path table the claims
    read is saved (fig4_glue_runs with the dense arm among them) and every non-extension row says `dry run`."""
    params = standins.write(tmp_path / "in")["params"]
    env = {**os.environ, "MOELAB_SCRATCH": str(tmp_path / "scratch"), "MOELAB_PROGRESS": "0"}
    cmd = [sys.executable, "-m", "moelab.runner", "run", "--profile", "paper", "--dry-run", "--only", "04",
           "--no-progress", "--params", params_text(params)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "scratch" / "paper" / "04_mass"
    runs = pd.read_csv(out / "fig4_glue_runs.csv")
    assert set(runs.method) == {"dense", "cosine", "dynmoe", "mass"} and set(runs.task) == set(md.GLUE_TASKS)
    rows = json.loads((out / "claims.json").read_text())
    rows = rows["claims"] if isinstance(rows, dict) else rows
    assert rows and all(r["verdict"] in ("dry run", "extension") for r in rows)
    assert json.loads((out / "provenance.json").read_text())["dry_run"] is True


def test_glue_cost_estimate_counts_every_run():
    """The profile table's GPU-hour estimate: 6 N FLOPs per token over every (task, epoch, method, seed) sequence."""
    g = mc.PAPER_GLUE
    tokens = sum(mc.GLUE_TRAIN_ITEMS.values()) * 10 * 4 * 3 * 128
    assert mc.glue_gpu_hours(g) == pytest.approx(6 * 335e6 * tokens / 120e12 / 3600)
    no_dense = dataclasses.replace(g, methods=("cosine", "dynmoe", "mass"))
    assert mc.glue_gpu_hours(no_dense) == pytest.approx(0.75 * mc.glue_gpu_hours(g))
    assert "GPU-h" in mc.profile_table("paper").loc["paper (this run)", "glue"]
