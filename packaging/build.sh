#!/usr/bin/env bash
# Builds resilio's packages from a clone (packaging/README.md):
#
#   bash packaging/build.sh            # target/debian/resilio_VERSION-1_ARCH.deb
#   bash packaging/build.sh deb rpm    # and target/packaging/rpm/RPMS/ARCH/resilio-VERSION-1.ARCH.rpm
#
# Steps: the release binary (`cargo build --release --locked`, reused when
# up to date); the SPANK plugin (`make -C slurm-plugin`, against Debian's
# spank.h from libslurm-dev); the man pages (`resilio man`, gzipped) and the
# bash, zsh and fish completions (`resilio completions`) into
# target/packaging/; then `cargo deb --no-build`, whose file list is
# [package.metadata.deb] in Cargo.toml. `rpm` also stages the same files
# under target/packaging/root/ and runs rpmbuild on packaging/rpm/resilio.spec
# (which packages those prebuilt files; it compiles nothing).
#
# What is missing is installed (as root): make, gcc, libslurm-dev, and rpm for
# `rpm`, from apt; cargo-deb from crates.io, once per version, into a cache
# outside the clone ($RESILIO_CI_CACHE, default /var/cache/resilio-ci, or
# ~/.cache/resilio-ci when that is not writable), like tests/fuzz.sh's
# cargo-fuzz.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_DEB_VERSION=3.8.0 # needs rustc 1.85 or later to install

kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(deb)
want_deb=0
want_rpm=0
for k in "${kinds[@]}"; do
  case $k in
    deb) want_deb=1 ;;
    rpm) want_rpm=1 ;;
    *)
      echo "usage: $0 [deb] [rpm]" >&2
      exit 2
      ;;
  esac
done

say() { echo "packaging/build.sh: $*" >&2; }

# Build tools from apt, when missing.
need_apt=()
command -v make >/dev/null 2>&1 || need_apt+=(make)
command -v cc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
[ -f /usr/include/slurm/spank.h ] || need_apt+=(libslurm-dev)
command -v gzip >/dev/null 2>&1 || need_apt+=(gzip)
if [ "$want_rpm" = 1 ]; then
  command -v rpmbuild >/dev/null 2>&1 || need_apt+=(rpm)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing ${need_apt[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    say "need root to install ${need_apt[*]}"
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# cargo-deb, once per version, into the cache outside the clone.
if [ "$want_deb" = 1 ]; then
  CACHE=${RESILIO_CI_CACHE:-/var/cache/resilio-ci}
  if ! mkdir -p "$CACHE" 2>/dev/null || [ ! -w "$CACHE" ]; then
    CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/resilio-ci
    mkdir -p "$CACHE"
  fi
  ROOT=$CACHE/cargo-deb-$CARGO_DEB_VERSION
  if [ ! -x "$ROOT/bin/cargo-deb" ]; then
    exec 9>"$CACHE/.lock"
    flock 9 # another run installing the same thing: wait for it
    if [ ! -x "$ROOT/bin/cargo-deb" ]; then
      say "installing cargo-deb $CARGO_DEB_VERSION into $ROOT"
      rm -rf "$ROOT.partial"
      cargo install --quiet --locked --root "$ROOT.partial" cargo-deb --version "$CARGO_DEB_VERSION" >&2
      rm -rf "$ROOT"
      mv "$ROOT.partial" "$ROOT"
    fi
    exec 9>&-
  fi
  export PATH=$ROOT/bin:$PATH
fi

# The release binary (cargo-deb's "target/release/" means this target dir).
TARGET=${CARGO_TARGET_DIR:-target}
say "cargo build --release --locked"
cargo build --release --locked --quiet
BIN=$TARGET/release/resilio
# tests/run.sh builds ahead, at idle priority: the tools and the release
# binary only (the SPANK plugin's directory is the Slurm suite's then).
[ -z "${RESILIO_PACKAGING_BUILD_ONLY:-}" ] || exit 0
VERSION=$("$BIN" --version | awk '{ print $2 }')

# Generated assets: the paths Cargo.toml's [package.metadata.deb] names.
OUT=target/packaging
rm -rf "$OUT/man" "$OUT/completions" "$OUT/root"
mkdir -p "$OUT/man" "$OUT/completions"

say "make -C slurm-plugin"
make -s -C slurm-plugin resilio_spank.so
cp slurm-plugin/resilio_spank.so "$OUT/resilio_spank.so"

"$BIN" man --dir "$OUT/man" >/dev/null
[ -f "$OUT/man/resilio.1" ] && [ -f "$OUT/man/resilio-run.1" ] || {
  say "resilio man --dir wrote no resilio.1 / resilio-run.1"
  exit 1
}
gzip -n -9 -f "$OUT"/man/*.1

"$BIN" completions bash >"$OUT/completions/resilio.bash"
"$BIN" completions zsh >"$OUT/completions/_resilio"
"$BIN" completions fish >"$OUT/completions/resilio.fish"

if [ "$want_deb" = 1 ]; then
  say "cargo deb --no-build"
  # Its last line on stdout is the path of the .deb it wrote.
  cargo deb --no-build | tail -n 1
fi

if [ "$want_rpm" = 1 ]; then
  # The same files as the .deb, staged as they are installed.
  R=$OUT/root
  strip=()
  command -v strip >/dev/null 2>&1 && strip=(-s) # as cargo-deb does for the .deb
  install -D -m 0755 "${strip[@]}" "$BIN" "$R/usr/bin/resilio"
  install -D -m 0644 "$OUT/resilio_spank.so" "$R/usr/lib/resilio/resilio_spank.so"
  install -D -m 0644 conf/resilio.toml "$R/etc/resilio/resilio.toml"
  install -d "$R/usr/share/man/man1"
  install -m 0644 "$OUT"/man/*.1.gz "$R/usr/share/man/man1/"
  install -D -m 0644 "$OUT/completions/resilio.bash" "$R/usr/share/bash-completion/completions/resilio"
  install -D -m 0644 "$OUT/completions/_resilio" "$R/usr/share/zsh/site-functions/_resilio"
  install -D -m 0644 "$OUT/completions/resilio.fish" "$R/usr/share/fish/vendor_completions.d/resilio.fish"
  install -D -m 0644 conf/prometheus.yml "$R/usr/share/resilio/prometheus.yml"
  install -D -m 0644 conf/grafana-dashboard.json "$R/usr/share/resilio/grafana-dashboard.json"
  install -d "$R/usr/share/doc/resilio/docs"
  install -m 0644 README.md "$R/usr/share/doc/resilio/"
  install -m 0644 docs/*.md "$R/usr/share/doc/resilio/docs/"
  install -D -m 0644 LICENSE "$R/usr/share/licenses/resilio/LICENSE"

  TOP=$(pwd)/$OUT/rpm
  rm -rf "$TOP"
  mkdir -p "$TOP"
  say "rpmbuild -bb packaging/rpm/resilio.spec"
  rpmbuild -bb --quiet \
    --define "_topdir $TOP" \
    --define "resilio_staging $(pwd)/$R" \
    packaging/rpm/resilio.spec >"$OUT/rpmbuild.log" 2>&1 || {
    tail -n 40 "$OUT/rpmbuild.log" >&2
    say "rpmbuild failed (log: $OUT/rpmbuild.log)"
    exit 1
  }
  find "$TOP/RPMS" -name "resilio-$VERSION-*.rpm" | head -n 1
fi
