"""Notebook 03's paper profile (issue 51): the open_clip checkpoint on transformers' CLIPModel against open_clip's
forward written out with ``nn.MultiheadAttention``, the image-text pairs reader, the early format errors, the cache
identity of CLIP_PATH and PAIRS_PATH, the dry-run configuration, resuming from a checkpoint, and the notebook's dry
run end to end on the stand-ins (``moelab.cluster_upcycling.standins``)."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from moelab import cache
from moelab.assets import MissingAsset
from moelab.cluster_upcycling import clip, config, standins
from moelab.cluster_upcycling.experiment import eesd_decay_for, training_settings
from moelab.inputs import InputFormatError

from helpers import ROOT


@pytest.fixture(scope="module")
def paper_inputs(tmp_path_factory):
    """The stand-ins of ``scripts/make_paper_standins.py`` (a tiny open_clip folder, CIFAR-10 image-text pairs)."""
    out = tmp_path_factory.mktemp("standins03")
    try:
        w = standins.write(out)
    except MissingAsset:
        pytest.skip("CIFAR-10 (BIG-bench) not in the asset cache")
    return w["params"]


def dry_cfg(**over) -> dict:
    c = config.config_for("paper", dry_run=True, **over)
    t = training_settings(c.fallback_training, c.fixed_training, c.fixed_training_source)
    return c.settings(0, t, eesd_decay_for(t["steps"]))


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


# ---------------------------------------------------------------- open_clip's forward, written out (the reference)
def _mha(sd, p, x, heads, mask=None):
    d = x.shape[-1]
    m = torch.nn.MultiheadAttention(d, heads, batch_first=True)
    m.load_state_dict({"in_proj_weight": sd[p + "attn.in_proj_weight"], "in_proj_bias": sd[p + "attn.in_proj_bias"],
                       "out_proj.weight": sd[p + "attn.out_proj.weight"], "out_proj.bias": sd[p + "attn.out_proj.bias"]})
    return m(x, x, x, need_weights=False, attn_mask=mask)[0]


def _resblocks(sd, prefix, x, heads, mask=None):
    """open_clip's ResidualAttentionBlock: x + attn(ln_1(x)); x + c_proj(gelu(c_fc(ln_2(x))))."""
    i, d = 0, x.shape[-1]
    while f"{prefix}{i}.ln_1.weight" in sd:
        p = f"{prefix}{i}."
        h = F.layer_norm(x, (d,), sd[p + "ln_1.weight"], sd[p + "ln_1.bias"], 1e-5)
        x = x + _mha(sd, p, h, heads, mask)
        h = F.layer_norm(x, (d,), sd[p + "ln_2.weight"], sd[p + "ln_2.bias"], 1e-5)
        x = x + F.linear(F.gelu(F.linear(h, sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"])),
                         sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"])
        i += 1
    return x


@torch.no_grad()
def openclip_encode_image(sd, img, heads):
    patch = sd["visual.conv1.weight"].shape[-1]
    x = F.conv2d(img, sd["visual.conv1.weight"], stride=patch).flatten(2).transpose(1, 2)  # [B, grid^2, d]
    cls = sd["visual.class_embedding"].expand(len(x), 1, -1)
    x = torch.cat([cls, x], 1) + sd["visual.positional_embedding"]
    d = x.shape[-1]
    x = F.layer_norm(x, (d,), sd["visual.ln_pre.weight"], sd["visual.ln_pre.bias"], 1e-5)
    x = _resblocks(sd, "visual.transformer.resblocks.", x, heads)
    x = F.layer_norm(x[:, 0], (d,), sd["visual.ln_post.weight"], sd["visual.ln_post.bias"], 1e-5)
    return x @ sd["visual.proj"]


@torch.no_grad()
def openclip_encode_text(sd, ids, heads):
    x = sd["token_embedding.weight"][ids] + sd["positional_embedding"][: ids.shape[1]]
    L, d = ids.shape[1], x.shape[-1]
    mask = torch.full((L, L), float("-inf")).triu_(1)
    x = _resblocks(sd, "transformer.resblocks.", x, heads, mask)
    x = F.layer_norm(x, (d,), sd["ln_final.weight"], sd["ln_final.bias"], 1e-5)
    return x[torch.arange(len(x)), ids.argmax(-1)] @ sd["text_projection"]  # the end-of-text token (largest id)


def test_openclip_checkpoint_is_the_same_network_on_transformers(paper_inputs):
    b = clip.load_clip(paper_inputs["CLIP_PATH"])
    sd, oc, _ = clip.read_openclip_state(paper_inputs["CLIP_PATH"])
    vc, tc = oc["model_cfg"]["vision_cfg"], oc["model_cfg"]["text_cfg"]
    img = torch.randn(3, 3, b.image_size, b.image_size)
    t = b.tokenizer(["a photo of a cat.", "a blurry photo of the airplane."], padding="max_length",
                    max_length=b.context_length, return_tensors="pt")
    with torch.no_grad():
        got_i = clip._image_embeds(b.model, img)
        got_t = clip._text_embeds(b.model, t["input_ids"], t["attention_mask"])
    torch.testing.assert_close(got_i, openclip_encode_image(sd, img, vc["width"] // vc["head_width"]),
                               atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got_t, openclip_encode_text(sd, t["input_ids"], tc["heads"]), atol=1e-5, rtol=1e-4)
    assert float(b.model.logit_scale.detach()) == pytest.approx(math.log(1 / 0.07), rel=1e-6)
    assert b.tokenizer.eos_token_id == max(b.tokenizer.get_vocab().values())  # CLIP: end-of-text is the largest id


def test_training_checkpoint_file_with_module_prefix_loads_the_same(paper_inputs, tmp_path):
    """open_clip's training script writes epoch_N.pt = {"epoch", "state_dict": {"module.<key>": ...}} (DDP)."""
    d = _copy(paper_inputs["CLIP_PATH"], tmp_path / "clip")
    sd = torch.load(d / "open_clip_pytorch_model.bin", weights_only=True)
    (d / "open_clip_pytorch_model.bin").unlink()
    torch.save({"epoch": 15, "state_dict": {"module." + k: v for k, v in sd.items()}}, d / "epoch_15.pt")
    a, b = clip.load_clip(paper_inputs["CLIP_PATH"]), clip.load_clip(d / "epoch_15.pt")
    assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))


# ---------------------------------------------------------------- early errors, each within seconds
def _fails_fast(exc, match, fn):
    t0 = time.perf_counter()
    with pytest.raises(exc, match=match) as e:
        fn()
    assert time.perf_counter() - t0 < 10
    return str(e.value)


def test_clip_path_errors_name_parameter_file_field_and_fix(paper_inputs, tmp_path):
    _fails_fast(MissingAsset, "CLIP_PATH", lambda: clip.load_clip(None))
    _fails_fast(MissingAsset, "no file or folder", lambda: clip.load_clip(tmp_path / "absent"))
    (tmp_path / "empty").mkdir()
    _fails_fast(InputFormatError, r"CLIP_PATH=.*open_clip_pytorch_model.bin.*Fix", lambda: clip.load_clip(tmp_path / "empty"))
    d = _copy(paper_inputs["CLIP_PATH"], tmp_path / "notok")
    (d / "vocab.json").unlink()
    _fails_fast(InputFormatError, r"no CLIP tokenizer.*vocab.json.*Fix", lambda: clip.load_clip(d))
    d = _copy(paper_inputs["CLIP_PATH"], tmp_path / "extra")
    sd = torch.load(d / "open_clip_pytorch_model.bin", weights_only=True)
    torch.save({**sd, "visual.attn_pool.query": torch.zeros(2, 2)}, d / "open_clip_pytorch_model.bin")
    _fails_fast(InputFormatError, r"keys this mapping does not know: \['visual.attn_pool.query'\]", lambda: clip.load_clip(d))
    torch.save({k: v for k, v in sd.items() if k != "visual.ln_post.weight"}, d / "open_clip_pytorch_model.bin")
    _fails_fast(InputFormatError, r"lacks \['vision_model.post_layernorm.weight'\]", lambda: clip.load_clip(d))
    torch.save({"visual.conv1.weight": torch.zeros(2)}, d / "open_clip_pytorch_model.bin")
    _fails_fast(InputFormatError, "not an open_clip ViT CLIP checkpoint", lambda: clip.load_clip(d))
    (d / "open_clip_pytorch_model.bin").write_text("not a checkpoint")
    _fails_fast(InputFormatError, "not a readable torch/safetensors checkpoint", lambda: clip.load_clip(d))


def test_quickgelu_is_refused_saying_what_is_missing(paper_inputs, tmp_path):
    d = _copy(paper_inputs["CLIP_PATH"], tmp_path / "qg")
    oc = json.loads((d / "open_clip_config.json").read_text())
    oc["model_cfg"]["quick_gelu"] = True
    (d / "open_clip_config.json").write_text(json.dumps(oc))
    msg = _fails_fast(NotImplementedError, "QuickGELU", lambda: clip.load_clip(d))
    assert "default and full profiles" in msg


def test_pairs_path_errors_name_parameter_file_field_and_fix(paper_inputs, tmp_path):
    cfg = dry_cfg()
    _fails_fast(MissingAsset, "PAIRS_PATH", lambda: clip.load_image_text_pairs(None, cfg))
    d = _copy(paper_inputs["PAIRS_PATH"], tmp_path / "p1")
    (d / "test.jsonl").unlink()
    _fails_fast(InputFormatError, r"PAIRS_PATH=.*no test.tsv, test.csv or test.jsonl.*Fix",
                lambda: clip.load_image_text_pairs(d, cfg))
    d = _copy(paper_inputs["PAIRS_PATH"], tmp_path / "p2")
    (d / "train.tsv").write_text((d / "train.tsv").read_text().replace("filepath\ttitle", "path\ttitle"))
    _fails_fast(InputFormatError, r"train.tsv.*no column filepath/image/file_name/image_path.*Fix: name the columns",
                lambda: clip.load_image_text_pairs(d, cfg))
    d = _copy(paper_inputs["PAIRS_PATH"], tmp_path / "p3")
    rows = (d / "test.jsonl").read_text().splitlines()
    (d / "test.jsonl").write_text("\n".join([rows[0].replace('"caption"', '"label"')] + rows[1:]) + "\n")
    _fails_fast(InputFormatError, r"test.jsonl.*record 1 has no field 'title' or 'caption' or 'text'",
                lambda: clip.load_image_text_pairs(d, cfg))
    d = _copy(paper_inputs["PAIRS_PATH"], tmp_path / "p4")
    (d / "images" / "test_0003.png").unlink()
    _fails_fast(InputFormatError, r"test.jsonl.*1 image\(s\) listed are not files.*test_0003.png",
                lambda: clip.load_image_text_pairs(d, cfg))
    d = _copy(paper_inputs["PAIRS_PATH"], tmp_path / "p5")
    (d / "images" / "train_0000.png").write_text("not a png")
    _fails_fast(InputFormatError, r"train_0000.png.*not a decodable image",
                lambda: clip.load_image_text_pairs(d, cfg))
    _fails_fast(InputFormatError, r"lists 16 distinct images, the profile evaluates n_test=5000",
                lambda: clip.load_image_text_pairs(paper_inputs["PAIRS_PATH"], dry_cfg(n_test=5000)))


def test_pairs_reader_both_formats_relative_and_absolute_paths(tmp_path):
    im = tmp_path / "a.png"
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(im)
    (tmp_path / "x.csv").write_text(f"image,caption\na.png,one\n{im},two\n")
    (tmp_path / "x.jsonl").write_text(json.dumps({"file_name": "a.png", "text": "one"}) + "\n")
    assert clip.read_pair_rows(tmp_path / "x.csv") == [(str(im), "one"), (str(im), "two")]
    assert clip.read_pair_rows(tmp_path / "x.jsonl") == [(str(im), "one")]


# ---------------------------------------------------------------- preprocessing, loss, retrieval (naive references)
def test_clip_pixels_resizes_the_shorter_side_crops_the_centre_and_normalises(tmp_path):
    x = np.zeros((40, 80, 3), np.uint8)  # H=40, W=80: resized to 16x32, the centre 16x16 kept
    x[:, 20:60] = 255                    # the middle half white -> the centre crop is all white
    Image.fromarray(x).save(tmp_path / "w.png")
    px = clip.clip_pixels(tmp_path / "w.png", 16, clip.OPENAI_MEAN, clip.OPENAI_STD)
    assert px.shape == (3, 16, 16)
    want = (1.0 - torch.tensor(clip.OPENAI_MEAN)) / torch.tensor(clip.OPENAI_STD)
    torch.testing.assert_close(px[:, 4:12, 4:12], want[:, None, None].expand(3, 8, 8), atol=1e-5, rtol=0)


def test_clip_loss_is_the_symmetric_cross_entropy_loop():
    g = torch.Generator().manual_seed(0)
    img, txt, ls = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g), torch.tensor(math.log(10.0))
    u, v = [[t / t.norm() for t in x] for x in (img, txt)]
    ref = 0.0
    for i in range(5):
        row = [10.0 * float(u[i] @ v[j]) for j in range(5)]
        col = [10.0 * float(v[i] @ u[j]) for j in range(5)]
        ref += 0.5 * (-(row[i] - math.log(sum(map(math.exp, row)))) - (col[i] - math.log(sum(map(math.exp, col)))))
    assert float(clip.clip_loss(img, txt, ls)) == pytest.approx(ref / 5, rel=1e-5)


def test_retrieval_hits_with_several_captions_per_image_equal_a_loop():
    g = torch.Generator().manual_seed(1)
    owner = torch.tensor([0, 0, 1, 2, 2, 2, 3])
    sim = torch.randn(4, 7, generator=g)
    got = clip.retrieval_hits(sim, owner)
    i2t = [float(owner[int(sim[i].argmax())] == i) for i in range(4)]
    t2i = [float(int(sim[:, j].argmax()) == owner[j]) for j in range(7)]
    assert got["a2p"].tolist() == i2t and got["p2a"].tolist() == t2i


# ---------------------------------------------------------------- the dry-run configuration
SIZES = {"seed_offsets", "n_test", "n_probe", "calib_texts", "calib_tokens", "fallback_training", "fixed_training",
         "num_workers", "ckpt_every", "eval_batch", "budget"}


def test_dry_run_cuts_only_sizes_and_keeps_every_switch():
    paper, dry = config.config_for("paper"), config.config_for("paper", dry_run=True)
    differ = {f for f in config.ClusterUpcyclingConfig.__dataclass_fields__ if getattr(paper, f) != getattr(dry, f)}
    assert differ <= SIZES and {"n_test", "fixed_training", "seed_offsets"} <= differ
    assert dry.methods == paper.methods == config.FULL_METHODS and len(dry.seed_offsets) >= 2
    assert dry.fixed_training["lr"] == paper.fixed_training["lr"] and dry.ckpt_every < dry.fixed_training["steps"]
    t = config.dry_run_table()
    assert set(t[t["cut"]].setting) == differ and set(config.DRY_RUN_KEEP) <= set(t.setting)
    with pytest.raises(ValueError, match="PROFILE='default'.*--dry-run"):
        config.config_for("default", dry_run=True)


def test_paper_profile_runs_the_experiment_at_the_posters_budget():
    """Issue 51: the paper profile ran no method (an empty list) and wrote only inconclusive claims."""
    p = config.config_for("paper")
    t = p.fixed_training
    assert p.methods == config.FULL_METHODS and len(p.seed_offsets) == 3 and p.n_test == 5000
    assert t["steps"] * t["batch_size"] >= 1.3e9  # "additional 1.3B seen samples" (claims.budget_regime)


# ---------------------------------------------------------------- cache identity of the user's paths
def test_changing_a_weight_or_a_data_row_rebuilds_the_cached_step(paper_inputs, tmp_path, monkeypatch):
    monkeypatch.setenv("MOELAB_CACHE", str(tmp_path / "cache"))
    cdir, pdir = _copy(paper_inputs["CLIP_PATH"], tmp_path / "clip"), _copy(paper_inputs["PAIRS_PATH"], tmp_path / "p")
    cfg = dry_cfg()

    def calibrate():
        built = cache.USAGE["built"]
        b, p = clip.load_clip(cdir), clip.load_image_text_pairs(pdir, cfg)
        clip.clip_calibration(b, p, cfg)
        return cache.USAGE["built"] - built, b.identity, p.identity

    n, ident_b, ident_p = calibrate()
    assert n == 1 and calibrate()[0] == 0  # built once, then reused
    sd = torch.load(cdir / "open_clip_pytorch_model.bin", weights_only=True)
    sd["visual.transformer.resblocks.0.mlp.c_fc.weight"][0, 0] += 1.0  # same shapes, another model
    torch.save(sd, cdir / "open_clip_pytorch_model.bin")
    n, ident_b2, _ = calibrate()
    assert n == 1 and ident_b2 != ident_b
    rows = (pdir / "train.tsv").read_text().splitlines()
    rows[1] = rows[1].replace("\t", "\tanother caption: ", 1)
    (pdir / "train.tsv").write_text("\n".join(rows) + "\n")
    n, _, ident_p2 = calibrate()
    assert n == 1 and ident_p2 != ident_p


# ---------------------------------------------------------------- resuming a stopped run from its checkpoint
def test_a_run_resumed_from_its_checkpoint_ends_as_the_uninterrupted_run(paper_inputs, tmp_path):
    cfg = dry_cfg()
    b, p = clip.load_clip(paper_inputs["CLIP_PATH"]), clip.load_image_text_pairs(paper_inputs["PAIRS_PATH"], cfg)
    calib, special = clip.clip_calibration(b, p, cfg)
    probe = p.test_images[:cfg["n_probe"]]
    ck = tmp_path / "ck"
    full = clip.run_clip_condition(b, "cluster_eesd", 0, p, probe, calib, special, cfg, ckpt_dir=ck)
    assert sorted(x.name for x in ck.iterdir()) == ["step_0000002", "step_0000004"]
    shutil.rmtree(ck / "step_0000004")  # stopped after step 2
    resumed = clip.run_clip_condition(b, "cluster_eesd", 0, p, probe, calib, special, cfg, ckpt_dir=ck)
    assert full["resumed_from"] == 0 and resumed["resumed_from"] == 2
    np.testing.assert_allclose(resumed["history"]["loss"], full["history"]["loss"], rtol=1e-5)
    assert [r["step"] for r in resumed["entropy_heldout"]] == [r["step"] for r in full["entropy_heldout"]]
    np.testing.assert_allclose([r["routing_entropy"] for r in resumed["entropy_heldout"]],
                               [r["routing_entropy"] for r in full["entropy_heldout"]], rtol=1e-5)
    np.testing.assert_array_equal(resumed["r1"]["a2p"], full["r1"]["a2p"])


@pytest.mark.cuda
def test_eesd_run_on_the_gpu(paper_inputs):
    """The EESD teachers are copied after the model moved to the GPU (they were left on the CPU before)."""
    cfg = dry_cfg()
    b, p = clip.load_clip(paper_inputs["CLIP_PATH"]), clip.load_image_text_pairs(paper_inputs["PAIRS_PATH"], cfg)
    calib, special = clip.clip_calibration(b, p, cfg)
    r = clip.run_clip_condition(b, "cluster_eesd", 0, p, p.test_images[:8], calib, special, cfg)
    assert len(r["history"]) == cfg["steps"] and np.isfinite(r["history"]["eesd"]).all()


# ---------------------------------------------------------------- the notebook's dry run, end to end
@pytest.mark.slow
def test_notebook_dry_run_reaches_finish_on_the_standins(paper_inputs, tmp_path):
    env = {**os.environ, "MOELAB_CACHE": str(tmp_path / "cache"), "MOELAB_PROGRESS": "0",
           "PYTHONPATH": str(ROOT / "lib")}
    params = " ".join(f"{k}={v!r}" for k, v in paper_inputs.items())
    r = subprocess.run([sys.executable, "-m", "moelab.runner", "run", "--profile", "paper", "--dry-run", "--only",
                        "03", "--no-progress", "--params", params], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = ROOT / "runs" / "scratch" / "paper" / "03_cluster_upcycling"
    claims = json.loads((out / "claims.json").read_text())
    rows = claims["claims"] if isinstance(claims, dict) else claims
    assert {c["verdict"] for c in rows} <= {"dry run", "extension"} and len(rows) > 20
    runs = pd.read_csv(out / "table1_runs.csv")
    assert set(runs["method"]) == set(config.FULL_METHODS) and (runs.loc[runs.method != "dense", "steps"] == 4).all()
