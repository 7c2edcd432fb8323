"""Notebook 05's sizes per profile (paper 004, Free-MoE): one frozen dataclass, one instance per profile (``smoke``,
``default``, ``full``, ``paper``). The notebook's derived-settings cell reads :func:`config_for`, and its profile
table is printed from :func:`profile_table`, so the table cannot drift from what runs.

Selection follows the paper's appendix (Tables 6-10): bands from its 50-100% grid (``APPENDIX_BANDS``; ``default``
takes 50-55, 75-80 and 95-100, ``full`` and ``paper`` all ten); Wanda's 0-5% is swept as a baseline row, never
selectable. Cost model and tuning notes: docs/free-moe-settings.md.
Every cluster is selected on at least ``min_ref`` held-out reference items of its own task type; where a pool cannot
fill ``n_ref_cluster`` items in each of ``K`` clusters, fewer clusters are used (the cluster table says which)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import pandas as pd

from moelab.free_moe.method import APPENDIX_BANDS
from moelab.profiles import check_profile

__all__ = ["FreeMoeConfig", "CONFIGS", "DRY_RUN_SIZES", "config_for", "profile_table", "GROUPS", "MIN_REF"]

MIN_REF = 40                     # reference items per cluster, at least
# selection groups: (main domain, task type). MC selects for MC, generative (answer likelihood) for generative
GROUPS = (("general", "mc"), ("maths", "mc"), ("maths", "gen"), ("code", "gen"))


@dataclass(frozen=True)
class FreeMoeConfig:
    """Every size notebook 05 uses. Reference items are drawn per group from held-out pools (validation splits,
    then training items past the router's); ``n_ref_cluster`` of them per cluster (>= ``min_ref``)."""
    profile: str
    max_general: int                       # general-domain BIG-bench MC tasks
    K: dict                                # clusters requested per group "domain-type"
    n_ref_cluster: int                     # reference items per cluster (selection)
    pool_per_task: int                     # reference pool per task the clusters are filled from
    n_test: int                            # held-out test items per MC / GSM task
    code_test: int                         # HumanEval canonical solutions (answer likelihood)
    n_he: int                              # HumanEval problems for pass@k (greedy if he_n == 1)
    he_n: int
    he_tokens: int
    n_train: int                           # router training items per task
    code_train: int
    bands: tuple                           # selectable bands (the paper's 50-100% grid)
    calib_tokens: int
    patch: int
    ratios: tuple                          # Table 2 purification ratios beside the selected band's 5%
    n_probe: int                           # off-domain probe items per task (extension)
    n_sweep: int                           # test items per task also swept (paper's test-selected row); 0 = off
    n_hook: int                            # items of the lm-eval request-hook check
    ablate_sublayers: bool = False
    ablate_patch: tuple = ()
    ablate_K: tuple = ()
    ablate_bands: tuple = ()               # bands of the Tables 3-5 re-selections (empty: ``bands``)
    readings: tuple = ()
    gemma: bool = False
    gemma_K: int = 1
    gemma_test: int = 0
    gemma_bands: tuple = ()
    device: str = "cpu"                    # "auto": CUDA when present (paper profile)
    batch: int = 16
    min_ref: int = MIN_REF
    max_code_chars: int = 0                # smoke only: code reference answers at most this long (0 = any)
    card_items: int = 0                    # scorecard items per task measured on this run's model (0: read the
    #                                        committed data/scorecard.csv, which holds SmolLM2 and Gemma-3 only)
    n_candidates: int = 6                  # general tasks chosen from (data.GENERAL_CANDIDATES[:n], all 6) and,
    #                                        with card_items, scored by the run's scorecard
    budget: str = ""

    def __post_init__(self):
        check_profile(self.profile)
        if self.n_ref_cluster < self.min_ref:
            raise ValueError(f"n_ref_cluster={self.n_ref_cluster} < min_ref={self.min_ref}: select on at least "
                             f"{self.min_ref} reference items per cluster")
        bad = [b for b in self.bands if b not in APPENDIX_BANDS]
        if bad:
            raise ValueError(f"bands {bad} are not on the paper's 50-100% grid {APPENDIX_BANDS}")
        if not self.max_general <= self.n_candidates:
            raise ValueError(f"n_candidates={self.n_candidates} < max_general={self.max_general}: choose the general "
                             "tasks from at least max_general candidates")
        if self.card_items < 0:
            raise ValueError(f"card_items={self.card_items}: expected 0 (committed scorecard) or items per task")
        if self.device not in ("cpu", "auto"):
            raise ValueError(f"device={self.device!r}: expected 'cpu' or 'auto'")

    def k_of(self, group: str) -> int:
        return int(self.K.get(group, 1))

    def grid_bands(self, which: str = "bands") -> tuple:
        return tuple(getattr(self, which) or self.bands)


_EVERY_FIFTH = (APPENDIX_BANDS[0], APPENDIX_BANDS[5], APPENDIX_BANDS[9])       # 50-55, 75-80, 95-100
_COARSE = (APPENDIX_BANDS[0], APPENDIX_BANDS[9])                                              # 50-55, 95-100
_READINGS = (("matrix", "remove"), ("row", "keep"))
_K2 = {"general-mc": 2, "maths-mc": 2, "maths-gen": 2, "code-gen": 1}

CONFIGS = {
    "smoke": FreeMoeConfig(
        profile="smoke", max_general=1, K={"general-mc": 2, "maths-mc": 1, "maths-gen": 1, "code-gen": 1},
        n_ref_cluster=4, pool_per_task=12, n_test=4, code_test=2, n_he=1, he_n=1, he_tokens=16, n_train=24,
        code_train=24, bands=_COARSE[1:], calib_tokens=128, patch=16, ratios=(1.0,), n_probe=2, n_sweep=1, n_hook=2,
        ablate_sublayers=True, ablate_patch=(4,), ablate_K=(1,), ablate_bands=_COARSE[1:], readings=_READINGS[:1],
        batch=16, min_ref=4, max_code_chars=200,
        budget="< 3 min (integration test: 4 reference items per cluster, mechanics only)"),
    "default": FreeMoeConfig(
        profile="default", max_general=2, K=_K2, n_ref_cluster=40, pool_per_task=160, n_test=80, code_test=60,
        n_he=4, he_n=1, he_tokens=96, n_train=60, code_train=150, bands=_EVERY_FIFTH, calib_tokens=1024, patch=1,
        ratios=(1.0, 3.0), n_probe=12, n_sweep=0, n_hook=8, budget="<= 30 min cold on 2 cores"),
    "full": FreeMoeConfig(
        profile="full", max_general=2, K={"general-mc": 3, "maths-mc": 3, "maths-gen": 3, "code-gen": 2},
        n_ref_cluster=40, pool_per_task=240, n_test=120, code_test=120, n_he=4, he_n=10, he_tokens=96, n_train=60,
        code_train=200, bands=APPENDIX_BANDS, calib_tokens=2048, patch=1, ratios=(1.0, 3.0), n_probe=16, n_sweep=8,
        n_hook=8, ablate_sublayers=True, ablate_patch=(4, 16), ablate_K=(1, 4), ablate_bands=_COARSE,
        readings=_READINGS, gemma=True, gemma_K=1, gemma_test=24, gemma_bands=_COARSE,
        budget="<= 2 h on 2 cores (estimate); resumable band by band (each band's reference scores are cached)"),
    "paper": FreeMoeConfig(
        profile="paper", max_general=4, K={"general-mc": 12, "maths-mc": 8, "maths-gen": 8, "code-gen": 3},
        n_ref_cluster=60, pool_per_task=2000, n_test=500, code_test=164, n_he=164, he_n=10, he_tokens=256,
        n_train=300, code_train=300, bands=APPENDIX_BANDS, calib_tokens=8192, patch=1, ratios=(1.0, 3.0),
        n_probe=100, n_sweep=150, n_hook=8, ablate_sublayers=True, ablate_patch=(2, 4, 16), ablate_K=(10, 12, 14),
        ablate_bands=APPENDIX_BANDS, readings=_READINGS, device="auto", batch=8, card_items=300,
        budget="GPU when present (device='auto'); the paper's K per domain; one seed (test items are the unit of "
               "replication: one pretrained model with and without a mask); the scorecard measured on MODEL_PATH "
               "(the committed one's item counts); Llama-2-7b: about 2 h of GPU work plus 10-22 h of host-side mask "
               "handling, 12-24 h on one H100 machine (estimate, docs/paper-scale.md)"),
}

# The paper profile's dry run (issue 51): the paper configuration with sizes cut to the least that runs every code
# path of its notebook (every cell, each ablation table, pass@10 with 10 samples, the test-selected sweep, K > 1 in
# the general group, both band readings, the scorecard measured on the model); the switches (ablations on, readings,
# patch 1, device "auto", no Gemma-3 rows) are the paper's. On a 2-layer stand-in it takes about a minute on 2 cores.
DRY_RUN_SIZES = dict(
    max_general=1, K={"general-mc": 2, "maths-mc": 1, "maths-gen": 1, "code-gen": 1}, n_ref_cluster=4,
    pool_per_task=12, n_test=4, code_test=2, n_he=1, he_tokens=8, n_train=24, code_train=24, bands=_COARSE,
    calib_tokens=128, n_probe=2, n_sweep=1, n_hook=2, ablate_patch=(2,), ablate_K=(2,), ablate_bands=_COARSE[1:],
    min_ref=4, max_code_chars=200, card_items=4, n_candidates=2,
    budget="dry run: about 1 min on 2 CPU cores on the stand-in (sizes only; no number is evidence)")


def config_for(profile: str, dry_run: bool = False, **overrides) -> FreeMoeConfig:
    """The frozen configuration of ``profile`` (``overrides`` replace fields, e.g. in tests). ``dry_run`` (paper
    profile only): the paper configuration with the sizes of ``DRY_RUN_SIZES`` (``moelab.profiles.dry_run_table``
    lists what that cuts)."""
    check_profile(profile)
    cfg = CONFIGS[profile]
    if dry_run:
        if profile != "paper":
            raise ValueError(f"dry_run=True is for the paper profile, got profile={profile!r}: run "
                             "python -m moelab.runner run --profile paper --dry-run --only 05")
        cfg = replace(cfg, **DRY_RUN_SIZES)
    return replace(cfg, **overrides) if overrides else cfg


def profile_table(paper: dict | None = None) -> pd.DataFrame:
    """One row per setting, one column per profile (and the paper's own setting first, when given): the profile
    table of notebook 05's introduction."""
    def fmt(v):
        if isinstance(v, dict):
            return ", ".join(f"{k} {x}" for k, x in v.items())
        if isinstance(v, tuple) and v and isinstance(v[0], tuple):
            return ", ".join(f"{a:g}-{b:g}%" if isinstance(a, float) else f"{a}/{b}" for a, b in v) or "-"
        if isinstance(v, tuple):
            return ", ".join(map(str, v)) or "-"
        return str(v)
    cols = {p: {k: fmt(v) for k, v in asdict(c).items() if k != "profile"} for p, c in CONFIGS.items()}
    df = pd.DataFrame(cols)
    if paper:
        df.insert(0, "paper (004)", pd.Series(paper).reindex(df.index).fillna(""))
    return df.rename_axis("setting").reset_index()
