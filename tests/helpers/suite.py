"""Shared helpers of the suite tests (tests/suite, tests/moce)."""
from lm_eval.api.instance import Instance

from moelab.suite import lmeval


def loglikelihood_requests(task: str, n: int) -> list[Instance]:
    """lm-eval loglikelihood requests for the first ``n`` documents of an offline task: one per option of a
    multiple-choice document, one (context, continuation) pair otherwise."""
    out = []
    for d in lmeval.task_docs(task)[:n]:
        if "choices" in d:
            out += [Instance("loglikelihood", d, (d["prompt"], " " + c), i) for i, c in enumerate(d["choices"])]
        else:
            out.append(Instance("loglikelihood", d, (d["context"], d["continuation"]), 0))
    return out
