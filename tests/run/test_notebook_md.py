"""Every run writes its executed notebook as Markdown beside its outputs: ``notebook.md`` keeps the
narrative, tables, figures (the PNGs ``run.savefig`` wrote, linked from the same folder) and computed sentences, and
leaves out papermill's noise (the injected-parameters cell, stderr, escape codes, carriage-return redraws, widgets).
A published run's Markdown is swapped in with its figures; ``make stale`` reports a folder without one."""
import base64
import json

import nbformat
import pandas as pd
import pytest

from moelab.runner import cli, markdown

NB = "00_moe_primer"
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


def _executed() -> nbformat.NotebookNode:
    """An executed notebook as papermill writes it."""
    v4 = nbformat.v4
    params = v4.new_code_cell('PROFILE = "default"\nSEED = 0', metadata={"tags": ["parameters"]})
    injected = v4.new_code_cell('# Parameters\nPROFILE = "full"\nSEED = 3\n', metadata={"tags": ["injected-parameters"]})
    work = v4.new_code_cell("train()", outputs=[
        v4.new_output("stream", name="stderr", text="\x1b[2Kwarmup: 100%|##########| 3/3\r\n"),
        v4.new_output("stream", name="stdout", text="loss 0.9\rloss 0.5\n\x1b[1mthe router learned 3 experts\x1b[0m\n"),
        v4.new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "x"},
                                             "text/plain": "HBox()"}),
        v4.new_output("display_data", data={"image/png": base64.b64encode(PNG).decode(), "text/plain": "<Figure>"}),
        v4.new_output("execute_result", execution_count=3,
                      data={"text/html": "<table><tr><td>top-2</td><td>0.51</td></tr></table>",
                            "text/plain": "  rule  acc\n0 top-2 0.51"})])
    nb = v4.new_notebook(cells=[v4.new_markdown_cell("# Title\n\nThe idea, with $y=\\sum_i w_i E_i(x)$."), params,
                                injected, work])
    nb.metadata["papermill"] = {"parameters": {"PROFILE": "full", "SEED": 3}}
    return nb


def test_markdown_keeps_the_reading_and_drops_the_noise(tmp_path):
    ipynb = tmp_path / "run.ipynb"
    nbformat.write(_executed(), str(ipynb))
    md = markdown.write_notebook_md(ipynb, tmp_path).read_text()
    assert "# Title" in md and "w_i E_i(x)" in md                      # narrative
    assert "<table><tr><td>top-2</td>" in md                            # tables
    assert "the router learned 3 experts" in md and "loss 0.5" in md   # computed sentences, the last redraw
    assert 'PROFILE = "full"\nSEED = 3' in md and "# Parameters" not in md   # the values the run used, once
    for noise in ("\x1b", "\r", "warmup", "loss 0.9", "HBox", "injected-parameters", "papermill"):
        assert noise not in md, noise
    images = list((tmp_path / markdown.FILES_DIR).iterdir())
    assert len(images) == 1 and images[0].read_bytes() == PNG and f"({markdown.FILES_DIR}/{images[0].name})" in md
    # rewritten in place: no earlier image or temporary file survives
    nb = _executed()
    nb.cells[-1].outputs = nb.cells[-1].outputs[:2]
    nbformat.write(nb, str(ipynb))
    markdown.write_notebook_md(ipynb, tmp_path)
    assert not (tmp_path / markdown.FILES_DIR).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notebook.md", "run.ipynb"]


BODY = '''# %% [markdown]
# # Tiny
# The narrative of a tiny notebook.

# %% tags=["parameters"]
PROFILE = "default"
SEED = 0

# %%
import matplotlib.pyplot as plt
import pandas as pd
import moelab
run = moelab.start_run("{nb}", profile=PROFILE, seed=SEED)
df = pd.DataFrame({{"x": [1, 2], "y": [0.25, 0.75]}})
run.save_table(df, "table1", "xy")
fig, ax = plt.subplots()
ax.plot(df.x, df.y)
run.savefig(fig, "figure1", "line", caption="y against x")
print(f"y rises by {{df.y.iloc[-1] - df.y.iloc[0]:.2f}}")
df

# %%
run.finish()
'''


@pytest.fixture
def runner(tmp_path, tmp_figures, monkeypatch):
    monkeypatch.setattr(cli, "NB_DIR", tmp_path / "nbs")
    monkeypatch.setattr(cli, "RUNS", tmp_path / "runs")
    monkeypatch.setenv("MOELAB_SCRATCH", str(tmp_path / "scratch"))
    (tmp_path / "nbs").mkdir()
    (tmp_path / "nbs" / f"{NB}.py").write_text(BODY.format(nb=NB))
    return tmp_path


def test_published_run_writes_notebook_md_with_its_figures(runner):
    fig = runner / "figures" / NB
    for profile, folder in (("default", fig), ("full", fig / "full")):
        assert cli.main(["run", "--profile", profile, "--only", "00", "--no-progress", "--force"]) == 0
        md = (folder / "notebook.md").read_text()
        assert "The narrative of a tiny notebook." in md and "y rises by 0.50" in md and "<table" in md
        assert f'PROFILE = "{profile}"' in md
        assert "](figure1_line.png)" in md and (folder / "figure1_line.png").exists()   # the helper's own PNG
        assert "\x1b" not in md
    assert (fig / "full" / "notebook.md").exists()            # publishing full kept default's and vice versa
    assert not [p for p in fig.parent.iterdir() if p.name.startswith(".")]
    # make stale: a published folder whose notebook.md is missing is reported as such
    assert not any("notebook.md" in " ".join(why) for _, why in cli.stale_report(runner / "figures"))
    (fig / "notebook.md").unlink()
    stale = dict(cli.stale_report(runner / "figures"))
    assert "(notebook.md missing)" in stale[NB] and "(notebook.md missing)" not in stale.get(f"{NB}/full", [])
    # a scratch run writes its Markdown beside its scratch outputs
    assert cli.main(["run", "--profile", "smoke", "--only", "00", "--no-progress", "--force"]) == 0
    assert "y rises by 0.50" in (runner / "scratch" / "smoke" / NB / "notebook.md").read_text()
    assert json.loads((fig / "full" / "provenance.json").read_text())["profile"] == "full"
    assert pd.read_csv(fig / "table1_xy.csv").y.tolist() == [0.25, 0.75]
