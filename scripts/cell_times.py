"""Where a notebook run spends its time: the slowest cells of executed notebooks (issue 49, docs/timings.md).

    python scripts/cell_times.py runs/default/*.ipynb [--top 5]

Reads papermill's per-cell ``metadata.papermill.duration`` from the executed notebooks the runner leaves in
``runs/<profile>/`` and prints a markdown table per notebook: the ``--top`` slowest code cells, their seconds, share of
the notebook's cell time and the cell's first code line (the call into moelab it makes).
"""
import argparse
import json
from pathlib import Path


def cell_times(path) -> list[dict]:
    """[{cell, seconds, line}] for every executed code cell of ``path`` (an .ipynb papermill wrote), in order."""
    nb = json.loads(Path(path).read_text())
    rows = []
    for i, cell in enumerate(nb["cells"]):
        dur = cell.get("metadata", {}).get("papermill", {}).get("duration")
        if cell["cell_type"] != "code" or dur is None:
            continue
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        lines = [ln.strip() for ln in src.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        rows.append(dict(cell=i, seconds=float(dur), line=(lines[0] if lines else "")[:90]))
    if not rows:
        raise ValueError(f"{path}: no papermill cell durations (is it an executed notebook from runs/<profile>/?)")
    return rows


def table(path, top: int = 5) -> str:
    rows = cell_times(path)
    total = sum(r["seconds"] for r in rows)
    out = [f"**{Path(path).stem}**: {total:.0f} s in {len(rows)} code cells; the {top} slowest:", "",
           "| cell | seconds | share | first line |", "|---:|---:|---:|---|"]
    for r in sorted(rows, key=lambda r: -r["seconds"])[:top]:
        line = r["line"].replace("|", "\\|")
        out.append(f"| {r['cell']} | {r['seconds']:.0f} | {100 * r['seconds'] / total:.0f}% | `{line}` |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+", help="executed notebooks (runs/<profile>/NN_name.ipynb)")
    ap.add_argument("--top", type=int, default=5, help="slowest cells per notebook (default 5)")
    a = ap.parse_args(argv)
    print("\n\n".join(table(p, a.top) for p in a.notebooks if not p.endswith(".input.ipynb")))


if __name__ == "__main__":
    main()
