#!/usr/bin/env bash
# The core install as a newcomer has it: a venv with the core package and no extras (what `make demo`
# installs), then every command README.md shows before it names an extra, at a small budget, in a
# scratch folder with its own SQLite store. `.ci/run` runs it after `make test`; `make test-core` too.
#   scripts/check_core_install.sh [VENV]        (default .venv-core; reused when it exists)
set -euo pipefail
# (every step's output is kept in a scratch folder; a failing step prints its log)
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${1:-.venv-core}
PY=${PY:-python3}
if [ ! -x "$VENV/bin/vaco" ]; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q torch==2.13.0
  "$VENV/bin/pip" install -q -c constraints.txt -e .
fi
VACO=$ROOT/$VENV/bin/vaco
# no extra may be importable here, or the check proves nothing
for extra in transformers imageio_ffmpeg submitit ray warp mujoco_warp envpool psycopg pytest; do
  if "$VENV/bin/python" -c "import $extra" 2>/dev/null; then echo "core check: $extra is installed in $VENV: not a core install"; exit 1; fi
done
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
ln -s "$ROOT/configs" configs
export MLFLOW_TRACKING_URI=sqlite:///$WORK/mlflow.db OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
small=(--data.init_args.num_envs 2 --data.init_args.num_steps 64 --data.init_args.total_steps 256
       --data.init_args.eval_episodes 2 --data.init_args.eval_envs 2 --trainer.enable_progress_bar false)
step() { echo "core check: $*"; }
step "vaco --help"; "$VACO" --help >/dev/null
# (to a file, not a pipe: `grep -q` stops reading at its match and, under pipefail, the writer's SIGPIPE fails the step)
step "vaco fit --help lists --population"; "$VACO" fit --help > fit_help.log; grep -q -- "--population" fit_help.log
step "vaco fit (the demo's config, small budget)"
"$VACO" fit --config configs/demo.yaml "${small[@]}" > fit.log 2>&1 || { cat fit.log; exit 1; }
ckpt=$(ls checkpoints/*/last.ckpt | head -1)
step "vaco evaluate --ckpt $ckpt"
"$VACO" evaluate --ckpt "$ckpt" --episodes 2 | tee evaluate.log | tail -1; grep -q "return" evaluate.log
step "vaco fit --config configs/env/hopper.yaml --config configs/algo/vaco.yaml --population 2"
"$VACO" fit --config configs/env/hopper.yaml --config configs/algo/vaco.yaml --population 2 "${small[@]}" \
  --trainer.default_root_dir pop > pop.log 2>&1 || { cat pop.log; exit 1; }
member0=$(ls pop/checkpoints/*/last.ckpt | head -1)  # a population's checkpoint is member 0's run folder
step "vaco evaluate --member 1"; "$VACO" evaluate --ckpt "$member0" --member 1 --episodes 2 | tee member.log | tail -1
grep -q "return" member.log
step "vaco fit --print_config"; "$VACO" fit --config configs/env/hopper.yaml --config configs/algo/vaco.yaml --print_config >/dev/null
step "vaco ui starts, serves and stops on Ctrl-C"
"$VACO" ui --port 5077 > ui.log 2>&1 &
ui=$!
trap 'kill -INT $ui 2>/dev/null || true' EXIT  # a failing step below leaves no server behind
# the address it prints (the UI's own host name, vaco-<random>.localhost, which browsers resolve to this
# machine) carries the token; the same address without it is refused (the owner's only). Python does not
# resolve *.localhost, so each request goes to 127.0.0.1 naming the UI's host
address() { grep -o 'http://[^/ ]*:5077/?vaco_token=[^# ]*' ui.log | head -1; }
# (the token's address sets a cookie on the UI's host and redirects to the page; the cookie opens it)
up() {
  [ -n "$(address)" ] && "$ROOT/$VENV/bin/python" - "$(address)" <<'PY' 2>/dev/null
import http.client, sys, urllib.parse
url = urllib.parse.urlsplit(sys.argv[1])
def get(path, **headers):
    c = http.client.HTTPConnection("127.0.0.1", 5077, timeout=5)
    c.request("GET", path, headers={"Host": url.netloc, **headers})
    r = c.getresponse(); r.read(); c.close()
    return r
first = get(f"{url.path}?{url.query}")
assert first.status == 303, first.status
cookie = first.getheader("set-cookie").split(";")[0]
assert get("/", Cookie=cookie).status == 200
PY
}
for _ in $(seq 120); do up && break; sleep 1; done
up || { cat ui.log; exit 1; }
"$ROOT/$VENV/bin/python" - <<'PY' || { cat ui.log; exit 1; }
import urllib.error, urllib.request
try:
    urllib.request.urlopen("http://127.0.0.1:5077/", timeout=5)
except urllib.error.HTTPError as err:
    assert err.code in (401, 403), err.code
else:
    raise SystemExit("vaco ui served a request without its token")
PY
kill -INT $ui; wait $ui || true
step "vaco report on the runs"; "$VACO" report --experiment "$(grep -o "experiment '[^']*'" fit.log | head -1 | cut -d\' -f2)" \
  --no-sensitivity --reps 50 --out report > report.log 2>&1 || { cat report.log; exit 1; }
echo "core check: every quickstart command works on the core install"
