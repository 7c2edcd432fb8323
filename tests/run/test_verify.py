"""`make verify`: a cold rerun compared with the committed claims; `run --cold`."""
import os

import pytest

from moelab import cache
from moelab.runner import cli


def _claims(*rows):
    return {"claims": [dict(id=i, claim=i, verdict=v, ours=o, ci_low=lo, ci_high=hi) for i, v, o, lo, hi in rows]}


def test_compare_claims_statuses():
    committed = _claims(("a", "reproduced", 1.0, 0.5, 1.5), ("b", "inconclusive", 0.1, -0.2, 0.4),
                        ("c", "holds by construction", 1.0, None, None), ("d", "not testable", None, None, None),
                        ("gone", "inconclusive", 0.0, -1, 1))
    fresh = _claims(("a", "reproduced", 1.4, 0.9, 1.9), ("b", "reproduced", 0.6, 0.3, 0.9),
                    ("c", "holds by construction", 1.0 + 5e-4, None, None), ("d", "not testable", None, None, None),
                    ("added", "inconclusive", 0.0, -1, 1))
    st = {r["claim"]: r["status"] for r in cli.compare_claims(committed, fresh)}
    assert st == {"a": "ok", "b": "flipped", "c": "ok", "d": "ok", "gone": "missing", "added": "new"}
    fresh["claims"][0]["ours"] = 1.6                     # same verdict, number outside the committed interval
    fresh["claims"][2]["ours"] = 1.01                    # deterministic number beyond the float tolerance
    st = {r["claim"]: r["status"] for r in cli.compare_claims(committed, fresh)}
    assert st["a"] == "outside" and st["c"] == "outside"
    report = cli.verify_report("00_x", "default", cli.compare_claims(committed, fresh), "abc")
    assert "| b | inconclusive | reproduced |" in report and "differ" in report


def test_cold_cache_links_assets_but_not_artifacts(tmp_path):
    real = tmp_path / "real"
    (real / "artifacts" / "kind").mkdir(parents=True)
    (real / "models").mkdir()
    (real / "models" / "m.bin").write_text("w")
    cold = cli.cold_cache(tmp_path / "cold", real)
    assert (cold / "models" / "m.bin").read_text() == "w" and not (cold / "artifacts").exists()
    (cold / "artifacts").mkdir()                          # built by the rerun: stays out of the real cache
    assert not (real / "artifacts" / "kind" / "x").exists() and (real / "artifacts" / "kind").is_dir()


def test_wall_time_claims_compare_by_verdict_only():
    committed = {"claims": [dict(id="t", claim="t", unit="log10 seconds", verdict="reproduced", ours=-0.9,
                                 ci_low=-0.92, ci_high=-0.88)]}
    fresh = {"claims": [dict(committed["claims"][0], ours=-0.7, ci_low=-0.75, ci_high=-0.65)]}
    assert cli.compare_claims(committed, fresh)[0]["status"] == "ok"
    fresh["claims"][0]["verdict"] = "inconclusive"
    assert cli.compare_claims(committed, fresh)[0]["status"] == "flipped"


def test_cold_run_builds_into_an_empty_cache_then_adopts_what_it_built(tmp_path, monkeypatch):
    real = tmp_path / "real"
    with cache.atomic_dir(real / "artifacts" / "kind" / "kept") as d:  # an entry the real cache has stays as it is
        (d / "v.txt").write_text("real")
    monkeypatch.setenv("MOELAB_CACHE", str(real))
    with pytest.raises(RuntimeError, match="cell failed"):
        with cli.cold_run(tmp_path / "cold") as cold:
            assert os.environ["MOELAB_CACHE"] == str(cold) and not (cold / "artifacts").exists()
            for name, text in (("new", "built"), ("kept", "cold copy")):
                with cache.atomic_dir(cold / "artifacts" / "kind" / name) as d:
                    (d / "v.txt").write_text(text)
            (cold / "artifacts" / "kind" / "half").mkdir()  # a killed build: no marker, not adopted
            raise RuntimeError("cell failed")                # entries built before a failure are still adopted
    assert os.environ["MOELAB_CACHE"] == str(real) and not (tmp_path / "cold").exists()
    got = real / "artifacts" / "kind"
    assert (got / "new" / "v.txt").read_text() == "built" and cache.is_complete(got / "new")
    assert (got / "kept" / "v.txt").read_text() == "real" and not (got / "half").exists()
    assert cache.adopt_entries(tmp_path / "nothing", got.parent) == 0


def test_a_wall_clock_ratio_whose_number_reproduces_is_not_a_flip():
    """02's training cost (% of the linear arm's s/step): committed inconclusive (interval 90-118 wider than the
    +-10 tolerance), rerun reproduced (a narrower interval, the number 101 inside the committed one). The number
    reproduced; the verdict moved with the load: 'ok: wall clock', counted as agreeing. Outside the interval, or a
    claim not measured in wall time, it is a flip as before."""
    c = dict(id="cost", claim="c", unit="% of the linear arm's s/step", verdict="inconclusive", ours=104.4,
             ci_low=90.3, ci_high=118.5)
    committed = {"claims": [c]}
    fresh = {"claims": [dict(c, verdict="reproduced", ours=101.1, ci_low=95.0, ci_high=107.0)]}
    row = cli.compare_claims(committed, fresh)[0]
    assert row["status"] == "ok: wall clock" and cli.agrees(row)
    assert "1 of 1 claims agree." in cli.verify_report("02", "default", [row], "abc")
    fresh["claims"][0]["ours"] = 125.0                        # outside the committed interval
    assert cli.compare_claims(committed, fresh)[0]["status"] == "flipped"
    other = {"claims": [dict(c, unit="points (x100)")]}        # not a wall-clock unit: a flip stays a flip
    assert cli.compare_claims(other, {"claims": [dict(fresh["claims"][0], ours=101.1, unit="points (x100)")]}
                              )[0]["status"] == "flipped"
