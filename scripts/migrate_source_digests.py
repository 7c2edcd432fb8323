"""One-off migration of committed provenance to normalised source digests (architecture v2, docs/NOTES.md).

Provenance written before ``source_digest`` records every source as the sha256 of its bytes. For each such
``figures/**/provenance.json`` whose every recorded source equals the file at ``--commit`` (default HEAD), the lib
entries are rewritten as :func:`moelab.cache.source_digest_of` of that same committed file, and the migration is
recorded in the provenance (``source_digest_migrated``). A folder with any mismatch is left as it is (it was stale
before and stays stale). Reads the commit's files with ``git show``, so uncommitted edits do not enter.

    python scripts/migrate_source_digests.py [--commit HEAD] [--dry-run]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from moelab.cache import source_digest_of
from moelab.runner.notebook_run import REPO_ROOT, SOURCE_DIGEST, VERDICT_CODE


def committed(commit: str, rel: str) -> bytes | None:
    r = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=REPO_ROOT, capture_output=True)
    return r.stdout if r.returncode == 0 else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", a.commit], cwd=REPO_ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    for prov_path in sorted((REPO_ROOT / "figures").rglob("provenance.json")):
        prov = json.loads(prov_path.read_text())
        rel_folder = prov_path.parent.relative_to(REPO_ROOT)
        if prov.get("source_digest"):
            print(f"{rel_folder}: already {prov['source_digest']}")
            continue
        new, mismatched = {}, []
        for rel, sha in prov.get("sources", {}).items():
            raw = committed(commit, rel)
            if raw is None or hashlib.sha256(raw).hexdigest()[:16] != sha:
                if not rel.startswith(VERDICT_CODE):
                    mismatched.append(rel)
                new[rel] = sha
                continue
            new[rel] = source_digest_of(raw, rel) if rel.startswith("lib/") else sha
        if mismatched:
            print(f"{rel_folder}: left as it is, {len(mismatched)} sources differ at {commit[:7]}: {mismatched[:3]}")
            continue
        prov["sources"] = new
        prov["source_digest"] = SOURCE_DIGEST
        prov["source_digest_migrated"] = {"from": "sha256 of bytes", "verified_at": commit}
        if not a.dry_run:
            prov_path.write_text(json.dumps(prov, indent=1, default=str))
        print(f"{rel_folder}: migrated {len(new)} sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
