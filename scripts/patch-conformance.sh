#!/usr/bin/env bash
# Runs `gdskit patch` against real driver tags: for each tag, extracts only the files the patch reads from a clone
# of NVIDIA/open-gpu-kernel-modules (work tree or bare git dir) into a temporary folder, then runs
# check, apply, check, revert and compares the result byte for byte with the tag.
#
#   scripts/patch-conformance.sh [--gdskit PATH] [--markdown] CLONE TAG...
#
# Nothing from the clone is copied into this repository. Exit status: 0 when every tag passes.
set -euo pipefail

gdskit=${GDSKIT:-gdskit}
markdown=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --gdskit) gdskit=$2; shift 2 ;;
    --markdown) markdown=1; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
[[ $# -ge 2 ]] || { echo "usage: $0 [--gdskit PATH] [--markdown] CLONE TAG..." >&2; exit 2; }
clone=$1; shift
if git -C "$clone" rev-parse --is-bare-repository >/dev/null 2>&1; then
  git_dir=$(git -C "$clone" rev-parse --absolute-git-dir)
else
  echo "$clone: not a git clone (work tree or bare)" >&2; exit 2
fi
command -v "$gdskit" >/dev/null || [[ -x $gdskit ]] || { echo "gdskit not found: $gdskit" >&2; exit 2; }

files=(version.mk src/nvidia/src/kernel/gpu/bif/kernel_bif.c src/nvidia/generated/g_kern_bus_nvoc.c
       src/nvidia/interface/nvrm_registry.h)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

summary() {  # state counts from a --json report: "o/a/u/na"
  python3 -c 'import json,sys; s=json.load(sys.stdin)["summary"]; print("%d/%d/%d/%d" % (s["original"], s["applied"], s["unknown"], s["n/a"]))'
}
field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

if [[ $markdown == 1 ]]; then
  echo "| tag | detected | layout | check before (o/a/u/n/a) | apply | check after | revert | byte-identical | result |"
  echo "|---|---|---|---|---|---|---|---|---|"
else
  printf '%-12s %-10s %-28s %-10s %-7s %-10s %-7s %-6s %s\n' tag version layout before apply after revert same result
fi
fail=0
for tag in "$@"; do
  dir=$work/$tag
  mkdir -p "$dir"
  if ! git --git-dir="$git_dir" rev-parse -q --verify "refs/tags/$tag" >/dev/null; then
    echo "$tag: no such tag in $clone" >&2; fail=1; continue
  fi
  git --git-dir="$git_dir" archive "$tag" -- "${files[@]}" | tar -x -C "$dir"
  before_json=$("$gdskit" patch check --src "$dir" --json || true)
  version=$(field '["driver_version"]' <<<"$before_json")
  layout=$(python3 -c 'import json,sys; l=json.load(sys.stdin)["layout"]; print("%s,_%s,%s" % (l["hal_comment_style"], l["bool_stub_suffix"], "pcie" if l["has_pcie_p2p_type"] else "no-pcie"))' <<<"$before_json")
  before=$(summary <<<"$before_json")
  apply=ok; "$gdskit" patch apply --src "$dir" --json >"$dir.apply.json" || apply=FAIL
  after=$("$gdskit" patch check --src "$dir" --json | summary || true)
  again=ok; "$gdskit" patch apply --src "$dir" --json >"$dir.again.json" || again=FAIL
  grep -q '"unchanged (already applied)"' "$dir.again.json" || again=FAIL
  revert=ok; "$gdskit" patch revert --src "$dir" --json >"$dir.revert.json" || revert=FAIL
  same=yes
  for f in "${files[@]:1:2}"; do
    git --git-dir="$git_dir" show "$tag:$f" | cmp -s - "$dir/$f" || same=NO
    [[ -e $dir/$f.gdskit-orig ]] && same=NO
  done
  result=PASS
  [[ $apply == ok && $again == ok && $revert == ok && $same == yes && ${after#*/} != 0/* ]] || result=FAIL
  [[ ${before%%/*} == 0 ]] && result=FAIL
  [[ $(cut -d/ -f3 <<<"$after") == 0 ]] || result=FAIL
  [[ $result == PASS ]] || fail=1
  apply_col="$apply (idempotent: $again)"
  if [[ $markdown == 1 ]]; then
    echo "| $tag | $version | $layout | $before | $apply_col | $after | $revert | $same | $result |"
  else
    printf '%-12s %-10s %-28s %-10s %-7s %-10s %-7s %-6s %s\n' "$tag" "$version" "$layout" "$before" "$apply" "$after" "$revert" "$same" "$result"
  fi
done
exit $fail
