"""sass-report: static performance evidence from the sm_90a SASS of slimserve's kernels.

Reads the objects the default build already made, finds each kernel's steady-state main loop,
counts its instructions by class and turns them, with the problem shape from the manifest,
into warp-instructions per 16 B of DRAM and a predicted fraction of H200 copy bandwidth.
See docs/perf/sass-report.md.
"""
