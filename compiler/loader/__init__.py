"""GGUF → hyper-parameters + validated tensors (the first room of gguf → ir → lower → artifact → runtime).
The file reader itself is shared with the runtime: nextn.common.gguf."""
