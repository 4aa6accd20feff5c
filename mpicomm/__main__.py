"""``python -m mpicomm info|algorithms``: what this installation sees, and which algorithms it has.

``info``: the MPI library, CUDA-awareness, GPUs and rank layout. Run it once
after pointing mpi4py at a cluster's MPI, or under the launcher
(``mpiexec -n 4 python -m mpicomm info``) to see every rank's placement.

``algorithms``: every registered (collective, algorithm) with its
restrictions and α-β-γ cost, and the selection table's rules
(``--markdown`` for a table to paste into documents).
"""

from __future__ import annotations

import argparse
import sys


def info() -> int:
    import mpi4py

    import mpicomm
    from mpicomm import buffers, config, device
    from mpicomm.launcher import from_environment

    launch = from_environment()  # before MPI starts, as a program would
    from mpi4py import MPI

    comm = mpicomm.Comm()
    rows = comm.gather((comm.rank, comm.local_rank, comm.local_size, comm.node, comm.host, comm.device), root=0)
    if comm.rank != 0:
        return 0
    levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
              MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
    cupy = device.cupy_module()
    forced = config.cuda_aware_setting()
    lines = [
        f"mpicomm        {mpicomm.__version__}",
        f"mpi4py         {mpi4py.__version__}",
        f"MPI library    {MPI.Get_library_version().splitlines()[0].strip()}",
        f"MPI standard   {'.'.join(map(str, MPI.Get_version()))}, thread level {levels.get(MPI.Query_thread(), '?')}",
        f"CUDA-aware     {buffers.library_cuda_support()} (library)"
        + ("" if forced is None else f", forced {forced} by MPICOMM_CUDA_AWARE"),
        f"CuPy           {cupy.__version__ + f', {device.visible_devices()} GPU(s) visible' if cupy else 'not installed'}",
        f"launcher       {launch.launcher} (rank {launch.rank} of {launch.size} from the environment)",
        f"ranks          {comm.size} on {comm.nodes} node(s)",
        "",
        f"{'rank':>5} {'local':>7} {'node':>5}  {'host':<20} gpu",
    ]
    lines += [f"{r:>5} {lr:>3}/{ls:<3} {node:>5}  {host:<20} {dev}" for r, lr, ls, node, host, dev in rows]
    print("\n".join(lines))
    return 0


def algorithms(markdown: bool = False) -> int:
    from mpicomm import registry
    from mpicomm.catalogue import COLLECTIVES

    table = registry.table()
    rows = []
    for collective in COLLECTIVES:
        for name, algorithm in sorted(table.get(collective, {}).items()):
            limits = []
            if algorithm.commutative_only:
                limits.append("commutative op")
            if algorithm.power_of_two:
                limits.append("p a power of two")
            if not algorithm.in_place:
                limits.append("copies input when in place")
            if getattr(algorithm, "single_node", False):
                limits.append("one node (shared memory)")
            if getattr(algorithm, "host_only", False):
                limits.append("host memory only")
            if getattr(algorithm, "blocking_only", False):
                limits.append("blocking calls only")
            rows.append((collective, name, ", ".join(limits) or "-", algorithm.cost))
    if markdown:
        lines = ["| collective | algorithm | restrictions | cost |", "|---|---|---|---|"]
        lines += [f"| {c} | {n} | {r} | {cost} |" for c, n, r, cost in rows]
    else:
        widths = [max(len(str(row[i])) for row in rows) for i in range(3)]
        lines = [f"{c:<{widths[0]}}  {n:<{widths[1]}}  {r:<{widths[2]}}  {cost}" for c, n, r, cost in rows]
    lines.append("")
    lines.append("auto selection (first matching rule; sizes in bytes):")
    for collective in COLLECTIVES:
        rules = registry.SELECTION.get(collective, [])
        text = "; ".join(
            ", ".join(f"{k}={v}" for k, v in rule.items() if k != "algorithm") + f" → {rule['algorithm']}"
            if len(rule) > 1 else f"otherwise → {rule['algorithm']}"
            for rule in rules
        )
        lines.append(f"  {collective}: {text}")
    print("\n".join(lines))
    return 0


COMMANDS = {"info": info, "algorithms": algorithms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpicomm", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=sorted(COMMANDS),
                        help="info: the MPI library, GPUs and rank layout; algorithms: every algorithm and its cost")
    parser.add_argument("--markdown", action="store_true", help="algorithms: print a Markdown table")
    args = parser.parse_args(argv)
    if args.command == "algorithms":
        return algorithms(args.markdown)
    return COMMANDS[args.command]()


if __name__ == "__main__":
    sys.exit(main())
