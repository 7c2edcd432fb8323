#!/usr/bin/env bash
# The GPU check in one command (issue 33; CONTRIBUTING.md, "Checking the GPU path").
#
#   scripts/gpu_check.sh --build-wheels DIR [--python-version 3.12]   here: fetch the wheels of requirements-gpu-check.txt
#   scripts/gpu_check.sh [--wheels DIR] [--out DIR] [--jobs N] ...      on the GPU machine: install, test, benchmark
#
# On a machine with torch (a CUDA build) and transformers it installs the wheels in DIR (--no-deps, no index) and the
# repository (pip install --no-deps -e .), runs the whole pytest suite with CUDA visible, then the `cuda`-marked tests
# alone, then the GPU benchmark (benchmarks/bench_moe_layer.py --device cuda, interleaved repeats) and its profile
# (--profile --device cuda: top ops and host syncs per call, issue 50), and prints one summary: passed / failed /
# needs assets (tests that failed or skipped for want of the asset cache) / skipped. Without a CUDA device it says so,
# runs the tests all the same (the `cuda`-marked ones are skipped) and leaves out the benchmark.
# With --dry-run DIR it then rehearses the paper profile of 01-05 (issue 51; docs/paper-scale.md) on the stand-ins in
# DIR (written by scripts/make_paper_standins.py, here or on another machine: the paths in DIR/NN.params are moved to
# DIR), device "auto" (CUDA and bf16 when present), each timed, and adds a "dry run" line to the summary.
# Files: OUT (default runs/gpu_check/): suite.xml, cuda.xml, device.json, *.log, profile.txt, summary.txt, summary.json,
# dryrun_NN.log and dryrun.tsv, and a copy of the benchmark JSON (written to
# benchmarks/results/moe_layer_cuda_<card>.json). Exit status 1 when a test or a dry run failed.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; cat <<'EOF'
Options:
  --wheels DIR          install every wheel in DIR first (pip --no-index --no-deps)
  --build-wheels DIR    only download/build the wheels of requirements-gpu-check.txt into DIR, then stop
  --python-version X.Y  target CPython for --build-wheels (default 3.12, the lent machines' python3)
  --python PY           interpreter (default: .venv/bin/python if present, else python3)
  --out DIR             where results go (default runs/gpu_check)
  --jobs N              pytest-xdist workers for the whole suite (default: CPU count with CUDA, 2 without; 0 = serial)
  --no-install          do not pip install the repository (it is importable already)
  --bench-repeats N     interleaved repeats of the GPU benchmark (default 20)
  --suite-timeout S     stop the whole-suite run after S seconds (default 330: the check aims at 6 minutes)
  --dry-run DIR         after the tests, the paper dry run of every notebook with a DIR/NN.params (stand-ins)
  --dry-nbs "01 05"     only these notebooks' dry runs (default: 01 02 03 04 05)
  --skip-tests          leave out the test suite and the cuda-marked tests (e.g. the dry run alone)
  --tests PATH...       run only these test paths (all remaining arguments) instead of tests/
EOF
}

PY=""; WHEELS=""; BUILD=""; PYVER="3.12"; OUT="$ROOT/runs/gpu_check"; JOBS=""; INSTALL=1; REPEATS=20
SUITE_TIMEOUT=330; TESTS=(); DRY=""; DRY_NBS="01 02 03 04 05"; SKIP_TESTS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS=${2:?--wheels needs a folder}; shift 2 ;;
    --build-wheels) BUILD=${2:?--build-wheels needs a folder}; shift 2 ;;
    --python-version) PYVER=${2:?}; shift 2 ;;
    --python) PY=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --jobs) JOBS=${2:?}; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --bench-repeats) REPEATS=${2:?}; shift 2 ;;
    --suite-timeout) SUITE_TIMEOUT=${2:?}; shift 2 ;;
    --dry-run) DRY=${2:?--dry-run needs the stand-in folder (scripts/make_paper_standins.py DIR)}; shift 2 ;;
    --dry-nbs) DRY_NBS=${2:?}; shift 2 ;;
    --skip-tests) SKIP_TESTS=1; shift ;;
    --tests) shift; TESTS=("$@"); break ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
cd "$ROOT" || exit 2

# ------------------------------------------------------------------ mode 1: build the wheel folder (where pip works)
if [ -n "$BUILD" ]; then
  mkdir -p "$BUILD"
  plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
        --platform manylinux1_x86_64)
  fail=0
  while read -r name; do
    [ -z "$name" ] && continue
    if ! "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -c constraints.txt \
         --python-version "$PYVER" --implementation cp "${plat[@]}" -d "$BUILD" "$name" 2>/dev/null; then
      # no wheel on the index (an sdist only): build it here; fine for pure-Python packages (py3-none-any)
      if ! "$PY" -m pip wheel -q --disable-pip-version-check --no-deps -c constraints.txt -w "$BUILD" "$name"; then
        echo "gpu_check: could not fetch or build a wheel of $name" >&2; fail=1
      fi
    fi
  done < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' requirements-gpu-check.txt)
  n=$(ls "$BUILD"/*.whl 2>/dev/null | wc -l)
  echo "gpu_check: $n wheels in $BUILD ($(du -sh "$BUILD" | cut -f1)); on the GPU machine: scripts/gpu_check.sh --wheels $BUILD"
  exit $fail
fi

T0=$SECONDS
mkdir -p "$OUT"
rm -f "$OUT"/suite.xml "$OUT"/cuda.xml "$OUT"/summary.txt "$OUT"/summary.json "$OUT"/profile.txt "$OUT"/dryrun*
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
export MOELAB_PROGRESS=0 PYTHONUNBUFFERED=1

# ------------------------------------------------------------------ install
if [ -n "$WHEELS" ]; then
  shopt -s nullglob; whl=("$WHEELS"/*.whl); shopt -u nullglob
  if [ ${#whl[@]} -eq 0 ]; then echo "gpu_check: no wheels in $WHEELS (build them with --build-wheels)" >&2; exit 2; fi
  echo "gpu_check: installing ${#whl[@]} wheels from $WHEELS"
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile "${whl[@]}" || exit 2
fi
if [ "$INSTALL" = 1 ]; then
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-build-isolation -e "$ROOT" \
    > "$OUT/install.log" 2>&1 || {
    # e.g. a setuptools too old for pyproject.toml: the check does not need an install, only moelab on the path
    echo "gpu_check: pip install -e . failed ($OUT/install.log); using PYTHONPATH=lib instead" >&2
    export PYTHONPATH="$ROOT/lib${PYTHONPATH:+:$PYTHONPATH}"; }
fi
"$PY" -m pip check > "$OUT/pip_check.log" 2>&1 || echo "gpu_check: pip check reports problems (see $OUT/pip_check.log)"

# ------------------------------------------------------------------ the device
"$PY" - "$OUT/device.json" <<'EOF' || { echo "gpu_check: torch or transformers is missing" >&2; exit 2; }
import json, os, sys
import torch, transformers
cuda = torch.cuda.is_available()
d = {"cuda": cuda, "device_name": torch.cuda.get_device_name(0) if cuda else None, "torch": torch.__version__,
     "cuda_runtime": torch.version.cuda, "transformers": transformers.__version__, "cpu_count": os.cpu_count()}
json.dump(d, open(sys.argv[1], "w"), indent=1)
print("gpu_check: " + (f"CUDA device {d['device_name']}" if cuda else "no CUDA device: the tests run on the CPU, "
      "the cuda-marked tests are skipped and the GPU benchmark is left out"))
EOF
CUDA=$("$PY" -c "import json,sys; print(int(json.load(open(sys.argv[1]))['cuda']))" "$OUT/device.json")
if [ -z "$JOBS" ]; then
  if [ "$CUDA" = 1 ]; then JOBS=$(nproc); else JOBS=2; fi
fi
XDIST=(-n "$JOBS")
"$PY" -c "import xdist" 2>/dev/null || XDIST=()
[ ${#TESTS[@]} -eq 0 ] && TESTS=(tests)
# SIGINT at the limit: pytest stops like on Ctrl-C and still writes the JUnit XML of the tests it ran
TIMEOUT=(timeout -s INT -k 30 "$SUITE_TIMEOUT")
command -v timeout >/dev/null || TIMEOUT=()

# ------------------------------------------------------------------ 1. the whole suite, CUDA visible
STAGES=()
if [ "$SKIP_TESTS" = 0 ]; then
echo "gpu_check: whole suite (${TESTS[*]}, ${JOBS} workers) ..."
"${TIMEOUT[@]}" "$PY" -m pytest -q -p no:cacheprovider "${XDIST[@]}" --junitxml="$OUT/suite.xml" "${TESTS[@]}" \
  > "$OUT/suite.log" 2>&1
rc=$?
STOPPED=()
[ $rc = 124 ] && STOPPED=(--stopped "whole suite")
echo "gpu_check: whole suite exit $rc after $((SECONDS - T0)) s ($OUT/suite.log)"

# ------------------------------------------------------------------ 2. the cuda-marked tests alone
"$PY" -m pytest -q -p no:cacheprovider -m cuda --junitxml="$OUT/cuda.xml" "${TESTS[@]}" > "$OUT/cuda.log" 2>&1
rc=$?
[ $rc = 5 ] && echo "gpu_check: no cuda-marked test among ${TESTS[*]}"
echo "gpu_check: cuda-marked tests exit $rc after $((SECONDS - T0)) s ($OUT/cuda.log)"
STAGES=(--stage "whole suite=$OUT/suite.xml" --stage "cuda-marked=$OUT/cuda.xml")
fi

# ------------------------------------------------------------------ 3. the GPU benchmark
BENCH=()
if [ "$CUDA" = 1 ]; then
  if "$PY" benchmarks/bench_moe_layer.py --device cuda --repeats "$REPEATS" > "$OUT/bench.log" 2>&1; then
    res=$(sed -n 's/^wrote //p' "$OUT/bench.log" | tail -1)          # benchmarks/results/moe_layer_cuda_<card>.json
    cp "$res" "$OUT/" && BENCH=(--bench "$res")
  else
    BENCH=(--bench "$OUT/benchmark-failed.json"); echo "gpu_check: GPU benchmark failed ($OUT/bench.log)"
  fi
  # where the time goes, and the host syncs per forward+backward (moelab's should be 0: issue 50)
  "$PY" benchmarks/bench_moe_layer.py --device cuda --profile > "$OUT/profile.txt" 2>&1 \
    || echo "gpu_check: GPU profile failed ($OUT/profile.txt)"
  echo "gpu_check: benchmark and profile done after $((SECONDS - T0)) s"
fi

# ------------------------------------------------------------------ 4. the paper dry run on stand-ins (issue 51)
DRYFAIL=0
if [ -n "$DRY" ]; then
  DRY=$(cd "$DRY" 2>/dev/null && pwd) || { echo "gpu_check: --dry-run folder not found (make it with: $PY scripts/make_paper_standins.py DIR)" >&2; exit 2; }
  # on the CPU one torch thread, as `make dry-run` (the stand-ins' matrices are tiny); on CUDA the device does the work
  [ "$CUDA" = 1 ] || export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
  for nb in $DRY_NBS; do
    if [ ! -f "$DRY/$nb.params" ]; then
      echo "gpu_check: no $DRY/$nb.params (make it with: $PY scripts/make_paper_standins.py $DRY --only $nb)" >&2
      printf '%s\tmissing\t0\n' "$nb" >> "$OUT/dryrun.tsv"; DRYFAIL=1; continue
    fi
    # the stand-ins may have been written elsewhere: every quoted path '.../NN/...' is moved under DIR/NN/
    params=$("$PY" -c "from moelab.standins import relocated_params as r; import sys; print(r(*sys.argv[1:]))" "$DRY" "$nb")
    t=$SECONDS
    "$PY" -m moelab.runner run --profile paper --dry-run --only "$nb" --no-progress --params "$params" \
      > "$OUT/dryrun_$nb.log" 2>&1
    rc=$?; st=ok; [ $rc = 0 ] || { st=failed; DRYFAIL=1; }
    printf '%s\t%s\t%s\n' "$nb" "$st" "$((SECONDS - t))" >> "$OUT/dryrun.tsv"
    echo "gpu_check: dry run $nb $st in $((SECONDS - t)) s ($OUT/dryrun_$nb.log)"
  done
fi

# ------------------------------------------------------------------ the one summary
"$PY" scripts/gpu_check_summary.py "${STAGES[@]}" \
  --device "$OUT/device.json" "${BENCH[@]}" "${STOPPED[@]}" --json "$OUT/summary.json" --wall $((SECONDS - T0)) | tee "$OUT/summary.txt"
status=${PIPESTATUS[0]}
if [ -s "$OUT/profile.txt" ]; then                                  # "## moelab_auto: host syncs per call: none"
  sed -n 's/^## \(.*\)$/  profile     : \1/p' "$OUT/profile.txt" | tee -a "$OUT/summary.txt"
fi
if [ -s "$OUT/dryrun.tsv" ]; then                                   # "dry run: 01 ok 40 s, 02 ok 31 s, ..."
  echo "  dry run     : $(awk -F'\t' '{printf "%s%s %s %s s", (NR>1?", ":""), $1, $2, $3}' "$OUT/dryrun.tsv")" \
    | tee -a "$OUT/summary.txt"
fi
[ "$DRYFAIL" = 1 ] && status=1
exit "$status"
