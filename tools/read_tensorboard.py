#!/usr/bin/env python3
"""read_tensorboard.py DIR — the loss of every step in the TensorBoard event files of DIR, read by
TensorBoard's own reader (EventAccumulator), for tests/numerics/test_tensorboard.c.

Prints "tags T1 T2 ..." (the scalar tags found) and then one "loss STEP VALUE" line per event.
Exits 3 when the tensorboard package is not installed (the test then skips this part)."""
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:  # a bare machine: the C test's own parse still runs
    print(f"tensorboard is not installed ({e}); pip install tensorboard")
    sys.exit(3)

acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
tags = acc.Tags().get("scalars", [])
print("tags", " ".join(sorted(tags)))
if "loss" in tags:
    for ev in acc.Scalars("loss"):
        print("loss", ev.step, repr(float(ev.value)))
