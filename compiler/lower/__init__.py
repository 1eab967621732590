"""nextn's lowering of the IR to TVM, grouped by op family (the layout: docs/design.md, Code layout)."""

# Threads per block of the GPU forms of the stateful kernels (recurrent/, mhc/, the indexer's kpool_store). Each of
# those kernels has a CPU form (a parallel loop) and a GPU form (one element per thread, bound and marked scheduled
# in the kernel: dlight's rules do not take blocks that update a buffer they read, as in-place states do), chosen by
# a static `if` in one PrimFunc.
GPU_THREADS = 64
