"""Notebook 04's paper profile (issue 51): dry-run config, early input errors, cache identity of user paths."""
from __future__ import annotations

import shutil

import pytest

from moelab.assets import MissingAsset
from moelab.cache import path_identity
from moelab.inputs import InputFormatError
from moelab.mass import config as mc
from moelab.mass import data as md


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    from moelab.mass.standins import write_glue
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
    from moelab.mass.experiment import task_digest
    assert task_digest(before) != task_digest(after)
    assert path_identity(g)["digest"] != path_identity(glue_dir)["digest"]
