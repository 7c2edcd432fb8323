"""The front page stays true: every relative link in README.md, CONTRIBUTING.md and docs/*.md
resolves (file or folder, and the heading an ``#anchor`` names); every ``make X`` in their code is a Makefile target;
every ``python -m moelab...`` command in their code parses with that entry point's own argument parser (a notebook's
``-p`` names must be parameters of the notebooks it selects), and every ``module:function`` launch target imports.
The timing table, docs/timings.md, is what the committed ``provenance.json`` files say, number for number.

Generic over the pages: a page added to docs/ is checked without a change here. Commands holding a placeholder
(``<nb>``, ``NN``, ``...``) are checked up to their subcommand.
"""
import argparse
import importlib
import importlib.util
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from moelab import launch
from moelab.runner import cli

from helpers import ROOT

PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.S | re.M)
SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|^\s*\[[^\]]+\]:\s*(\S+)|"
                  r"<(?:a|img)\b[^>]*?\b(?:href|src)=\"([^\"]+)\"", re.M)
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|…|\bNN\b")
LAUNCH_TARGET = re.compile(r"\bmoelab(?:\.\w+)*:[A-Za-z_]\w*(?:\.\w+)*")


def _split(text: str) -> tuple[str, list[str]]:
    """(prose without code, code snippets: each fenced block's lines and each inline code span)."""
    code = []

    def block(m):
        code.extend(m.group(2).splitlines())
        return "\n" * m.group(0).count("\n")

    prose = FENCE.sub(block, text)

    def span(m):
        code.append(m.group(2))
        return " "

    return SPAN.sub(span, prose), code


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _slugs(page: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings (lowercased, punctuation dropped, spaces to hyphens, repeats
    numbered) and its explicit ``<a id|name=...>`` anchors."""
    text = page.read_text()
    seen, out = {}, set()
    for line in FENCE.sub("", text).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    out |= set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", _split(text)[0]))
    return out


def _links(page: Path) -> list[str]:
    prose, _ = _split(page.read_text())
    return [next(g for g in m.groups() if g) for m in LINK.finditer(prose)]


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_relative_links_resolve(page):
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z][\w+.-]*:", target) or target.startswith("//"):   # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _slugs(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, f"{_page_id(page)}: broken links: {broken}"


def makefile_targets() -> set[str]:
    return {t for line in (ROOT / "Makefile").read_text().splitlines()
            if (m := re.match(r"^([A-Za-z][\w .-]*?)\s*:(?!=)", line)) for t in m.group(1).split()}


def _make_targets(snippet: str) -> list[str]:
    """The targets of each ``make ...`` command in a code snippet (options, ``VAR=value`` and ``[optional]`` skipped)."""
    out = []
    for m in re.finditer(r"(?:^|[\s;&|(])make((?:\s+[^\s;&|#]+)*)", snippet):
        tokens = m.group(1).split()
        skip = False
        for tok in tokens:
            if skip:
                skip = False
            elif tok in ("-C", "-f", "-o", "-j"):
                skip = True
            elif tok.startswith(("-", "[")) or "=" in tok or tok.endswith("]"):
                continue
            elif re.fullmatch(r"[a-z][\w-]*", tok):
                out.append(tok)
            else:
                break
    return out


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_make_targets_exist(page):
    targets = makefile_targets()
    assert {"figures", "test"} <= targets
    _, code = _split(page.read_text())
    missing = sorted({t for snippet in code for t in _make_targets(snippet) if t not in targets})
    assert not missing, f"{_page_id(page)}: `make {missing}` is not a Makefile target"


class _Parsed(Exception):
    pass


def _commands(snippet: str) -> list[tuple[str, list[str]]]:
    """Each ``[python|accelerate launch ...] -m MODULE ARGS`` in a snippet as (MODULE, ARGS), ARGS ending at a shell
    comment or separator."""
    out = []
    for m in re.finditer(r"(?:^|[\s;&|(])-m\s+([A-Za-z_][\w.]*)(.*)", snippet):
        rest = re.split(r"\s(?:&&|\|\|?|;)\s", m.group(2))[0]
        try:
            args = shlex.split(rest, comments=True)
        except ValueError:   # an unbalanced quote: the span was cut by the Markdown line
            args = rest.split()
        # an optional argument written as usage, ``install [--smoke]``, is checked as given
        out.append((m.group(1), [re.sub(r"^\[(-.*)\]$", r"\1", a) for a in args]))
    return out


def _parse(module: str, args: list[str], monkeypatch) -> argparse.Namespace:
    """Run the entry point's ``main(args)`` only as far as its argument parser (``argparse`` errors raise
    SystemExit 2); ``--help`` exits 0."""
    spec = importlib.util.find_spec(module)
    mod = importlib.import_module(module + ".__main__" if spec.submodule_search_locations else module)
    real = argparse.ArgumentParser.parse_args

    def parse_only(self, a=None, namespace=None):
        raise _Parsed(real(self, a, namespace))

    with monkeypatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_args", parse_only)
        try:
            mod.main(args)
        except _Parsed as p:
            return p.args[0]
    raise AssertionError(f"python -m {module} did not parse its arguments")


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_entry_points_parse_and_launch_targets_import(page, monkeypatch, capsys):
    _, code = _split(page.read_text())
    bad = []
    for snippet in code:
        for target in LAUNCH_TARGET.findall(snippet):
            try:
                launch.resolve(target)
            except ValueError as e:
                bad.append(f"{target}: {e}")
        for module, args in _commands(snippet):
            cmd = f"-m {module} {shlex.join(args)}"
            spec = importlib.util.find_spec(module.split(".")[0]) and importlib.util.find_spec(module)
            if spec is None:
                bad.append(f"{cmd}: no module {module}")
                continue
            if not module.startswith("moelab"):
                continue
            if PLACEHOLDER.search(" ".join(args)):       # check only that the subcommand exists
                args = [a for a in args[:1] if not a.startswith("-")] + ["--help"]
            try:
                ns = _parse(module, args, monkeypatch)
            except SystemExit as e:
                if e.code not in (0, None):
                    bad.append(f"{cmd}: {capsys.readouterr().err.strip().splitlines()[-1:]}")
                continue
            if module == "moelab.runner" and getattr(ns, "cmd", "") == "run":
                try:
                    cli.params_for(cli.discover(ns.only), cli.parse_params(
                        ns.param + [p for text in ns.params for p in cli.split_params(text)]))
                except ValueError as e:
                    bad.append(f"{cmd}: {e}")
    assert not bad, f"{_page_id(page)}: commands that do not run as written: {bad}"


def test_front_page_checks_can_fail(tmp_path, monkeypatch, capsys):
    """The checks above catch what they are for: a missing file, a missing heading, a target, an entry point, an
    unknown parameter and a launch target that does not exist."""
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[a](nowhere.md) [b](#top) [c](#bottom) [d](https://example.org/x)\n\n"
                    "```bash\nmake figures NB=03   # ok\nmake nosuch\n```\n`[e](not-a-link.md)`\n")
    assert _links(page) == ["nowhere.md", "#top", "#bottom", "https://example.org/x"]
    assert _slugs(page) == {"top"}
    assert _make_targets("make figures NB=03 PROFILE=full") == ["figures"] and _make_targets("make -n lab") == ["lab"]
    assert "nosuch" not in makefile_targets()
    assert _commands("python -m moelab.runner run --only 04 -p 'A=1 2'  # note") == [
        ("moelab.runner", ["run", "--only", "04", "-p", "A=1 2"])]
    assert _commands("python -m moelab.assets install [--smoke]") == [("moelab.assets", ["install", "--smoke"])]
    with pytest.raises(SystemExit):
        _parse("moelab.runner", ["run", "--no-such-option"], monkeypatch)
    assert _parse("moelab.runner", ["run", "--only", "04", "-p", "X=1"], monkeypatch).param == ["X=1"]
    with pytest.raises(ValueError, match="GEMA"):
        cli.params_for(cli.discover(["04"]), cli.parse_params(["GEMA=True"]))
    with pytest.raises(ValueError):
        launch.resolve("moelab.mass:no_such_function")


# ---------------------------------------------------------------- docs/timings.md
TIMINGS = ROOT / "docs" / "timings.md"


def test_timings_page_is_regenerated_from_provenance():
    assert cli.timings_generated(TIMINGS.read_text()) == cli.timings_markdown(), \
        "docs/timings.md is not what the provenance files give: run python -m moelab.runner timings"


def test_readme_timing_table_is_regenerated_from_provenance():
    """The README's short table (one row per notebook, `default` and `full`) is the generated one, so the time a first
    `make figures` takes is never typed by hand; and its total is the sum of the `default` rows of docs/timings.md."""
    readme = (ROOT / "README.md").read_text()
    assert cli.TIMINGS_BEGIN in readme and cli.TIMINGS_END in readme
    block = readme.split(cli.TIMINGS_BEGIN)[1].split(cli.TIMINGS_END)[0].strip()
    assert block == cli.readme_timings_markdown().strip(), \
        "the README's timing table is not what the provenance files give: run python -m moelab.runner timings"
    total = sum(r["wall_time_s"] for r in cli.timing_rows() if r["profile"] == "default")
    assert f"**{cli._human(total)}**" in block


def test_readme_timing_block_is_rewritten_between_its_markers(tmp_path, monkeypatch):
    """write_timings fills the README's timing markers beside the docs folder it writes, and touches nothing else."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(f"intro\n{cli.TIMINGS_BEGIN}\nold table\n{cli.TIMINGS_END}\nrest\n")
    monkeypatch.setattr(cli, "timings_markdown", lambda: "# Timings\n")
    monkeypatch.setattr(cli, "readme_timings_markdown", lambda: "| new | table |")
    cli.write_timings(tmp_path / "docs" / "timings.md")
    assert (tmp_path / "README.md").read_text() == \
        f"intro\n{cli.TIMINGS_BEGIN}\n| new | table |\n{cli.TIMINGS_END}\nrest\n"
    assert (tmp_path / "docs" / "timings.md").read_text() == "# Timings\n"
    # hand-written notes below the marker survive a regeneration; the generated part is replaced
    notes = f"{cli.TIMINGS_NOTES}\n\n## Where the time goes\n| cell | s |\n"
    (tmp_path / "docs" / "timings.md").write_text("# Old table\n\n" + notes)
    cli.write_timings(tmp_path / "docs" / "timings.md")
    text = (tmp_path / "docs" / "timings.md").read_text()
    assert text == "# Timings\n\n" + notes and cli.timings_generated(text) == "# Timings\n"


def test_every_timing_equals_its_provenance():
    """Read back from the page itself: each row's wall time, commit, finish time and threads are its folder's
    ``provenance.json``'s, and every committed provenance file has its row."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in TIMINGS.read_text().splitlines()
            if line.startswith("| [")]
    header = next(line for line in TIMINGS.read_text().splitlines() if line.startswith("| notebook"))
    cols = [c.strip() for c in header.strip().strip("|").split("|")]
    seen = set()
    for row in rows:
        r = dict(zip(cols, row))
        folder = (TIMINGS.parent / re.search(r"\]\(([^)]+)\)", r["notebook"]).group(1)).resolve()
        prov = json.loads((folder / "provenance.json").read_text())
        seen.add(folder)
        assert r["notebook"].startswith(f"[{prov['notebook']}]") and r["profile"] == prov["profile"]
        assert float(r["wall time (s)"]) == prov["wall_time_s"]
        assert prov["commit"].startswith(r["commit"].removesuffix("+dirty"))
        assert r["commit"].endswith("+dirty") == prov["commit"].endswith("+dirty")
        assert r["finished"] == prov["finished"]
        assert r["torch threads"] == str(prov["hardware"]["torch_threads"])
        assert r["artifact cache"] == cli.cache_state(prov)
    committed = {p.parent.resolve() for p in (ROOT / "figures").glob("*/**/provenance.json")
                 if not any(part.startswith(".") for part in p.relative_to(ROOT / "figures").parts)}
    assert seen == committed


def test_the_total_says_which_rows_are_not_cold():
    rows = [{"notebook": "00", "cache": "cold (0 built)"}, {"notebook": "01", "cache": "warm (3 reused, 0 built)"},
            {"notebook": "02", "cache": "not recorded"}]
    assert cli.total_caveat(rows[:1]) == ""
    said = cli.total_caveat(rows)
    assert "Of these, 01 ran on a warm artifact cache" in said and "02 did not record its cache use" in said


def test_cache_state_labels_warm_runs():
    assert cli.cache_state({}) == "not recorded"
    assert cli.cache_state({"artifact_cache": {"reused": 0, "built": 7, "build_s": 3.0}}) == "cold (7 built)"
    assert cli.cache_state({"artifact_cache": {"reused": 5, "built": 1, "build_s": 3.0}}) == \
        "warm (5 reused, 1 built)"


# ---------------------------------------------------------------- the project stands alone
OUTSIDE = re.compile(r"\.\./" + "shared" + r"\b|\b" + "shared" + r"/(?:notes|papers|STYLE)")


def test_no_tracked_file_points_outside_the_repository():
    """A user's clone has no workspace around it: no tracked file (code, docs, requirements, data notes) may send a
    reader to the build workspace's shared folder; what the project relies on is copied into docs/."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = [f for f in listed.split("\0") if f]
    hits = []
    for f in files:
        path = ROOT / f
        if path.suffix in {".pdf", ".png", ".gz", ".npz", ".pt", ".safetensors", ".ipynb"} or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        hits += [f"{f}:{i}" for i, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]
    assert not hits, f"tracked files point outside the repository (copy what they need into docs/): {hits}"


def test_the_outside_pointer_check_can_fail():
    outside = "see ../" + "shared" + "/notes/offline-assets.md"
    assert OUTSIDE.search(outside) and not OUTSIDE.search("docs/offline-assets.md")


def test_lanes_span_is_first_start_to_last_finish():
    """Two lanes: a runs 10:00-10:10 and c 10:10-10:30 in one lane, b 10:00-10:25 in the other: the series took 30
    min (the sum, 55 min, counts each alone); runs one at a time, or with a gap between them, have no common span."""
    def row(finished, wall, lanes=2):
        return {"finished": f"2026-11-28 {finished}:00 UTC", "wall_time_s": wall, "lanes": lanes}
    rows = [row("10:10", 600), row("10:25", 1500), row("10:30", 1200)]
    assert cli.lanes_span(rows) == {"lanes": 2, "s": 1800.0}
    assert cli.lanes_span([row("10:10", 600), row("10:30", 1200, lanes=None)]) is None
    assert cli.lanes_span([row("10:10", 600), row("12:30", 1200)]) is None          # two occasions
    assert cli.lanes_span([row("10:10", 600, lanes=1)]) is None
    assert cli.lanes_span([]) is None


def test_committed_figure_index_matches_the_manifests():
    """figures/INDEX.md is what write_index makes of the committed manifests (a publish that did not commit its index,
    or an index committed without its folder, shows here)."""
    from moelab.runner.notebook_run import index_text
    assert (ROOT / "figures" / "INDEX.md").read_text() == index_text(ROOT / "figures"), \
        "figures/INDEX.md is stale: python -c 'from moelab.runner.notebook_run import write_index; write_index()'"
