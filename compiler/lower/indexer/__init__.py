"""The DSA lightning indexer's kernels (glm-dsa, GLM-5.x): its score, the exact per-row top-k as a mask, the kept
selection for NextN index sharing (`dsa_kernels.py`)."""
