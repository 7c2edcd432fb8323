"""``python -m moelab.claims rebuild FOLDER... | --all``, ``check`` and ``review [--write PATH]`` (the referee's
checklist of every decisive verdict; exit 1 when a decisive record has an empty field).

An entry script, not part of the engine: the notebook -> claim definitions table is the claims package's own
(:func:`moelab.claims.registry.claim_defs`, which imports a definitions module only when it is needed)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moelab.claims.rebuild import CHANGELOG, REPO_ROOT, check, figures_root, output_folders, rebuild
from moelab.claims.registry import claim_defs
from moelab.claims.verdict_summary import existing_notes, review_markdown, review_rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moelab.claims",
                                 description="Recompute or check claims.json from saved tables (runs nothing).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rebuild", help="recompute claims.json of output folders from their tables")
    r.add_argument("folders", nargs="*", type=Path)
    r.add_argument("--all", action="store_true", help="every folder under figures/ with a provenance.json")
    r.add_argument("--changelog", type=Path, default=None,
                   help=f"verdict change log (default: {CHANGELOG} for folders under figures/, none elsewhere)")
    r.add_argument("--no-changelog", action="store_true")
    c = sub.add_parser("check", help="validate every claims.json and that a rebuild reproduces it")
    c.add_argument("--root", type=Path, default=None, help="figures root (default: figures/)")
    v = sub.add_parser("review", help="print the referee's checklist of every decisive verdict")
    v.add_argument("--root", type=Path, default=None, help="figures root (default: figures/)")
    v.add_argument("--write", type=Path, default=None, help=f"also write it as markdown (e.g. "
                                                            f"{REPO_ROOT / 'docs' / 'claims-review.md'})")
    a = ap.parse_args(argv)
    if a.cmd == "review":
        root = a.root or figures_root()
        text = review_markdown(root, keep_notes=existing_notes(a.write) if a.write else "")
        print(text, end="")
        if a.write:
            a.write.write_text(text)
        return 1 if review_rows(root)[1] else 0
    if a.cmd == "rebuild":
        if bool(a.folders) == a.all:
            ap.error("give output folders or --all (not both)")
        folders = output_folders() if a.all else a.folders
        failed = 0
        for folder in folders:
            try:
                recs = rebuild(folder, defs=claim_defs, changelog=None if a.no_changelog else a.changelog or "auto")
            except ValueError as e:   # no definitions / not an output folder: report and go on
                print(f"{folder}: {e}", file=sys.stderr)
                failed += 1
                continue
            counts = {}
            for rec in recs:
                counts[rec["verdict"]] = counts.get(rec["verdict"], 0) + 1
            print(f"{folder}: {len(recs)} claims " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        return 1 if failed else 0
    problems = check(a.root, defs=claim_defs)
    for p in problems:
        print(p)
    if not problems:
        print("every claims.json validates and is reproduced by rebuild")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
