"""Kernels of the stateful ops of GLM-5.3-Flash (`kda_kernels.py`): the KDA layer's `ssm_conv` and
`gated_delta_net`, with mHC's `dsv4_hc_comb` and the indexer key pool `kpool_store` beside them for now."""
