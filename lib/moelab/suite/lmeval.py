"""LM evaluation through lm-eval 0.4.13, offline, on an in-memory model.

``evaluate(model, tokenizer, tasks, limit, request_hook=None)`` runs the task YAMLs of ``data/lm_tasks/`` with
``TaskManager(include_path=data/lm_tasks, include_defaults=False)`` and ``simple_evaluate`` on lm-eval's
``HFLM`` wrapped around the given model object, and returns per-item scores (task, item_id, metric, score).

Tasks (``TASKS``):
- ``moelab_math_mc``: BIG-bench elementary_math_qa, 5 options, accuracy of the highest log-likelihood option;
- ``moelab_gsm``: GSM8K-style problems from held-out templates, 2-shot, greedy, exact match of the final number;
- ``moelab_humaneval``: HumanEval greedy pass@1, each completion run with its tests in ``sandbox.run_code``;
  ``humaneval_pass_at_k`` samples n completions per problem for the unbiased pass@k (Chen et al. 2021);
- ``moelab_bb_<task>``: BIG-bench reasoning/knowledge multiple choice (acc and length-normalised acc_norm);
- ``moelab_nll_{maths,code,reasoning}``: bits per byte of the reference answer given the instruction
  (``bpb = -log2 p(answer | instruction) / bytes(answer)``; lower is better).

Every profile evaluates a fixed prefix of each task's seeded evaluation pool (``limit``). Log-likelihood requests
are scored by ``moelab.suite.scorer`` through :class:`FastHFLM` (lm-eval model ``"moelab-fast"``): HFLM's
tokenisation and numbers, continuation-only logits, one context pass per multiple-choice item. The request hook
(MoCE notebook 01: pick the sequence cluster's router) is called with each request's context text just before
that request is scored (requests then run one at a time), or, if it has ``for_batch(contexts)``, entered around
every batched forward pass.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
from pathlib import Path

from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from moelab import assets, profiles, progress
from moelab.stats import bootstrap_ci
from moelab.suite import instruct, mathgen, sandbox, scorer
from moelab.suite.encoding import encode_pair

TASK_DIR = Path(__file__).resolve().parents[3] / "data" / "lm_tasks"
MC_TASKS = {"math_mc": "elementary_math_qa/question_only"}
for _t in ["date_understanding", "logical_deduction/three_objects", "logical_deduction/five_objects",
           "tracking_shuffled_objects/three_objects", "hyperbaton", "formal_fallacies_syllogisms_negation", "navigate",
           "causal_judgment", "temporal_sequences", "reasoning_about_colored_objects", "penguins_in_a_table",
           "disambiguation_qa", "winowhy", "sports_understanding"]:
    MC_TASKS["bb_" + _t.replace("/", "_")] = _t
TASKS = sorted([f"moelab_{k}" for k in MC_TASKS] + ["moelab_gsm", "moelab_humaneval", "moelab_nll_maths",
                                                    "moelab_nll_code", "moelab_nll_reasoning"])
PRIMARY_METRIC = {t: "acc" for t in TASKS} | {"moelab_gsm": "exact_match", "moelab_humaneval": "pass@1",
                                              "moelab_nll_maths": "bpb", "moelab_nll_code": "bpb",
                                              "moelab_nll_reasoning": "bpb"}
MODEL_NAME = "moelab-fast"   # lm-eval model name of FastHFLM
LIMITS = {"smoke": 5, "default": 200, "full": None, "paper": None}
HUMANEVAL_TIMEOUT_S, HUMANEVAL_MEMORY_MB = 5.0, 512


def limit_for(profile: str):
    """Items per task for a profile (the fixed prefix of each evaluation pool)."""
    return LIMITS[profiles.check_profile(profile)]


# ------------------------------------------------------------------ task data
def _gsm_prompt(question: str, shots: list[dict]) -> str:
    demo = "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)
    return demo + f"Question: {question}\nAnswer:"


def option_order_text(item: dict) -> str:
    """An item's option order as text (``"2 0 1"``: ``choices[j] = source_choices[order[j]]``), the fingerprint
    that per-item scores carry so a score is never compared with a differently ordered prompt."""
    return " ".join(str(int(i)) for i in item["option_order"])


@functools.lru_cache(maxsize=None)
def task_docs(name: str) -> tuple:
    """The documents of one task (``name`` as in the YAML's ``dataset_kwargs.name``), in evaluation order."""
    if name in MC_TASKS:
        items = instruct.task_splits(MC_TASKS[name])["test"]
        # options in each item's seeded order (bigbench.option_order), recorded per doc
        return tuple(dict(id=it["id"], prompt=it["prompt"], choices=it["choices"], gold=it["gold"],
                          option_order=option_order_text(it)) for it in items)
    if name == "gsm":
        g = instruct.gsm_splits()
        shots = [g["train"][0], g["train"][len(g["train"]) // 2]]
        return tuple(dict(id=p["id"], prompt=_gsm_prompt(p["question"], shots), number=p["number"],
                          question=p["question"]) for p in g["test"])
    if name in ("humaneval", "nll_code"):
        probs = assets.humaneval_problems()
        if name == "humaneval":
            return tuple(dict(id=k, prompt=p["prompt"], entry_point=p["entry_point"], test=p["test"])
                         for k, p in probs.items())
        return tuple(dict(id=k, context=p["prompt"], continuation=p["canonical_solution"]) for k, p in probs.items())
    if name == "nll_maths":
        return tuple(dict(id=p["id"], context=f"Question: {p['question']}\nAnswer:", continuation=" " + p["answer"])
                     for p in instruct.gsm_splits()["test"])
    if name == "nll_reasoning":
        # interleave the reasoning tasks so that any prefix covers all of them
        per_task = [instruct.task_splits(t)["test"] for t in instruct.REASONING_TRAIN_TASKS + instruct.REASONING_HELDOUT_TASKS]
        out = []
        for i in range(max(len(x) for x in per_task)):
            for x in per_task:
                if i < len(x):
                    it = x[i]
                    out.append(dict(id=it["id"], context=it["prompt"], continuation=" " + it["choices"][it["gold"]],
                                    option_order=option_order_text(it)))
        return tuple(out)
    raise ValueError(f"unknown moelab lm task data {name!r}")


def task_dataset(name: str):
    """``datasets.DatasetDict({"test": ...})`` for lm-eval's ``custom_dataset`` hook."""
    import datasets

    docs = list(task_docs(name))
    if not docs:
        raise ValueError(f"moelab lm task {name!r} has an empty test split")
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


# ------------------------------------------------------------------ scorers
def score_nll(doc, results) -> dict:
    """bits per byte of the continuation: ``-ll / ln 2 / bytes``."""
    ll = results[0][0] if isinstance(results[0], (tuple, list)) else results[0]
    n_bytes = max(1, len(doc["continuation"].encode("utf-8")))
    return {"bpb": float(-ll / math.log(2) / n_bytes)}


def score_gsm(doc, results) -> dict:
    pred = mathgen.final_number(results[0].split("Question:")[0])
    return {"exact_match": float(pred is not None and pred == doc["number"])}


def score_humaneval(doc, results) -> dict:
    program = sandbox.humaneval_program(doc, results[0])
    r = sandbox.run_code(program, timeout=HUMANEVAL_TIMEOUT_S, memory_mb=HUMANEVAL_MEMORY_MB)
    return {"pass@1": float(r.passed)}


# ------------------------------------------------------------------ evaluation
def _task_manager():
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASK_DIR), include_defaults=False)


def _hook_scope(hook, context: str):
    """The hook's state for one request: ``hook.for_batch([context])`` if it has one, else ``hook(context)``."""
    if getattr(hook, "for_batch", None) is not None:
        return hook.for_batch([context])
    hook(context)
    return contextlib.nullcontext()


@register_model(MODEL_NAME)
class FastHFLM(HFLM):
    """lm-eval's ``HFLM`` whose log-likelihood requests go through ``moelab.suite.scorer``.

    Tokenisation (context/continuation split, BOS and prefix token, rolling windows) and generation are HFLM's own,
    inherited; only ``_loglikelihood_tokens`` is replaced, so per-request numbers equal HFLM's (tested) at a fraction of
    the cost. Registered as ``"moelab-fast"``: ``lm_eval.simple_evaluate(model="moelab-fast",
    model_args="pretrained=<folder>")`` works once ``moelab.suite.lmeval`` is imported.

    ``request_hook(context)``: called before scoring each request's context. A hook with a ``for_batch(contexts)``
    attribute returning a context manager is entered around every forward pass with the contexts of its rows, so
    requests stay batched; a plain hook makes each request run alone, right after its hook call (the old behaviour).
    Request bars follow ``moelab.progress`` (off with ``MOELAB_PROGRESS=0``).
    """

    def __init__(self, *args, request_hook=None, **kwargs):
        super().__init__(*args, **kwargs)
        if request_hook is not None and not callable(request_hook):
            raise ValueError(f"request_hook must be callable, got {request_hook!r}")
        self.request_hook = request_hook

    def _scorer_batch_size(self) -> int:
        bs = self.batch_size
        return bs if isinstance(bs, int) and bs > 0 else scorer.DEFAULT_BATCH_SIZE

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None):
        hook = self.request_hook
        if self.backend != "causal":
            raise ValueError(f"{MODEL_NAME} scores causal LMs only (backend {self.backend!r}): use model='hf'")
        toks = [(ctx, cont) for _, ctx, cont in requests]
        kw = dict(batch_size=self._scorer_batch_size(), max_length=self.max_length)
        if hook is None or getattr(hook, "for_batch", None) is not None or any(r[0] is None for r in requests):
            batch_context = None
            if hook is not None and getattr(hook, "for_batch", None) is not None:
                ctx_of = [r[0][0] if r[0] is not None else "" for r in requests]
                batch_context = lambda rows, mask: hook.for_batch([ctx_of[i] for i in rows])
            res = scorer.loglikelihood_tokens(self.model, toks, batch_context=batch_context, **kw)
        else:   # a plain per-request hook: each request alone, after its hook call
            res = []
            for (req_str, _, _), t in zip(progress.bar(requests, desc="loglikelihood requests", unit="req"), toks):
                hook(req_str[0])
                res += scorer.loglikelihood_tokens(self.model, [t], share_context=False, **kw)
        for (req_str, _, _), ans in zip(requests, res):
            if req_str is not None:
                self.cache_hook.add_partial("loglikelihood", req_str, ans)
        return res

    def loglikelihood(self, requests, disable_tqdm=False):
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm or not progress.enabled())

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        hook = self.request_hook
        if hook is None:
            return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm or not progress.enabled())
        out = []
        for req in requests:    # the hook sees each document (rolling windows carry no context string)
            with _hook_scope(hook, req.args[0]):
                out += super().loglikelihood_rolling([req], disable_tqdm=True)
        return out

    def generate_until(self, requests, disable_tqdm=False):
        if self.request_hook is None:
            return super().generate_until(requests, disable_tqdm=disable_tqdm or not progress.enabled())
        out = []
        for req in progress.bar(requests, desc="generate_until requests", unit="req"):
            with _hook_scope(self.request_hook, req.args[0]):
                out += super().generate_until([req], disable_tqdm=True)
        return out


def _hflm(model, tokenizer, batch_size, request_hook):
    """The evaluation LM: :class:`FastHFLM` around the in-memory model."""
    return FastHFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, request_hook=request_hook)


def evaluate(model, tokenizer, tasks, limit=None, request_hook=None, batch_size: int = 8):
    """Per-item scores of ``model`` on moelab lm tasks: DataFrame (task, item_id, metric, score).

    ``tasks``: names from ``TASKS`` (or ``"all"``); ``limit``: items per task (first ``limit`` of the fixed pool;
    None = all); ``request_hook(context: str)``: called before each request is scored (may set model state).
    """
    import pandas as pd

    if tasks == "all":
        tasks = list(TASKS)
    if isinstance(tasks, str):
        tasks = [tasks]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"unknown lm task(s) {unknown or tasks!r}; known: {TASKS}")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive int or None, got {limit!r}")
    if request_hook is not None and not callable(request_hook):
        raise ValueError(f"request_hook must be callable, got {request_hook!r}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import lm_eval

    lm = _hflm(model, tokenizer, batch_size, request_hook)
    res = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), limit=limit, task_manager=_task_manager(),
                                  log_samples=True, bootstrap_iters=0, random_seed=0, numpy_random_seed=0,
                                  torch_random_seed=0, fewshot_random_seed=0, verbosity="ERROR")
    rows = []
    for task in tasks:
        for s in res["samples"][task]:
            for m in s["metrics"]:
                rows.append(dict(task=task, item_id=s["doc"]["id"], metric=m, score=float(s[m])))
    df = pd.DataFrame(rows, columns=["task", "item_id", "metric", "score"])
    if df.empty:
        raise ValueError(f"lm-eval returned no scored items for {tasks}")
    return df


def domain_nll(model, tok, items, batch_size: int = 1, batch_context=None):
    """Per-item negative log-likelihood and bits per byte of reference answers, through ``moelab.suite.scorer``.

    ``items``: list of ``dict(instruction, answer)`` (e.g. ``instruct.build(p)["test"]``) or (context, answer)
    pairs. Tokenisation: ``moelab.suite.encoding.encode_pair`` (context with the tokenizer's special tokens, answer
    with a leading space, tokenised apart), the helper MoCE's training uses too. Returns a
    DataFrame (nll = -sum log p(answer tokens | instruction) in nats, n_tokens, bpb). ``batch_size`` 1 (the old
    one-at-a-time passes) keeps per-sequence model state set for one sequence valid (MoCE's ``set_group_ids``); pass
    more where the model has none, or set the state per batch with ``batch_context(rows, attention_mask)``
    (``moelab.suite.scorer``; MoCE: ``moce.evaluate_runs``).
    """
    import pandas as pd

    pairs = [(it["instruction"], it["answer"]) if isinstance(it, dict) else tuple(it) for it in items]
    if not pairs:
        raise ValueError("domain_nll got no items")
    reqs = [encode_pair(tok, ctx, ans) for ctx, ans in pairs]   # the training tokenisation
    # batch_size 1 without batch_context: one sequence per forward pass, also for answers sharing an instruction
    res = scorer.loglikelihood_tokens(model, reqs, batch_size=batch_size, batch_context=batch_context,
                                      share_context=batch_size > 1 or batch_context is not None)
    rows = [dict(nll=-lp, n_tokens=len(r[1]), bpb=scorer.bits_per_byte(lp, ans))
            for (lp, _), r, (_, ans) in zip(res, reqs, pairs)]
    return pd.DataFrame(rows)


def humaneval_pass_at_k(model, tok, n: int = 10, ks=(1, 10), temperature: float = 0.8, limit=None,
                        max_new_tokens: int = 256, seed: int = 0):
    """Unbiased pass@k on HumanEval with ``n`` sampled completions per problem (Chen et al. 2021, Eq. 1).

    Returns a DataFrame (task_id, n, c, pass@k...) — one row per problem; the mean over rows is pass@k.
    """
    import pandas as pd
    import torch

    if any(k > n for k in ks):
        raise ValueError(f"every k in {ks} must be <= n={n}")
    docs = list(task_docs("humaneval"))[:limit]
    stops = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```"]
    torch.manual_seed(seed)
    rows = []
    for d in progress.bar(docs, desc="HumanEval pass@k", unit="problem"):
        enc = tok(d["prompt"], return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=temperature, max_new_tokens=max_new_tokens,
                                 num_return_sequences=n, pad_token_id=tok.pad_token_id or tok.eos_token_id)
        c = 0
        for seq in out:
            text = tok.decode(seq[enc["input_ids"].shape[1]:], skip_special_tokens=True)
            cut = min([text.find(s) for s in stops if s in text] or [len(text)])
            c += sandbox.run_code(sandbox.humaneval_program(d, text[:cut]), HUMANEVAL_TIMEOUT_S,
                                  HUMANEVAL_MEMORY_MB).passed
        rows.append(dict(task_id=d["id"], n=n, c=c, **{f"pass@{k}": sandbox.pass_at_k(n, c, k) for k in ks}))
    return pd.DataFrame(rows)


def summarize(df):
    """Mean and bootstrap 95% CI per (task, metric) of a per-item score table."""
    import pandas as pd

    rows = []
    for (task, metric), g in df.groupby(["task", "metric"], sort=True):
        est, lo, hi = bootstrap_ci(g["score"].to_numpy(), n_boot=2000, seed=0)
        rows.append(dict(task=task, metric=metric, n=len(g), mean=est, ci_low=lo, ci_high=hi))
    return pd.DataFrame(rows)
