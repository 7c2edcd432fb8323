"""Notebook 01's paper profile dry run (issue 51): the dry-run config cuts sizes only, 1 epoch is what the schedule
trains, the user's paths are checked first (with errors naming parameter, file, field and fix), and the cache keys
hold the identity of the user's model and data."""
import dataclasses
import json
import shutil

import pytest

from moelab.assets import MissingAsset
from moelab.inputs import InputFormatError
from moelab.moce import config as mc
from moelab.moce import data as md
from moelab.moce import standins


@pytest.fixture(scope="module")
def stand(tmp_path_factory):
    return standins.write(tmp_path_factory.mktemp("moce01"))["params"]


def test_dry_run_cuts_sizes_only():
    paper, dry = mc.config_for("paper"), mc.config_for("paper", dry_run=True)
    diff = {f.name for f in dataclasses.fields(paper) if getattr(paper, f.name) != getattr(dry, f.name)}
    assert diff and diff <= set(mc.DRY_RUN_SIZES)
    for switch in ("variants", "extra", "rank", "lr", "n_top", "paper_data", "experts_per_group", "encoders",
                   "projections", "restore_best", "patience", "max_rounds"):
        assert getattr(dry, switch) == getattr(paper, switch), switch
    with pytest.raises(ValueError, match="only the paper profile"):
        mc.config_for("smoke", dry_run=True)


def test_paper_trains_one_epoch():
    # MoCE §4.1: one epoch. Issue 51 found 31,000 steps x batch 32 over 20,000 items (~50 passes).
    paper = mc.config_for("paper")
    assert paper.steps * paper.max_rounds == mc.paper_epoch_steps(paper)
    assert "1 epoch (625 steps" in mc.profile_table("paper").set_index("setting").loc["training", "paper (this run)"]


def test_paper_runs_the_seeds_the_claims_need():
    # issue 51: one seed made every training comparison inconclusive (the claims' rule needs 3 seeds)
    assert len(mc.config_for("paper").seed_offsets) >= 3


def test_cpu_profiles_unchanged():
    assert (mc.config_for("default").steps, mc.config_for("smoke").steps, mc.config_for("full").steps) == (20, 2, 16)


def test_inputs_accepted(stand):
    cfg = md.check_paper_inputs(stand["MODEL_PATH"], stand["ENCODER_PATH"], stand["DATA_PATHS"])
    assert cfg["model_type"] == "llama"


def test_missing_model(stand, tmp_path):
    with pytest.raises(MissingAsset, match="MODEL_PATH"):
        md.check_paper_inputs(str(tmp_path / "nope"), stand["ENCODER_PATH"], stand["DATA_PATHS"])
    with pytest.raises(InputFormatError, match="config.json"):
        md.check_paper_inputs(str(tmp_path), stand["ENCODER_PATH"], stand["DATA_PATHS"])


def test_llama_folder_as_encoder_rejected(stand):
    # issue 51: ENCODER_PATH accepted a Llama folder silently
    with pytest.raises(InputFormatError, match="ENCODER_PATH.*'llama'"):
        md.check_paper_inputs(stand["MODEL_PATH"], stand["MODEL_PATH"], stand["DATA_PATHS"])


def test_encoder_folder_as_model_rejected(stand):
    with pytest.raises(InputFormatError, match="MODEL_PATH.*model_type"):
        md.check_paper_inputs(stand["ENCODER_PATH"], stand["ENCODER_PATH"], stand["DATA_PATHS"])


def test_wrong_field_and_layout(stand, tmp_path):
    bad = tmp_path / "metamathqa.jsonl"
    bad.write_text(json.dumps({"question": "1+1?", "response": "2"}) + "\n")
    with pytest.raises(InputFormatError, match="DATA_PATHS.*metamathqa.jsonl.*'query'"):
        md.check_paper_inputs(stand["MODEL_PATH"], stand["ENCODER_PATH"], {**stand["DATA_PATHS"], "metamathqa": bad})
    with pytest.raises(InputFormatError, match="keys"):
        md.check_paper_inputs(stand["MODEL_PATH"], stand["ENCODER_PATH"], {"slimorca": stand["DATA_PATHS"]["slimorca"]})
    orca = tmp_path / "orca.jsonl"
    orca.write_text(json.dumps({"conversations": [{"from": "human", "value": "hi"}]}) + "\n")
    with pytest.raises(InputFormatError, match="gpt turn"):
        md.check_paper_inputs(stand["MODEL_PATH"], stand["ENCODER_PATH"], {**stand["DATA_PATHS"], "slimorca": orca})


def test_cache_identity_changes_with_model_and_data(stand, tmp_path):
    base = md.paper_cache_identity(stand["MODEL_PATH"], stand["DATA_PATHS"])
    assert base == md.paper_cache_identity(stand["MODEL_PATH"], stand["DATA_PATHS"])
    model2 = shutil.copytree(stand["MODEL_PATH"], tmp_path / "llama2")
    from moelab import standins as shared
    shared.tiny_llama(model2, seed=1)  # same width, other weights
    assert md.paper_cache_identity(model2, stand["DATA_PATHS"])["model_identity"] != base["model_identity"]
    data2 = tmp_path / "magicoder.jsonl"
    rows = open(stand["DATA_PATHS"]["magicoder"]).read().splitlines()
    data2.write_text("\n".join(rows[:-1] + [json.dumps({"instruction": "x", "response": "y"})]) + "\n")
    ident = md.paper_cache_identity(stand["MODEL_PATH"], {**stand["DATA_PATHS"], "magicoder": data2})
    assert ident["data_identity"] != base["data_identity"]


@pytest.mark.slow
def test_dry_run_end_to_end_on_the_standins(stand, tmp_path, monkeypatch):
    """The runner's dry run of notebook 01 on the stand-ins reaches run.finish() through every paper-path cell: the
    trunk holds no states (every block adapted), the user's model gets its own scorecard, every paper row says
    `dry run`. ~50 s alone on the 2-core reference machine (CI also runs it through `make dry-run`)."""
    from moelab import standins as shared
    from moelab.runner import cli

    monkeypatch.setattr(cli, "RUNS", tmp_path / "runs")
    monkeypatch.setenv("MOELAB_SCRATCH", str(tmp_path / "scratch"))
    argv = ["run", "--profile", "paper", "--dry-run", "--only", "01", "--no-progress", "--params",
            shared.params_text(stand)]
    assert cli.main(argv) == 0
    out = tmp_path / "scratch" / "paper" / "01_moce"
    card = (out / "table1_scorecard.csv").read_text()
    assert card.startswith("model,task") and "moelab_bb_" in card
    rows = json.loads((out / "claims.json").read_text())
    rows = rows if isinstance(rows, list) else rows["claims"]
    assert {r["verdict"] for r in rows} <= {"dry run", "extension"} and sum(r["verdict"] == "dry run" for r in rows) > 20
    nb = (tmp_path / "runs" / "paper" / "01_moce.ipynb").read_text()
    assert "(0.00 GiB of frozen-trunk states)" in nb and '"ename"' not in nb
