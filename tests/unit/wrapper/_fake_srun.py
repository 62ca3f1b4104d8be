"""A stand-in for srun in the launcher's multi-node tests (no Slurm): `srun --nodes=N ... CMD...` runs CMD N times
on this host, as the tasks of N "nodes" (SLURM_NODEID 0..N-1), and does what the batch wrapper relies on srun
for: its standard input copied to every task's, SIGUSR2 forwarded to every task, exit 0 when every task exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading


def main(argv: list[str]) -> int:
    i = 0
    while i < len(argv) and argv[i].startswith("--"):
        i += 1
    command = argv[i:]
    nodes = int(next(a for a in argv[:i] if a.startswith("--nodes=")).split("=", 1)[1])
    tasks = [subprocess.Popen(command, stdin=subprocess.PIPE, env={**os.environ, "SLURM_NODEID": str(n)})
             for n in range(nodes)]

    def forward(signum: int, frame: object) -> None:
        for t in tasks:
            if t.poll() is None:
                t.send_signal(signum)

    signal.signal(signal.SIGUSR2, forward)

    def copy_stdin() -> None:
        while data := os.read(0, 4096):
            for t in tasks:
                assert t.stdin is not None
                try:
                    t.stdin.write(data)
                    t.stdin.flush()
                except OSError:
                    pass

    threading.Thread(target=copy_stdin, daemon=True).start()
    codes = [t.wait() for t in tasks]
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
