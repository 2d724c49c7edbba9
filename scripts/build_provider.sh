#!/usr/bin/env bash
# terraform-provider-openstack, built here from the Go module proxy and laid out as a
# Terraform filesystem mirror (the "unpacked" layout), once per machine:
#
#   $DEPLOYER_TF_PLUGIN_MIRROR/registry.terraform.io/terraform-provider-openstack/openstack/
#       3.4.0/linux_amd64/terraform-provider-openstack_v3.4.0
#
# (default mirror: /var/cache/deployer/terraform-plugins). The deployer installs the
# provider from it when the mirror is named (spec terraform.plugin_mirror or
# $DEPLOYER_TF_PLUGIN_MIRROR): what a site without the Terraform registry does. See
# docs/openstack.md, "How the provider is found".
#
# Pinned and verified as Go verifies every module:
# - the provider's module zip is checked by `go mod download` against the checksum database
#   (sum.golang.org, reached through the proxy) and against the hash pinned below, so the
#   pin holds even where GOSUMDB is off or GONOSUMDB/GOPRIVATE covers it;
# - every dependency is checked against the provider's own go.sum (-mod=readonly: a module
#   missing from it is an error, not a download), and the module cache against go.sum
#   (`go mod verify`).
# Reproducible: the Go toolchain is pinned (GOTOOLCHAIN; a newer or older go fetches this
# one from the proxy, verified the same way), -trimpath, CGO off, and upstream's release
# ldflags (.goreleaser.yml: -s -w -X .../openstack.version={{.Version}}): the same bytes on
# every machine, so the hash in terraform/openstack/.terraform.lock.hcl matches.
set -euo pipefail

readonly MODULE=github.com/terraform-provider-openstack/terraform-provider-openstack/v3
readonly VERSION=3.4.0
readonly MODULE_SUM='h1:Ap8gvameIY5ZM7CMh7fngP/VoIyeupzKX3izoyfp9yg='
readonly TOOLCHAIN=go1.26.8
# The binary this toolchain makes for linux_amd64 (checked: a mismatch is said, not fatal).
readonly EXPECTED_SHA256_linux_amd64='76d5da9548ae59d1d9bff9112d04d4c3652d659f11cacc4fc77802e0b8a19941'
readonly LDFLAGS="-s -w -X ${MODULE}/openstack.version=${VERSION}"
readonly MIRROR="${DEPLOYER_TF_PLUGIN_MIRROR:-/var/cache/deployer/terraform-plugins}"

die() { echo "build_provider: $*" >&2; exit 2; }

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[ -x "$GO" ] || die "no Go found: install Go >= 1.21 (https://go.dev/dl/) or set GO=/path/to/go"
# Only the build settings set here count: a user's GOFLAGS (-mod=mod would let go.sum be
# rewritten), GOAMD64 or GOEXPERIMENT would change the bytes.
export GOTOOLCHAIN="$TOOLCHAIN" GOFLAGS='-mod=readonly -buildvcs=false' CGO_ENABLED=0 GOEXPERIMENT= GO111MODULE=on
unset GOAMD64 GOARM GO386 GOOS GOARCH
ver="$(GOTOOLCHAIN=local "$GO" env GOVERSION)"
case "$ver" in
  go1.[0-9]|go1.[0-9].*|go1.1[0-9]|go1.1[0-9].*|go1.20|go1.20.*)
    die "$GO is $ver; GOTOOLCHAIN needs Go >= 1.21 (Debian 12's golang-go is 1.19): install Go from https://go.dev/dl/" ;;
esac
platform="$("$GO" env GOOS)_$("$GO" env GOARCH)"
readonly DEST="$MIRROR/registry.terraform.io/terraform-provider-openstack/openstack/$VERSION/$platform"
readonly BIN="$DEST/terraform-provider-openstack_v$VERSION"

expected_var="EXPECTED_SHA256_${platform}"
expected="${!expected_var:-}"

# Built once per machine: the binary this script builds is kept (-trimpath leaves -ldflags out
# of the build info, so where no hash is recorded for the platform, the toolchain and module say).
if [ -x "$BIN" ]; then
  if [ -n "$expected" ]; then
    have="$(sha256sum "$BIN" | cut -d' ' -f1)"
    [ "$have" = "$expected" ] && kept=1 || kept=
  else
    info="$("$GO" version -m "$BIN" 2>/dev/null || true)"
    grep -q "^${BIN}: ${TOOLCHAIN}\$" <<<"$info" && grep -q "^	path	${MODULE}\$" <<<"$info" && kept=1 || kept=
  fi
  if [ -n "$kept" ]; then
    echo "terraform-provider-openstack $VERSION already in $MIRROR ($BIN)"
    exit 0
  fi
fi

work="$(mktemp -d)"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
start=$SECONDS

echo "fetching $MODULE@v$VERSION from ${GOPROXY:-$("$GO" env GOPROXY)}"
json="$("$GO" mod download -json "$MODULE@v$VERSION")"
field() { sed -n "s/^\t\"$1\": \"\(.*\)\",\?\$/\1/p" <<<"$json"; }
if [ -n "$(field Error)" ]; then die "go mod download: $(field Error)"; fi
sum="$(field Sum)"
[ "$sum" = "$MODULE_SUM" ] || die "$MODULE@v$VERSION has hash $sum, pinned $MODULE_SUM: refusing to build it"
cp -r "$(field Dir)" "$work/src"   # the module cache is read-only; the build happens in a copy
chmod -R u+w "$work/src"

cd "$work/src"
echo "building with $("$GO" env GOVERSION) for $platform (dependencies checked against the provider's go.sum)"
"$GO" build -trimpath -ldflags="$LDFLAGS" -o "$work/terraform-provider-openstack_v$VERSION" .
"$GO" mod verify >/dev/null
built=$((SECONDS - start))

sha="$(sha256sum "$work/terraform-provider-openstack_v$VERSION" | cut -d' ' -f1)"
if [ -n "$expected" ] && [ "$sha" != "$expected" ]; then
  echo "warning: sha256 $sha differs from the $expected this script's build gave for $platform;" \
       "terraform/openstack/.terraform.lock.hcl will not accept it (see docs/openstack.md)" >&2
fi

# Into the mirror: the package directory holds the binary only (Terraform hashes the whole
# directory for the lock file), put in place by a rename. sudo where the mirror is root's.
as=()
if ! mkdir -p "$DEST" 2>/dev/null || [ ! -w "$DEST" ]; then
  [ "$(id -u)" != 0 ] && command -v sudo >/dev/null \
    || die "cannot write $MIRROR: run as root, or set DEPLOYER_TF_PLUGIN_MIRROR to a folder you own"
  as=(sudo)
  "${as[@]}" mkdir -p "$DEST"
fi
"${as[@]}" install -m 0755 "$work/terraform-provider-openstack_v$VERSION" "$DEST/.partial"
"${as[@]}" mv -f "$DEST/.partial" "$BIN"

echo "built terraform-provider-openstack $VERSION in ${built}s: $BIN (sha256 $sha)"
echo "use it: terraform.plugin_mirror: $MIRROR in cluster.yaml, or export DEPLOYER_TF_PLUGIN_MIRROR=$MIRROR"
