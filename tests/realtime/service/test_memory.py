"""Freed memory goes back to the OS on a timer, not only when a stream goes.

bench/soak.py found the serve process's RSS climbing for half an hour while the memory in use
(glibc's own count) stayed flat: cameras never end, so the trim after a stream goes never ran for
them. The check runs in a fresh interpreter, whose heap holds only what it allocates here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# ~190 MB in 64 KiB blocks (below glibc's mmap threshold: on the heap), all freed but the newest,
# which keeps the heap from shrinking at its top: freed and still resident until a trim.
SCRIPT = """
import asyncio, resource
from realtime.service.memory import trim_every

def rss_mb():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20

blocks = [b"\\x01" * (64 * 1024) for _ in range(3000)]
pin = blocks[-1]
del blocks
before = rss_mb()

async def main():
    trimming = asyncio.create_task(trim_every(0.05))
    await asyncio.sleep(0.5)
    trimming.cancel()

asyncio.run(main())
print(round(before), round(rss_mb()))
"""


def test_freed_memory_is_handed_back_while_no_stream_ends() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split())
    assert before > 150, f"the blocks did not stay resident after being freed ({before} MB): nothing to check"
    assert after < before - 100, f"RSS {before} MB before the timer's trims, {after} MB after"
