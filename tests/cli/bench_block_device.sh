#!/usr/bin/env bash
# gdskit bench on a block device, as gdsio users benchmark raw NVMe: the size comes from the device (st_size
# is 0 for block devices), so a verified write and read of a loop device cover every byte asked for.
source "$(dirname "$0")/lib.bash"
[ "$(id -u)" = 0 ] || { echo "skipped: needs root for a loop device"; exit 77; }
command -v losetup >/dev/null || { echo "skipped: no losetup"; exit 77; }
truncate -s 64M "$work/disk.img"
dev=$(losetup -f --show "$work/disk.img" 2>/dev/null) || { echo "skipped: no free loop device"; exit 77; }
trap 'losetup -d "$dev" 2>/dev/null; rm -rf "$work"' EXIT

out=$("$gdskit" bench -f "$dev" -x host -I 1 -s 16M -i 1M -w 2 -k 5 -V 2>&1) || fail "write to $dev: $out"
out=$("$gdskit" bench -f "$dev" -x host -I 0 -s 16M -i 1M -w 2 -k 5 -V 2>&1) || fail "read of $dev: $out"
grep -q "verify: *OK" <<<"$out" || fail "read of $dev not verified: $out"
# Past the device's end is refused up front with its real size, not "the file has 0 B".
out=$("$gdskit" bench -f "$dev" -x host -I 0 -s 64M -i 1M -w 2 2>&1)
rc=$?
[ $rc -eq 2 ] || fail "a read past the end of $dev exited $rc: $out"
grep -q "has 64" <<<"$out" || fail "the refusal does not give the device's size: $out"
echo "PASS bench on a block device"
