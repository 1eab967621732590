"""Autotuning per target and shareable tuning logs.

Workflow (nextn gives the workflow and the trust; TVM's meta_schedule gives the search):
    workloads.py  the model's distinct static-shape kernels (the one-row `decode` / `draft` entry points after
                  fusion), deduplicated by structural hash
    run.py        `nextn tune`: meta_schedule search per workload on this machine (llvm), resumable; for GPUs
                  the offline gen → measure → ingest flow (offline.py)
    log.py        the log: one JSON data file, schema-versioned, validated on every read (no code, no pickles)
    apply.py      `nextn compile --tuning-log`: replay the best trace per workload, default schedules elsewhere
"""
