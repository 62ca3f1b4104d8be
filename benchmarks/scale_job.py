"""The job bench_controller_scale.py time-slices: no PyTorch, so that the controller's rounds are measured,
not 16 interpreters importing torch at once on the bench's 2 cores. It keeps the wrapper's contract: it runs
until the controller's signal (forwarded by gandiva-wrapper), then exits 75 (checkpointed, suspend me) at
once; the wrapper then asks Slurm for the held requeue as for any job."""

import signal
import sys
import time

signal.signal(signal.SIGUSR2, lambda *_: sys.exit(75))
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})  # the wrapper starts its children with it blocked
while True:
    time.sleep(0.1)
