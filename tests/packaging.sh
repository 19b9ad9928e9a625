#!/usr/bin/env bash
# The packages, built and the .deb installed for real (packaging/README.md):
# `bash packaging/build.sh deb rpm`, then `dpkg -i` of the .deb on this
# machine, the installed files used (the binary, the man pages, the system
# config, a short `resilio run`, the SPANK plugin, the completions, the Python
# client), the RPM's file list (`rpm -qlp`; RPMs are not installed on
# Debian), the Spack recipe checked without Spack, and `dpkg --purge` last.
# tests/run.sh calls it after tests/fuzz.sh; its last line is in cargo's
# format (one "test" per check) for run.sh's sum.
#
#   bash tests/packaging.sh
#
# Needs root (dpkg -i, and apt for what is missing: make, gcc, libslurm-dev,
# rpm, man-db). It never touches a resilio it did not install: when a resilio
# package is already installed, or /usr/bin/resilio, /usr/lib/resilio or
# /etc/resilio/resilio.toml exist without belonging to a resilio package, the
# checks of the installed package are reported as ignored, with the reason,
# and the rest still run. The package is purged on every exit.
#
# Time: the release build is reused when up to date, cargo-deb is installed
# once per version into /var/cache/resilio-ci (tests/fuzz.sh's cache).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
t0=$(date +%s)

passed=0
failed=0
ignored=0
pass() {
  echo "test packaging::$1 ... ok${2:+ ($2)}"
  passed=$((passed + 1))
}
fail() {
  echo "test packaging::$1 ... FAILED${2:+ ($2)}"
  failed=$((failed + 1))
}
ignore() {
  echo "test packaging::$1 ... ignored${2:+ ($2)}"
  ignored=$((ignored + 1))
}
finish() {
  local result=ok
  [ "$failed" -eq 0 ] || result=FAILED
  echo "test result: $result. $passed passed; $failed failed; $ignored ignored; 0 measured; 0 filtered out; finished in $(($(date +%s) - t0))s${build_secs:+ (build ${build_secs}s)}"
  [ "$failed" -eq 0 ]
}

scratch=$(mktemp -d)
installed_by_us=0
cleanup() {
  if [ "$installed_by_us" = 1 ] && dpkg-query -W -f='${Status}' resilio 2>/dev/null | grep -q installed; then
    DEBIAN_FRONTEND=noninteractive dpkg --purge resilio >/dev/null 2>&1 || true
  fi
  rm -rf "$scratch"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

VERSION=$(awk -F'"' '/^\[package\]/ { p = 1; next } /^\[/ { p = 0 } p && /^version *=/ { print $2; exit }' Cargo.toml)

if [ "$(id -u)" -ne 0 ]; then
  echo "tests/packaging.sh: needs root (dpkg -i, apt-get)" >&2
  fail needs_root "run as root"
  finish
  exit 1
fi

# man(1), for the man page check, and Debian's own python3, the interpreter
# whose dist-packages the package installs the client into (a python3 first
# on PATH may be another one, a pyenv's, that does not look there).
need_apt=()
command -v man >/dev/null 2>&1 || need_apt+=(man-db)
[ -x /usr/bin/python3 ] || need_apt+=(python3)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "tests/packaging.sh: installing ${need_apt[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# --- Build ----------------------------------------------------------------
b0=$(date +%s)
if bash packaging/build.sh deb rpm >"$scratch/build.out" 2>"$scratch/build.err"; then
  build_secs=$(($(date +%s) - b0))
  deb=$(grep '\.deb$' "$scratch/build.out" | tail -n 1)
  rpm=$(grep '\.rpm$' "$scratch/build.out" | tail -n 1)
  if [ -f "$deb" ] && [ -f "$rpm" ]; then
    pass build "$(basename "$deb"), $(basename "$rpm"), ${build_secs}s"
  else
    fail build "packaging/build.sh named no .deb or .rpm: $(tr '\n' ' ' <"$scratch/build.out")"
    finish
    exit 1
  fi
else
  build_secs=$(($(date +%s) - b0))
  tail -n 40 "$scratch/build.err"
  fail build "packaging/build.sh deb rpm failed"
  finish
  exit 1
fi

# --- The .deb's contents --------------------------------------------------
dpkg-deb -c "$deb" | awk '{ print substr($NF, 2) }' >"$scratch/deb.list"
missing=()
for f in /usr/bin/resilio /usr/lib/resilio/resilio_spank.so /etc/resilio/resilio.toml \
  /usr/share/man/man1/resilio.1.gz /usr/share/man/man1/resilio-run.1.gz \
  /usr/share/bash-completion/completions/resilio /usr/share/zsh/vendor-completions/_resilio \
  /usr/share/fish/vendor_completions.d/resilio.fish \
  /usr/lib/python3/dist-packages/resilio_client/__init__.py \
  /usr/share/doc/resilio/README.md /usr/share/doc/resilio/LICENSE /usr/share/doc/resilio/copyright \
  /usr/share/doc/resilio/docs/admin.md /usr/share/resilio/prometheus.yml /usr/share/resilio/grafana-dashboard.json; do
  grep -qxF "$f" "$scratch/deb.list" || missing+=("$f")
done
control=$(dpkg-deb -f "$deb" Version Depends Recommends Suggests)
if [ ${#missing[@]} -eq 0 ] && grep -q "^Version: $VERSION-" <<<"$control" &&
  grep -q "^Depends: .*libc6" <<<"$control" && grep -q "^Suggests: .*slurm-client" <<<"$control"; then
  pass deb_contents "$(grep -c . "$scratch/deb.list") entries; $(grep '^Depends' <<<"$control")"
else
  fail deb_contents "missing: ${missing[*]:-none}; control: $(tr '\n' ';' <<<"$control")"
fi

# --- Install (only where nothing of another resilio would be clobbered) ---
refuse=""
status=$(dpkg-query -W -f='${Status}' resilio 2>/dev/null || true)
if [ -n "$status" ] && ! grep -q "not-installed" <<<"$status"; then
  refuse="a resilio package is already installed ($status, $(dpkg-query -W -f='${Version}' resilio)); not touching it (dpkg --purge resilio, then run again)"
else
  for p in /usr/bin/resilio /usr/lib/resilio /etc/resilio/resilio.toml /usr/lib/python3/dist-packages/resilio_client; do
    if [ -e "$p" ]; then
      refuse="$p exists and belongs to no installed resilio package; not overwriting it"
      break
    fi
  done
fi

install_checks=(dpkg_install version man_page config_check run run_exit_code spank_plugin
  bash_completion conffile python_client purge)
if [ -n "$refuse" ]; then
  echo "tests/packaging.sh: NOT INSTALLING THE .deb: $refuse" >&2
  for c in "${install_checks[@]}"; do ignore "$c" "the .deb was not installed, see above"; done
else
  # Docker's Debian images exclude /usr/share/man (and doc) from every package
  # (/etc/dpkg/dpkg.cfg.d/excludes); the last matching filter wins, so
  # resilio's own are included back for this install, and said so.
  dpkg_opts=()
  if grep -hqs '^path-exclude' /etc/dpkg/dpkg.cfg.d/* 2>/dev/null; then
    excl_man=0
    excl_doc=0
    while read -r _ pat; do
      # shellcheck disable=SC2053 # a glob, on purpose
      [[ /usr/share/man/man1/resilio-run.1.gz == $pat ]] && excl_man=1
      [[ /usr/share/doc/resilio/README.md == $pat ]] && excl_doc=1
    done < <(grep -h '^path-exclude' /etc/dpkg/dpkg.cfg.d/*)
    excluded=""
    if [ "$excl_man" = 1 ]; then
      excluded+=" /usr/share/man"
      dpkg_opts+=(--path-include='/usr/share/man/man1/resilio*')
    fi
    if [ "$excl_doc" = 1 ]; then
      excluded+=" /usr/share/doc"
      dpkg_opts+=(--path-include='/usr/share/doc/resilio/*')
    fi
    if [ -n "$excluded" ]; then
      echo "tests/packaging.sh: this machine's dpkg excludes$excluded from packages" \
        "(/etc/dpkg/dpkg.cfg.d); installing with ${dpkg_opts[*]}" >&2
    fi
  fi

  installed_by_us=1
  if DEBIAN_FRONTEND=noninteractive dpkg "${dpkg_opts[@]}" -i "$deb" >"$scratch/dpkg.log" 2>&1; then
    pass dpkg_install "${dpkg_opts[*]:-no path filters}"
  else
    cat "$scratch/dpkg.log"
    fail dpkg_install
  fi

  # The installed binary, its version.
  out=$(/usr/bin/resilio --version 2>&1)
  if [ "$out" = "resilio $VERSION" ]; then pass version "$out"; else fail version "got '$out', Cargo.toml says $VERSION"; fi

  # man finds the installed page (dpkg -L: installed, not filtered out).
  page=$(man -w resilio-run 2>&1)
  if [ "$page" = /usr/share/man/man1/resilio-run.1.gz ] && dpkg -L resilio | grep -qx /usr/share/man/man1/resilio-run.1.gz &&
    [ -s /usr/share/man/man1/resilio-run.1.gz ] && man resilio-run 2>/dev/null | grep -q .; then
    pass man_page "$page"
  else
    fail man_page "man -w resilio-run: '$page'; dpkg -L resilio lists $(dpkg -L resilio 2>/dev/null | grep -c /usr/share/man/) man files"
  fi

  # The system config it installed, as every run loads it.
  out=$(env -u RESILIO_SYSTEM_CONFIG /usr/bin/resilio config check 2>&1)
  rc=$?
  if [ "$rc" = 0 ] && [ "$out" = "ok: /etc/resilio/resilio.toml" ]; then
    pass config_check "$out"
  else
    fail config_check "exit $rc: $out"
  fi

  # A short run with the installed config, from a directory without the clone.
  state=$(mktemp -d -p "$scratch")
  out=$(cd / && env -u RESILIO_SYSTEM_CONFIG RESILIO_STATE_DIR="$state" \
    /usr/bin/resilio run -- python3 -c 'print("step 1"); print("step 2")' 2>&1)
  rc=$?
  if [ "$rc" = 0 ] && grep -qx "step 1" <<<"$out" && grep -qx "step 2" <<<"$out" && [ -n "$(ls -A "$state/jobs" 2>/dev/null)" ]; then
    pass run "exit 0, output passed through, a journal in $state/jobs"
  else
    fail run "exit $rc: $out"
  fi
  state=$(mktemp -d -p "$scratch")
  (cd / && env -u RESILIO_SYSTEM_CONFIG RESILIO_STATE_DIR="$state" /usr/bin/resilio run -- sh -c 'exit 3') >"$scratch/exit3.log" 2>&1
  rc=$?
  if [ "$rc" = 3 ]; then pass run_exit_code "sh -c 'exit 3' gives 3"; else fail run_exit_code "exit $rc: $(cat "$scratch/exit3.log")"; fi

  # The SPANK plugin: an ELF shared object (e_type ET_DYN) with its hooks.
  so=/usr/lib/resilio/resilio_spank.so
  if [ -f "$so" ]; then
    magic=$(od -An -c -N4 "$so" | tr -d ' ')
    etype=$(od -An -tu2 -j16 -N2 "$so" | tr -d ' ')
    syms=$(readelf --dyn-syms -W "$so" 2>/dev/null | awk '$7 != "UND" { print $8 }')
    if [ "$magic" = '177ELF' ] && [ "$etype" = 3 ] && grep -qx slurm_spank_init <<<"$syms" &&
      grep -qx slurm_spank_task_init <<<"$syms" && grep -qx plugin_name <<<"$syms"; then
      pass spank_plugin "$so: ELF shared object, defines slurm_spank_init, slurm_spank_task_init, plugin_name"
    else
      fail spank_plugin "$so: magic '$magic', e_type '$etype', symbols: $(tr '\n' ' ' <<<"$syms")"
    fi
  else
    fail spank_plugin "$so is not installed"
  fi

  # bash completion: the file, sourced, registers resilio.
  comp=/usr/share/bash-completion/completions/resilio
  out=$(bash -c "source $comp && complete -p resilio" 2>&1)
  if [ -f "$comp" ] && grep -q 'complete .* resilio$' <<<"$out" &&
    [ -f /usr/share/zsh/vendor-completions/_resilio ] && [ -f /usr/share/fish/vendor_completions.d/resilio.fish ]; then
    pass bash_completion "$out"
  else
    fail bash_completion "$out"
  fi

  # The config is a conffile (kept on upgrades, dpkg asks before replacing an edited one).
  conffiles=$(dpkg-query --showformat='${Conffiles}' -W resilio 2>&1)
  if grep -q '^ /etc/resilio/resilio.toml [0-9a-f]\{32\}' <<<"$conffiles"; then
    pass conffile "$(tr -s ' \n' ' ' <<<"$conffiles")"
  else
    fail conffile "Conffiles: $conffiles"
  fi

  # The Python client, from the system's python3 (not from the clone).
  out=$(cd / && env -u PYTHONPATH /usr/bin/python3 -c 'import resilio_client as rc, resilio_client.hf, resilio_client.lightning; rc.step(1); print(rc.__file__)' 2>&1)
  if [ "$out" = /usr/lib/python3/dist-packages/resilio_client/__init__.py ]; then
    pass python_client "$out"
  else
    fail python_client "$out"
  fi
fi

# --- The RPM ----------------------------------------------------------------
rpm_list=$(rpm -qlp "$rpm" 2>&1)
rpm_version=$(rpm -qp --queryformat '%{VERSION}' "$rpm" 2>&1)
rpm_conf=$(rpm -qp --configfiles "$rpm" 2>&1)
missing=()
for f in /usr/bin/resilio /usr/share/man/man1/resilio.1.gz /usr/share/man/man1/resilio-run.1.gz \
  /usr/lib/resilio/resilio_spank.so /usr/share/bash-completion/completions/resilio /etc/resilio/resilio.toml; do
  grep -qxF "$f" <<<"$rpm_list" || missing+=("$f")
done
if [ ${#missing[@]} -eq 0 ] && [ "$rpm_version" = "$VERSION" ] && grep -qx /etc/resilio/resilio.toml <<<"$rpm_conf"; then
  pass rpm "$(basename "$rpm"): $(grep -c . <<<"$rpm_list") files, version $rpm_version, config /etc/resilio/resilio.toml"
else
  fail rpm "missing: ${missing[*]:-none}; version '$rpm_version' (Cargo.toml $VERSION); config files: $rpm_conf"
fi

# --- The Spack recipe (parsed, not run: no Spack here) ------------------------
out=$(python3 - "$REPO/packaging/spack/package.py" "$VERSION" 2>&1 <<'EOF'
import ast, sys

path, want = sys.argv[1], sys.argv[2]
tree = ast.parse(open(path).read(), path)
classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
assert [c.name for c in classes] == ["Resilio"], [c.name for c in classes]
cls = classes[0]
assert [ast.unparse(b) for b in cls.bases] == ["CargoPackage"], [ast.unparse(b) for b in cls.bases]
calls = {}
for node in ast.walk(cls):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        calls.setdefault(node.func.id, []).append(node)
def consts(name):
    return [[a.value for a in c.args if isinstance(a, ast.Constant)] for c in calls.get(name, [])]
versions = [v[0] for v in consts("version") if v and v[0] not in ("main", "develop", "master")]
assert versions, "no numbered version()"
assert versions[0] == want, "newest version() %s, Cargo.toml %s" % (versions[0], want)
assert ["rust@1.88:"] in consts("depends_on"), "no depends_on('rust@1.88:')"
deps_when = [ast.unparse(k.value) for c in calls.get("depends_on", []) for k in c.keywords if k.arg == "when"]
assert any(c[:1] == ["slurm"] for c in consts("depends_on")) and "'+spank'" in deps_when, "no slurm when +spank"
assert any(v[:1] == ["spank"] for v in consts("variant")), "no spank variant"
assigns = {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
assert {"git", "homepage"} <= assigns, assigns
methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
assert {"install_plugin", "install_man_pages_and_completions"} <= methods, methods
print("class Resilio(CargoPackage), version %s, rust@1.88:, +spank -> slurm" % versions[0])
EOF
)
if [ $? -eq 0 ]; then pass spack_recipe "$out"; else fail spack_recipe "$(tail -n 1 <<<"$out")"; fi

# --- Removal ------------------------------------------------------------------
if [ -z "$refuse" ]; then
  DEBIAN_FRONTEND=noninteractive dpkg --purge resilio >"$scratch/purge.log" 2>&1
  rc=$?
  left=()
  for p in /usr/bin/resilio /usr/lib/resilio /etc/resilio /usr/lib/python3/dist-packages/resilio_client \
    /usr/share/man/man1/resilio-run.1.gz /usr/share/doc/resilio /usr/share/resilio; do
    [ -e "$p" ] && left+=("$p")
  done
  if [ "$rc" = 0 ] && [ ${#left[@]} -eq 0 ] && ! dpkg-query -W -f='${Status}' resilio 2>/dev/null | grep -q ' installed' &&
    ! grep -qi warning "$scratch/purge.log"; then
    pass purge "dpkg --purge resilio: nothing left"
  else
    fail purge "exit $rc; left: ${left[*]:-none}; $(tr '\n' ' ' <"$scratch/purge.log")"
  fi
fi

finish
