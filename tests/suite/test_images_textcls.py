"""Images and BIG-bench text classification splits."""
import base64
import io

import numpy as np
import pytest

from moelab.suite import images, textcls


def test_stratified_subset():
    y = np.array([0] * 50 + [1] * 30 + [2] * 20)
    idx = images.stratified_subset(y, 30, seed=0)
    assert len(idx) == 30 and np.bincount(y[idx]).tolist() == [10, 10, 10]
    assert (idx == images.stratified_subset(y, 30, seed=0)).all()
    assert len(images.stratified_subset(y, None, 0)) == 100


def test_png_decode_roundtrip_and_corrupt():
    from PIL import Image

    arr = (np.arange(32 * 32 * 3) % 256).astype(np.uint8).reshape(32, 32, 3)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    assert (images.decode_png_b64(base64.b64encode(buf.getvalue()).decode()) == arr).all()
    with pytest.raises(ValueError, match="undecodable"):
        images.decode_png_b64("bm90IGEgcG5n")


def test_image_sets_smoke():
    f = images.fashion_mnist("smoke")
    assert f["train_x"].shape == (600, 28, 28) and f["test_x"].shape == (200, 28, 28)
    assert f["train_x"].dtype == np.uint8 and len(f["labels"]) == 10
    c = images.cifar10_test("smoke")
    assert c["train_x"].shape == (300, 32, 32, 3) and c["test_x"].shape == (100, 32, 32, 3)
    assert np.bincount(c["test_y"]).tolist() == [10] * 10
    with pytest.raises(ValueError, match="PROFILE"):
        images.cifar10_test("huge")


def test_textcls_splits():
    s = textcls._task_splits("intent_recognition")
    assert len(s["test"]) == 200 and len(s["validation"]) == 100 and len(s["labels"]) == 7
    texts = [set(x for x, _ in s[k]) for k in ("train", "validation", "test")]
    assert not (texts[0] & texts[2]) and not (texts[1] & texts[2])
    assert 1 / 7 <= s["chance"] < 1
    t = textcls.tasks("smoke", names=["intent_recognition"])["intent_recognition"]
    assert len(t["train"]) == 32 and len(t["test"]) == 16
    with pytest.raises(ValueError, match="nope"):
        textcls.tasks("smoke", names=["nope"])


def test_committed_textcls_validation():
    import pandas as pd

    df = pd.read_csv(textcls.CSV)
    assert set(df.task) == set(textcls.CANDIDATES)
    m = df[df.measured.astype(bool)]
    assert ((m.ci_low > m.chance) == m.usable.astype(bool)).all()
    assert set(textcls.usable()) == set(m[m.usable.astype(bool)].task) and textcls.usable()


def test_textcls_validate_keeps_other_rows(tmp_path, monkeypatch):
    """validate(names) measures only ``names`` and keeps the other candidates' committed rows."""
    import numpy as np
    import pandas as pd

    from moelab.suite import textcls

    fake = dict(train=[("a", 0)] * 30, validation=[], test=[("b", 1)] * 20, labels=["x", "y"], chance=0.5)
    monkeypatch.setattr(textcls, "_task_splits", lambda t: fake)
    monkeypatch.setattr(textcls, "finetune_eval", lambda s: np.ones(20))
    path = tmp_path / "v.csv"
    pd.DataFrame([dict(task="intent_recognition", acc=0.9, usable=True, measured=True),
                  dict(task="metaphor_boolean", acc=0.6, usable=False, measured=True)]).to_csv(path, index=False)
    df = textcls.validate(["metaphor_boolean"], path)
    assert list(df.task) == ["intent_recognition", "metaphor_boolean"]
    assert df.set_index("task").acc.to_dict() == {"intent_recognition": 0.9, "metaphor_boolean": 1.0}
    assert bool(df.set_index("task").usable["metaphor_boolean"])
