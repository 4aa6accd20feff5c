"""Bad input at 2 ranks: every command says what is wrong once per job, and every rank exits with the same status.

One MPI job of 2 ranks runs every case in turn, each command in-process
(:func:`mpicomm.cli.run_main`, as ``python -m`` would run it, with its output
captured on each rank); the ranks' outputs go to rank 0 and back to the test.
A case passes when the error line (``<prog>: error: …``, and the usage block
for a usage error) appears exactly once over both ranks, no traceback appears,
and both ranks exit with the expected status. An error that only one rank
finds (the probe script below) is said by that rank alone and still ends both;
so does a bug in one rank's parsing (status 1 everywhere, its traceback once).
A case that aborted the job (a rank exiting alone) ends the whole job, and the
test with it. One command also runs as its own job, to count the lines the
launcher itself prints; apps.torchddp runs as one where PyTorch cannot be
imported; and a command runs as two tasks MPI does not join (a launcher's
variables, no MPI job), which cannot agree: task 0 speaks for them.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import textwrap
from dataclasses import dataclass, field

import pytest

from tests import mpirun

pytestmark = pytest.mark.launches

RANKS = 2
TORCH = importlib.util.find_spec("torch") is not None


@dataclass(frozen=True)
class Case:
    """A command line that must fail (or ``--help``, which must print once): what it says and its exit status."""

    target: str  #: the module (``-m``) or script
    argv: tuple[str, ...]
    says: str  #: a pattern of the message (the error line's text after ``error: ``)
    code: int = 2
    usage: bool = True  #: a usage error: argparse's usage block comes with it (once)
    env: dict[str, str] = field(default_factory=dict)
    crash: bool = False  #: not a usage error but a bug: its traceback, once

    @property
    def name(self) -> str:
        return " ".join([self.target, *self.argv])


_PROBE = textwrap.dedent('''
    """A command whose check fails on one rank only (a file one node lacks, say): --fail-on R."""
    import sys

    from mpicomm import cli


    def parse(argv):
        parser = cli.Parser(prog="probe")
        parser.add_argument("--fail-on", type=int)
        parser.add_argument("--raise-on", type=int)
        args = parser.parse_args(argv)
        if args.fail_on == cli.launched_ranks()[0]:
            parser.error(f"only rank {args.fail_on} finds this")
        if args.raise_on == cli.launched_ranks()[0]:
            raise RuntimeError(f"a bug on rank {args.raise_on} only")
        return args


    cli.parse_or_exit(parse, sys.argv[1:])
    print("the work started")
''')

CASES = [
    # sizes and counts: one rule's form, a negative size included
    Case("apps.stencil", ("--size", "0"), r"--size must be >= 1, got 0$"),
    Case("apps.stencil", ("--iters", "-1"), r"--iters must be >= 0, got -1$"),
    Case("apps.mapreduce", ("bench", "--size", "-1M"), r"--size must be >= 1, got -1M$"),
    Case("apps.demo", ("--count", "-1"), r"--count must be >= 0, got -1$"),
    # options the chosen mode ignores
    Case("apps.stencil", ("--problem", "heat", "--radius", "3"),
         r"--radius 3 applies to --problem star only; drop it or use --problem star$"),
    Case("apps.sgd", ("train", "--mode", "ddp", "--staleness", "5"),
         r"--staleness 5 applies to --mode ps-async only"),
    Case("apps.sgd", ("train", "--data", "teacher", "--data-file", "foo.npz"),
         r"--data-file foo.npz applies to --data file only"),
    Case("apps.sgd", ("train", "--mode", "ps-sync", "--no-overlap"), r"--no-overlap applies to --mode ddp"),
    Case("apps.sgd", ("train", "--epochs", "3", "--steps", "10"), r"--steps sets the run's length alone; give one$"),
    Case("apps.pipeline", ("schedule", "--schedule", "gpipe", "--chunks", "2"),
         r"--chunks 2 applies to the interleaved and looped-bfs schedules only"),
    Case("apps.pipeline", ("train", "--offload-window", "rma"), r"--offload-window rma applies to --activations offload"),
    # files that are not there: before the work, as a usage error or as the job's agreed error
    Case("apps.sgd", ("plot", "nothere.csv", "--plot", "curves.png"), r"nothere\.csv: No such file or directory"),
    Case("apps.mapreduce", ("wordcount", "nothere.txt"), r"'nothere\.txt' does not exist", usage=False),
    Case("mpicomm.bench.summary", ("nothere.json",), r"nothere\.json"),
    # a misspelt algorithm: the hint everywhere, no traceback
    Case("mpicomm.bench", ("allreduce", "--sizes", "8"), r"MPICOMM_ALLREDUCE_ALGORITHM='rign' .*did you mean 'ring'\?",
         env={"MPICOMM_ALLREDUCE_ALGORITHM": "rign"}),
    Case("mpicomm.verify", ("allreduce", "ring"), r"did you mean 'ring'\?", env={"MPICOMM_ALLREDUCE_ALGORITHM": "rign"}),
    Case("mpicomm.verify", ("allreduce", "rign"), r"unknown allreduce algorithm 'rign' \(did you mean 'ring'\?\)"),
    Case("mpicomm.bench", ("allreduce", "--algorithms", "rign"), r"'rign' \(did you mean 'ring'\?\)"),
    Case("mpicomm", ("verify", "allreduce", "rign", "-p", "2"), r"did you mean 'ring'\?"),
    # every other command's usage error
    Case("apps.stencil.bench", ("--repeat", "0"), r"--repeat must be >= 1, got 0$"),
    Case("apps.mapreduce", ("corpus", "somewhere"), r"run corpus without mpiexec"),
    Case("apps.sgd", ("bench", "--repeat", "0"), r"--repeat must be >= 1, got 0$"),
    Case("apps.pipeline", ("bench", "--repeat", "0"), r"--repeat must be >= 1, got 0$"),
    Case("mpicomm.tune", ("--repeat", "0"), r"--repeat must be >= 1, got 0$"),
    Case("kernels.bench", ("--repeat", "0"), r"--repeat must be >= 1, got 0$"),
    Case("jobs/collect.py", ("nothere",), r"nothere"),
    # --help: printed once per job, status 0
    Case("apps.stencil", ("--help",), "", code=0),
    # a check that fails on one rank only: that rank says it, both exit 2, no rank starts the work
    Case("PROBE", ("--fail-on", "1"), r"only rank 1 finds this$"),
    Case("PROBE", ("--fail-on", "0"), r"only rank 0 finds this$"),
    Case("PROBE", ("--raise-on", "1"), r"RuntimeError: a bug on rank 1 only", code=1, crash=True),
]
#: PyTorch's commands: importing PyTorch on 2 ranks takes seconds, so they run as a job of their own in the slower
#: tier (python -m tests --slow).
TORCH_CASES = [
    Case("apps.torchddp", ("train", "--model", "mlp", "--vocab", "10"), r"--vocab 10 applies to --model transformer"),
    Case("apps.torchddp", ("train", "--log-every", "5"), r"--log-every: renamed --progress-every"),
    Case("apps.torchddp", ("bench", "--repeat", "0"), r"--repeat must be >= 1, got 0$"),
    Case("mpicomm.torch.bench", ("--repeat", "0"), r"--repeat must be >= 1, got 0$"),
]

_DRIVER = textwrap.dedent('''
    import json, os, sys, warnings
    warnings.simplefilter("ignore")
    from mpi4py import MPI
    from mpicomm.cli import run_main
    world = MPI.COMM_WORLD
    results = []
    for case in json.load(open(sys.argv[1])):
        saved = dict(os.environ)
        os.environ.update(case["env"])
        try:
            outcome = run_main(case["target"], case["argv"])
        finally:
            os.environ.clear()
            os.environ.update(saved)
        results.append(world.gather(outcome, root=0))
    if world.Get_rank() == 0:
        sys.stdout.write("@@RESULTS " + json.dumps(results) + "\\n")
''')


def _job(where, cases: list[Case]) -> dict[str, list]:
    """Every case's (status, stdout, stderr) on each rank, from one job of 2 ranks."""
    probe = where / "probe.py"
    probe.write_text(_PROBE)
    plan = [{"target": str(probe) if c.target == "PROBE" else c.target, "argv": list(c.argv), "env": c.env}
            for c in cases]
    (where / "cases.json").write_text(json.dumps(plan))
    result = mpirun.run(RANKS, [sys.executable, "-c", _DRIVER, str(where / "cases.json")], timeout=180)
    lines = [line for line in result.stdout.splitlines() if line.startswith("@@RESULTS ")]
    assert result.returncode == 0 and lines, f"the job ended early ({result.returncode}):\n{result.stderr[-4000:]}"
    found = json.loads(lines[-1][len("@@RESULTS "):])
    return {c.name: ranks for c, ranks in zip(cases, found)}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    return _job(tmp_path_factory.mktemp("usage"), CASES)


@pytest.fixture(scope="module")
def torch_outcomes(tmp_path_factory):
    if not TORCH:
        pytest.skip("PyTorch is not installed")
    return _job(tmp_path_factory.mktemp("usage-torch"), TORCH_CASES)


def _check(ranks: list, case: Case) -> None:
    every = "".join(out + err for _, out, err in ranks)
    assert [code for code, _, _ in ranks] == [case.code] * RANKS, f"{case.name}: exit statuses {ranks}"
    if case.crash:
        assert every.count("Traceback") == 1 and re.search(case.says, every) and "the work started" not in every, every
        return
    assert "Traceback" not in every and "aborting the job" not in every, every[-3000:]
    usages = [line for line in every.splitlines() if line.startswith("usage:")]
    if case.code == 0:
        assert len(usages) == 1, f"{case.name}: --help printed {len(usages)} times"
        return
    errors = [line for line in every.splitlines() if ": error: " in line]
    assert len(errors) == 1, f"{case.name}: {len(errors)} error lines:\n" + "\n".join(errors)
    assert re.search(case.says, errors[0].split(": error: ", 1)[1]), f"{case.name}: {errors[0]!r}"
    assert "rank 0 of" not in errors[0] and "rank 1 of" not in errors[0], errors[0]
    assert len(usages) == (1 if case.usage else 0), f"{case.name}: the usage block {len(usages)} times\n{every}"
    assert "the work started" not in every


def _id(case: Case) -> str:
    return case.name.replace("mpicomm.", "").replace("apps.", "")


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_said_once_per_job_and_every_rank_exits_alike(outcomes, case):
    _check(outcomes[case.name], case)


@pytest.mark.slow
@pytest.mark.parametrize("case", TORCH_CASES, ids=_id)
def test_pytorch_commands_say_it_once_too(torch_outcomes, case):
    _check(torch_outcomes[case.name], case)


def test_without_pytorch_the_torch_application_says_how_to_install_it_once(tmp_path):
    """The README's first command installs no PyTorch (the CUDA build PyPI gives is several GB): apps.torchddp's
    default run then exits 2 on every rank, the error line naming the CPU wheel's command and the extra, once."""
    result = mpirun.run(RANKS, [sys.executable, "-m", "apps.torchddp", "train"], timeout=60,
                        env=mpirun.without_torch(tmp_path / "hook"))
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert errors == ["python -m apps.torchddp train: error: PyTorch is not importable (No module named 'torch'): pip "
                      "install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu (the CPU wheel), then "
                      "pip install -e '.[torch]'"], result.stderr
    assert sum(line.startswith("usage:") for line in result.stderr.splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr and not result.stdout


@pytest.mark.parametrize("launcher", ["srun", "another MPI's mpiexec"])
def test_tasks_the_mpi_library_does_not_join_say_it_once_with_a_hint(launcher):
    """``srun`` where the MPI library does not speak the launcher's PMI: every task starts MPI alone (a job of one),
    so the tasks cannot agree. Two plain processes with the launcher's variables stand for it (no Slurm, no MPI
    job): task 0 prints the usage error and the hint once, and both exit with status 2."""
    import subprocess

    if launcher == "srun":  # without --mpi=pmi2 (or where the site's default is none)
        variables = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2", "SLURM_PROCID": "{task}"}
    elif mpirun.flavor() == "openmpi":  # MPICH's hydra, mpi4py on Open MPI
        variables = {"PMI_SIZE": "2", "PMI_RANK": "{task}"}
    else:  # Open MPI's mpirun, mpi4py on MPICH
        variables = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "{task}"}
    procs = [subprocess.Popen([sys.executable, "-m", "apps.stencil", "--size", "0"], cwd=mpirun.REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=mpirun.clean_env({k: v.format(task=task) for k, v in variables.items()}))
             for task in range(2)]
    outs = [proc.communicate(timeout=60) for proc in procs]
    assert [proc.returncode for proc in procs] == [2, 2], outs
    every = [line for out, err in outs for line in (out + err).splitlines()]
    assert every.count("python -m apps.stencil: error: --size must be >= 1, got 0") == 1, every
    assert sum(line.startswith("usage:") for line in every) == 1, every
    size = next(name for name in variables if name.endswith(("SIZE", "NUM_TASKS")))
    hints = [line for line in every if line.startswith("mpicomm: MPI sees 1 process")]
    assert hints == [f"mpicomm: MPI sees 1 process but the launcher started 2 ({size}=2): the MPI library is not "
                     f"wired to the launcher, so every task runs alone (task 0 alone said the above); launch with "
                     f"srun --mpi=pmi2 (MPICH), srun --mpi=pmix (Open MPI) or the MPI's own mpiexec"], every
    assert not outs[1][0] and ": error: " not in outs[1][1] and "Traceback" not in outs[1][1], outs[1]


def test_a_command_of_its_own_prints_its_usage_error_once():
    """As users run it: the launcher's own output holds the usage block and the error once, status 2."""
    result = mpirun.run(RANKS, [sys.executable, "-m", "apps.stencil", "--size", "0"], timeout=60)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    assert lines.count("python -m apps.stencil: error: --size must be >= 1, got 0") == 1, result.stderr
    assert sum(line.startswith("usage:") for line in lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and "aborting" not in result.stderr and not result.stdout
