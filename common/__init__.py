"""Shared leaves of nextn: what the compiler and the runtime both use, and nothing that either owns.

    errors     NextnError (the one user-facing error type)
    paths      the cache directory (NEXTN_CACHE)
    hashing    sha256 of files (one chunked loop; model files only where asked)
    timing     tokens/s, the Python share of decode time, a wall-clock timer
    manifest   the artifact's manifest.json: file name, schema, library verification, maximum draft depth
    gguf       the GGUF reader (memory-mapped; split GGUFs; header identity) with errors naming file + key / tensor
    gguf_header  the bounds-checked GGUF header parser (llama.cpp's checks)
    gguf_split   split GGUFs (llama.cpp's gguf-split): shard names and keys
    quant      the run-time half of each block-quantized format: buffer layout and numpy packing
    measure    timing one kernel on random inputs, and the offline tuning files (candidates / results)
    cuda       loading TVM's CUDA runtime plugin by path
    compare    the relative error used against the fixture references

Imports no other nextn package and no TVM compiler module (tests/test_imports.py): a runtime-only TVM (the
GPU bundle, no libtvm_compiler.so) can import all of it.
"""
