"""parplan benchmarks: the seed papers' tables, DP vs exact, scaling and ablations.

Every benchmark is a module with ``run(out_dir, quick=False, executor=None, **params) ->
pandas.DataFrame`` that writes ``NAME.csv``, ``NAME.png`` and ``NAME.md`` into ``out_dir``;
``parplan bench NAME`` runs it from the command line (see :mod:`parplan.cli.bench`), and
``python -m parplan.bench.NAME OUT_DIR [--quick]`` runs it without the CLI.

==============  ==========================================================================
name            what
==============  ==========================================================================
accpar          speedup of OWT, HyPar, AccPar and the exact solver over data parallelism on
                TPU-v2 + TPU-v3 (AccPar, HPCA'20), with a bandwidth sweep
hypar           HyPar vs data and model parallelism on 16 devices (HyPar, HPCA'19)
dp-vs-exact     DP against every exact backend for every zoo model and depths 1..8
scaling         planner wall time against layers and hierarchy depth; exact backends' reach
ablations       AccPar with one feature removed at a time
allreduce       all-reduce algorithms per topology (MultiTree, ISCA'21)
speed           planner time against the published AccPar C++; the CLI's start-up time
pipeline        PipeDream's released optimizer vs parplan's pipeline plans, priced by both
bound           the global lower bound and gap of the accpar plans on the zoo's CNNs
joint           the joint optimum on small arrays: accpar's loss to it, its gap to the bound
continuous      grid 16, grid 64 and the proven continuous-share optimum on one split
memory          plans that fit: parplan plan's default vs memory ignored vs Megatron-style plans
calibration     a calibrated GPU's predicted whole training steps against the measured ones
validate        predicted against published, measured training throughput (fitted per source)
==============  ==========================================================================
"""

#: Benchmark name (as typed after ``parplan bench``) -> module under :mod:`parplan.bench`.
BENCHMARKS = {
    "accpar": "parplan.bench.accpar",
    "hypar": "parplan.bench.hypar",
    "dp-vs-exact": "parplan.bench.dp_vs_exact",
    "scaling": "parplan.bench.scaling",
    "ablations": "parplan.bench.ablations",
    "allreduce": "parplan.bench.allreduce",
    "speed": "parplan.bench.speed",
    "pipeline": "parplan.bench.pipeline",
    "bound": "parplan.bench.bound",
    "joint": "parplan.bench.joint",
    "continuous": "parplan.bench.continuous",
    "memory": "parplan.bench.memory",
    "calibration": "parplan.bench.calibration",
    "stages": "parplan.bench.stages",
    "validate": "parplan.bench.validate",
}
