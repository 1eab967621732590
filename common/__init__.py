"""Shared leaves of nextn: what the compiler and the runtime both use, and nothing that either owns.

    errors     NextnError (the one user-facing error type)
    paths      the cache directory (NEXTN_CACHE)
    hashing    sha256 of files (one chunked loop), memoised for model files
    timing     tokens/s, the Python share of decode time, a wall-clock timer
    manifest   the artifact's manifest.json: file name, schema, library verification, maximum draft depth
    gguf       the GGUF reader (gguf-py, memory-mapped) with validation errors naming file + key / tensor
    quant      the run-time half of each block-quantized format: buffer layout and numpy packing
    measure    timing one kernel on random inputs, and the offline tuning files (candidates / results)
    cuda       loading TVM's CUDA runtime plugin by path
    compare    the relative error used against the fixture references

Imports no other nextn package and no TVM compiler module (tests/test_imports.py): a runtime-only TVM (the
GPU bundle, no libtvm_compiler.so) can import all of it.
"""
