"""CPU threads of the compiled kernels (`-t/--threads` of run, bench and serve), as llama.cpp counts them.

Default: `TVM_NUM_THREADS` when set, else the physical cores, counted as llama.cpp's `common_cpu_get_num_physical_cores` does (common/common.cpp:
one core per distinct `/sys/devices/system/cpu/cpuN/topology/thread_siblings` mask), here among the CPUs this
process may run on (`os.sched_getaffinity`: a container's cpuset); `-t N` with N <= 0 means every logical CPU
(common/arg.cpp, `-t`). Without sysfs: `os.cpu_count()`.

TVM's CPU runtime (src/runtime/thread_pool.cc) keeps one thread pool per calling thread, sized when that thread
first launches a parallel kernel from `TVM_NUM_THREADS` (else half the logical CPUs on x86: 1 on a 2-vCPU machine
without SMT); a pool cannot grow afterwards. `use(n)` therefore sets `TVM_NUM_THREADS` before the first kernel
call of the process (serve's scheduler thread starts its pool later and reads it too) and configures the calling
thread's pool; it also leaves TVM's core pinning off unless the user asked for it (`TVM_BIND_THREADS`), as
llama.cpp pins no thread by default — nextn processes sharing a machine would otherwise all start on core 0.
"""
from __future__ import annotations

import os

from nextn.common.errors import NextnError

SYS_CPU = "/sys/devices/system/cpu"


def physical_cores(sys_cpu: str = SYS_CPU, cpus=None) -> int:
    """Physical cores among `cpus` (default: this process's affinity): distinct thread-sibling masks in sysfs."""
    if cpus is None:
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = range(os.cpu_count() or 1)
    siblings = set()
    for c in cpus:
        try:
            with open(f"{sys_cpu}/cpu{c}/topology/thread_siblings") as f:
                siblings.add(f.read().strip())
        except OSError:
            continue
    return len(siblings) or len(list(cpus)) or 1


def logical_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def resolve(n: int | None) -> int:
    """The thread count for `-t n`: None → `TVM_NUM_THREADS` when the environment sets it, else the physical
    cores; n <= 0 → logical CPUs (llama.cpp); else n."""
    if n is None:
        env = os.environ.get("TVM_NUM_THREADS", "")
        return int(env) if env.isdigit() and int(env) > 0 else physical_cores()
    if isinstance(n, bool) or not isinstance(n, int):
        raise NextnError(f"-t/--threads {n!r}: expected an integer")
    return n if n > 0 else logical_cpus()


def use(n: int | None) -> int:
    """Run the compiled kernels on `resolve(n)` threads: call before the first kernel call of the process. Sets
    the process's count (`TVM_NUM_THREADS`) and configures the calling thread's pool; returns its thread count."""
    os.environ["TVM_NUM_THREADS"] = str(resolve(n))
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    return in_this_thread()


def in_this_thread() -> int:
    """Configure the calling thread's pool for the process's count (`use`) and return its thread count. A thread
    other than the one that called `use` and makes kernel calls (serve's scheduler) calls this first: a new pool
    would use at most one worker per CPU (TVM's default configuration), not an explicit -t above that."""
    import tvm

    k = resolve(None)
    # created now with k workers (TVM_NUM_THREADS), or made earlier by a kernel call and lowered to k
    tvm.get_global_func("runtime.config_threadpool")(0, k)
    return runtime_threads()


def runtime_threads() -> int:
    """The threads TVM's pool of the calling thread runs a parallel kernel on."""
    import tvm

    return int(tvm.get_global_func("runtime.NumThreads")())
