#!/usr/bin/env python3
"""gen_pp_schedule_fixture.py — torch.distributed.pipelining's compute orders, the reference for
tests/unit/test_pp_schedule.c (graphtrain's generators in src/runtime/pp_schedule.c are ports).

Writes tests/fixtures/pp_schedule/torch_orders.txt: one line per schedule, pp degree,
micro-batch count and rank, "SCHEDULE PP MICRO rank R: A A ...", the rank's compute actions in
torch's text form (STAGE KIND MICROBATCH) with torch's idle slots and REDUCE_GRAD actions left out
and DualPipeV's OVERLAP_F_B written as its forward then its backward.

The schedule objects are made without a process group: the generators only read the sizes set
below. Left out, with the reason:
  - 1F1B's last rank: Schedule1F1B._get_pipeline_order starts it at F1 and ends it at F4 when the
    rank has no warm-up forwards (torch 2.15); the runtime loop (_step_microbatches) runs
    F0 B0 F1 B1 ..., which graphtrain follows;
  - DualPipeV with fewer micro-batches than stages: torch refuses it (so does graphtrain).

Run: python3 tools/gen_pp_schedule_fixture.py  (needs torch; tested with 2.15)."""
import os

import torch.distributed.pipelining.schedules as S

SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble", "DualPipeV"]


def orders(name, pp, nmb):
    cls = S.get_schedule_class(name)
    o = cls.__new__(cls)
    o._n_microbatches = nmb
    o.pp_group_size = pp
    if name in ("GPipe", "1F1B"):
        o._num_stages = pp
        return o._get_pipeline_order()
    o.n_local_stages = 2
    o._num_stages = o.num_stages = 2 * pp
    o.number_of_rounds = max(1, nmb // pp)
    o.microbatches_per_round = nmb // o.number_of_rounds
    return {r: o._calculate_single_rank_operations(r) for r in range(pp)}


def text(actions):
    out = []
    for a in actions:
        if a is None:
            continue
        if a.computation_type == S.OVERLAP_F_B:
            out.extend(str(sub) for sub in a.sub_actions)
        elif a.computation_type in (S.FORWARD, S.FULL_BACKWARD, S.BACKWARD_INPUT,
                                    S.BACKWARD_WEIGHT):
            out.append(str(a))
    return " ".join(out)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "tests/fixtures/pp_schedule/torch_orders.txt")
    lines = []
    for name in SCHEDULES:
        for pp in (2, 4):
            for nmb in (4, 8):
                if name == "DualPipeV" and nmb < 2 * pp:
                    continue
                for rank, actions in sorted(orders(name, pp, nmb).items()):
                    if name == "1F1B" and rank == pp - 1:
                        continue
                    lines.append(f"{name} {pp} {nmb} rank {rank}: {text(actions)}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} lines to {path}")


if __name__ == "__main__":
    main()
