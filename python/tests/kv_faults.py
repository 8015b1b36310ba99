"""Faults for the engine adapter tests, over the real gdskit.kv.BlockStore (no test functions here).

The adapter tests run the real store on temporary folders. What they need beyond it:

- damage_block(root, key, block_bytes): damages the data of `key`'s block on disk (found by the key in its
  header), so that the store's checksum turns the next get of it into a miss, as a bad sector would.
- fresh_folder(prefix): a new temporary folder, removed when the test process ends (a store reserves its
  whole capacity on disk when it is made).
- Faulty: the real store with two faults that cannot be caused for one chosen key from Python (the syscall
  seam that fails or slows a device is C++ only): keys in faults["put_fail"] are withheld from the store's
  puts and reported not stored (as ENOSPC would), and with faults["delay_s"] a submitted operation reports
  done only after that many seconds or cancel() (the real store answers within milliseconds here).
"""
import atexit
import os
import shutil
import tempfile
import threading

from gdskit.kv import BlockStore

faults = {"put_fail": set(), "delay_s": 0.0}

_HEADER_MAGIC = b"GDSKVBLK"  # the first bytes of a block header page (docs/kv.md, "On disk")
_PAGE = 4096


def reset():
    faults["put_fail"].clear()
    faults["delay_s"] = 0.0


def fresh_folder(prefix: str) -> str:
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, True)
    return folder


def damage_block(root, key: bytes, block_bytes: int) -> int:
    """Flips one bit in the data of every block of `key` in the stores under the folder `root` (their rank
    subfolders included); returns how many blocks it damaged. A slot is [data padded to 4 KiB][header page],
    and the header holds the key's bytes, so the data lies right before the page that names the key."""
    padded = (block_bytes + _PAGE - 1) // _PAGE * _PAGE
    damaged = 0
    for folder, _, files in os.walk(os.fspath(root)):
        if "gdskit-kv.data" not in files:
            continue
        with open(os.path.join(folder, "gdskit-kv.data"), "r+b") as f:
            data = f.read()
            at = data.find(key)
            while at >= 0:
                page = at - at % _PAGE
                if data[page:page + len(_HEADER_MAGIC)] == _HEADER_MAGIC and page >= padded:
                    pos = page - padded + block_bytes // 2
                    f.seek(pos)
                    f.write(bytes([data[pos] ^ 0x10]))
                    damaged += 1
                at = data.find(key, at + 1)
            f.flush()
            os.fsync(f.fileno())
    return damaged


def _subset(blocks, positions):
    if isinstance(blocks, (list, tuple)):
        return [blocks[i] for i in positions]
    return blocks[list(positions)]


class _Future:
    """A submitted operation of Faulty: the real store's future (for the keys not withheld), reported done
    after the delay or cancel(), with the withheld keys not stored."""

    def __init__(self, real, n, positions, delay_s):
        self._real, self._n, self._positions = real, n, positions
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._done = threading.Event()
        self._cancel = threading.Event()
        threading.Thread(target=self._run, args=(delay_s,), daemon=True).start()

    def _run(self, delay_s):
        if delay_s:
            self._cancel.wait(delay_s)
        if self._real is not None:
            if self._cancel.is_set():
                self._real.cancel()
            self._real.result()
        self._done.set()
        os.eventfd_write(self._fd, 1)

    def fileno(self):
        return self._fd

    def done(self):
        return self._done.is_set()

    def cancel(self):
        if self._done.is_set():
            return False
        self._cancel.set()
        return True

    def result(self, timeout=None):
        if not self._done.wait(timeout):
            raise TimeoutError("the operation is not done")
        got = self._real.result() if self._real is not None else []
        out = [False] * self._n
        for j, i in enumerate(self._positions):
            out[i] = got[j]
        return out

    def __del__(self):
        try:
            os.close(self._fd)
        except OSError:
            pass


class Faulty(BlockStore):
    """gdskit.kv.BlockStore with the faults of `faults` injected around its calls."""

    def _kept(self, keys):
        keys = list(keys)
        return keys, [i for i, k in enumerate(keys) if k not in faults["put_fail"]]

    def put(self, keys, blocks, **kw):
        keys, keep = self._kept(keys)
        if len(keep) == len(keys):
            return super().put(keys, blocks, **kw)
        got = super().put([keys[i] for i in keep], _subset(blocks, keep), **kw) if keep else []
        out = [False] * len(keys)
        for j, i in enumerate(keep):
            out[i] = got[j]
        return out

    def submit_put(self, keys, blocks, **kw):
        keys, keep = self._kept(keys)
        if len(keep) == len(keys) and not faults["delay_s"]:
            return super().submit_put(keys, blocks, **kw)
        real = super().submit_put([keys[i] for i in keep], _subset(blocks, keep), **kw) if keep else None
        return _Future(real, len(keys), keep, faults["delay_s"])

    def submit_get(self, keys, out, **kw):
        real = super().submit_get(keys, out, **kw)
        if not faults["delay_s"]:
            return real
        keys = list(keys)
        return _Future(real, len(keys), list(range(len(keys))), faults["delay_s"])
